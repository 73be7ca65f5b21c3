"""Drafters: akunu's n-gram predictor, prompt lookup, and the draft model's cache syncing."""

import pytest
import torch
from tinymodels import tiny_llama

import minispec as ms
from minispec.check.one_context import OneContext
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import NGramDrafter, PromptLookupDrafter


def test_ngram_chains_longest_context_first():
    d = NGramDrafter()
    # "the cat sat on the mat ." twice, then "the cat": the 4-gram table continues "sat on the".
    text = [1, 2, 3, 4, 1, 5, 6] * 2 + [1, 2]
    assert d.draft(text, 4).tokens.tolist() == [3, 4, 1, 5]


def test_ngram_most_frequent_then_most_recent():
    d = NGramDrafter(max_order=2)
    for token in [7, 1, 7, 1, 7, 2]:
        d.update(token)
    assert d.counts[(7,)] == {1: 2, 2: 1}
    d.update(7)
    assert d.predict(1) == [1]                     # 7 -> 1 seen twice, 7 -> 2 once
    d = NGramDrafter(max_order=2)
    for token in [7, 1, 7, 2, 7]:
        d.update(token)
    assert d.predict(1) == [2]                     # a tie goes to the most recent continuation


def test_ngram_backs_off_to_shorter_contexts_and_stops():
    d = NGramDrafter()
    for token in [1, 2, 3, 9, 3, 4]:
        d.update(token)
    # Context (3, 4): no 4-gram or 3-gram for it, bigram (4,) never continued -> no draft at all.
    assert d.predict(3) == []
    d.update(3)                                    # now (4,) -> 3 and (3,) -> {9, 4}
    assert d.predict(2) == [4, 3]                  # bigram (3,) ties 9 / 4: the most recent, 4


def test_ngram_window_expires_counts():
    d = NGramDrafter(max_order=2, window=4)
    for token in [5, 6, 1, 2, 3, 4]:
        d.update(token)
    assert (5,) not in d.counts and (6,) not in d.counts    # slid out of the 4-token window
    assert len(d.history) == 4
    assert sum(sum(row.values()) for row in d.counts.values()) == 3   # 3 bigrams inside the window


def test_ngram_syncs_with_context_and_resets_on_new_sequence():
    d = NGramDrafter()
    d.draft([1, 2, 3, 1, 2], 2)
    assert list(d.history) == [1, 2, 3, 1, 2]
    d.draft([1, 2, 3, 1, 2, 3, 1], 2)              # only the two new tokens are ingested
    assert list(d.history) == [1, 2, 3, 1, 2, 3, 1]
    d.draft([9, 9], 2)                             # not a continuation: start over
    assert list(d.history) == [9, 9]


def test_prompt_lookup_latest_longest_match():
    d = PromptLookupDrafter(max_ngram=3)
    context = [1, 2, 3, 10, 11, 5, 2, 3, 20, 21, 7, 1, 2, 3]
    # Suffix (1, 2, 3) occurred at the start: copy what followed it.
    assert d.draft(context, 2).tokens.tolist() == [10, 11]
    # Suffix (9, 2, 3) never occurred; (2, 3) last occurred before 20, 21.
    assert d.lookup([2, 3, 20, 21, 2, 3, 30, 9, 2, 3], 3) == [30, 9, 2]
    assert d.lookup([1, 2, 3], 4) == []


def test_drafters_bad_arguments():
    with pytest.raises(ValueError):
        NGramDrafter(max_order=1)
    with pytest.raises(ValueError):
        PromptLookupDrafter(max_ngram=0)


def full_context_probs(model, context, params):
    """q(. | context) from a fresh forward with no cache: the reference for the drafter's cache."""
    logits = model(torch.tensor([context]), torch.arange(len(context))[None])[0, -1]
    return ms.probs_from_logits(logits, params, context_ids=context)


@torch.inference_mode()
def test_model_drafter_syncs_cache_with_the_accepted_context():
    model = tiny_llama(seed=5)
    drafter = ModelDrafter(model)
    one = OneContext(drafter)            # the drafter with one request of its own
    params = ms.SamplingParams(temperature=1.0, repetition_penalty=1.2)
    g = torch.Generator().manual_seed(0)
    context = [3, 4, 5, 6]
    draft = one.draft(context, 3, params, g)
    # the lazy prefill of the prompt is its own forward (as in a batch), then 3 draft steps
    assert drafter.forwards == 4
    assert one.fed == context + draft.tokens[:2].tolist()   # d_3 was drawn but never fed
    # Each q row is the distribution given the context plus earlier drafts (penalty included).
    for i in range(3):
        expected = full_context_probs(model, context + draft.tokens[:i].tolist(), params)
        assert torch.allclose(draft.probs[i], expected, atol=1e-5)
    # All 3 accepted + a bonus token: the drafter must feed d_3 and the bonus (the lag of one).
    context = context + draft.tokens.tolist() + [7]
    draft2 = one.draft(context, 2, params, g)
    assert one.fed[: len(context)] == context
    assert torch.allclose(draft2.probs[0], full_context_probs(model, context, params), atol=1e-5)
    # Rollback: only d_1 accepted, then a correction token 9.
    context = context + [draft2.tokens[0].item(), 9]
    draft3 = one.draft(context, 1, params, g)
    assert drafter.cache.length(one.slot) == len(context)
    assert torch.allclose(draft3.probs[0], full_context_probs(model, context, params), atol=1e-5)


def test_model_drafter_greedy_is_argmax():
    model = tiny_llama(seed=6)
    draft = OneContext(ModelDrafter(model)).draft([1, 2, 3], 4, ms.SamplingParams(temperature=0),
                                                 None)
    assert torch.equal(draft.probs.argmax(-1), draft.tokens)
    assert torch.equal(draft.probs.max(-1).values, torch.ones(4))


def test_a_context_drafter_must_say_how_it_drafts():
    """``lookup`` and ``lookup_tree`` default to each other: a subclass overriding neither is told
    so, rather than recursing."""
    from minispec.drafters.ngram import ContextDrafter

    class Silent(ContextDrafter):
        pass

    with pytest.raises(NotImplementedError, match="neither lookup nor lookup_tree"):
        Silent().lookup([1, 2, 3], 2)
    with pytest.raises(NotImplementedError, match="neither lookup nor lookup_tree"):
        Silent().lookup_tree([1, 2, 3], (2, 1))
