"""The hybrid drafter (minispec/extra_drafters/hybrid.py): its rule without tensors, then, on tiny
random targets with EAGLE heads (tests/test_eagle.py), greedy parity in both loops, the head's
drafts equal to an uncached reference in every round it drafts (so the rounds the context drafted
kept its feature bookkeeping intact), and the target's law under sampling."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from lawcheck import chi_square_pvalue
from test_eagle import random_head, reference_drafts, self_copy_head
from tinymodels import exact_two_token_law, noisy_copy, tiny_llama

import minispec as ms
from minispec.drafters.ngram import PromptLookupDrafter
from minispec.extra_drafters.eagle import EagleDrafter
from minispec.extra_drafters.hybrid import PRIOR_CONTEXT, PRIOR_HEAD, HybridDrafter, Tally
from minispec.extra_drafters.suffix import SuffixDrafter, SuffixStore
from minispec.serving.engine import Engine

NEW = 20
PROMPTS = [[1, 2], [3, 4, 5], [5, 6, 5, 6, 5], [9] * 6, list(range(10, 22)), [40, 41, 42, 40, 41],
           [7, 8, 9, 10, 11, 7, 8, 9], list(range(20, 44))]

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------- 1. the rule, no model


def test_a_long_match_is_trusted_a_short_one_is_not():
    tally = Tally()
    assert tally.head == PRIOR_HEAD and tally.context == list(PRIOR_CONTEXT)
    assert tally.prefers_context(6, min_match=2, head_cost=0.3)
    assert tally.prefers_context(60, min_match=2, head_cost=0.3)          # the last bucket
    assert not tally.prefers_context(1, min_match=2, head_cost=0.3)       # below min_match
    assert not tally.prefers_context(0, min_match=1, head_cost=0.3)       # no match at all
    assert tally.expected(2) == PRIOR_CONTEXT[1]


def test_running_acceptance_moves_the_choice():
    tally = Tally(head=0.4, context=[0.3, 0.6, 1.0])
    assert tally.prefers_context(2, 1, head_cost=0.0)          # 0.6 >= 0.4
    for _ in range(3):
        tally.update("context", 2, accepted=0, decay=0.3)       # matches of 2 keep failing
    assert tally.context[1] == pytest.approx(0.6 * 0.7 ** 3)
    assert not tally.prefers_context(2, 1, head_cost=0.0)
    assert tally.prefers_context(3, 1, head_cost=0.0)          # other lengths keep their own
    for _ in range(5):
        tally.update("head", 0, accepted=0, decay=0.3)          # now the head fails too
    assert tally.prefers_context(2, 1, head_cost=0.0)
    assert Tally(head=1.0, context=[0.6]).prefers_context(1, 1, head_cost=0.3)   # 1.6*1.3 >= 2
    assert not Tally(head=1.2, context=[0.6]).prefers_context(1, 1, head_cost=0.3)


def lookup_match_length(context, max_ngram, min_ngram=1):
    """The suffix length prompt lookup matches on (what a hybrid weighs)."""
    return PromptLookupDrafter(max_ngram, min_ngram).match(context)[0]


def test_prompt_lookup_match_length():
    assert lookup_match_length([1, 2, 3, 1, 2], max_ngram=3) == 2
    assert lookup_match_length([1, 2, 3, 1, 2, 3], max_ngram=3) == 3
    assert lookup_match_length([1, 2, 3, 1, 2, 3], max_ngram=2) == 2
    assert lookup_match_length([1, 2, 3], max_ngram=3) == 0
    assert lookup_match_length([1, 2, 1], max_ngram=3, min_ngram=2) == 0


def test_an_ngram_table_reports_the_length_of_its_match():
    """A hybrid weighs a context draft by the tokens of context it was matched on: the n-gram
    table reports the order of the longest suffix it has seen (0 with nothing to go on)."""
    table = ms.NGramDrafter(max_order=4)
    assert table.lookup([1, 2, 3, 4], 2) == [] and table.last_match == 0       # 4 never followed
    assert table.lookup([1, 2, 3, 4, 1, 2], 2) == [3, 4] and table.last_match == 2
    assert table.lookup([1, 2, 3, 4, 1, 2, 3], 2) == [4, 1] and table.last_match == 3
    assert table.lookup([9], 2) == [] and table.last_match == 0                # a new sequence


# ---------------------------------------------------------------------- 2. greedy parity


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=1)


@pytest.fixture(scope="module")
def heads(target):
    return {"random": random_head(target), "copy": self_copy_head(target)}


@pytest.fixture(scope="module")
def baselines(target):
    return [ms.generate(target, p, NEW).tokens for p in PROMPTS]


CONTEXTS = {"suffix": lambda: SuffixDrafter(), "prompt_lookup": lambda: PromptLookupDrafter(),
            "ngram": lambda: ms.NGramDrafter(),
            "name": lambda: "suffix", "store": lambda: SuffixDrafter(SuffixStore(max_tokens=60))}


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("head", ["random", "copy"])
def test_greedy_output_is_the_targets(target, heads, baselines, head, context):
    drafter = HybridDrafter(CONTEXTS[context](), EagleDrafter(heads[head]), min_match=1)
    for prompt, base in zip(PROMPTS, baselines, strict=True):
        out = ms.speculative_generate(target, drafter, prompt, NEW, k=3, adaptive=False)
        assert out.tokens == base and out.finish_reason == "length"
    assert drafter.rounds["context"] > 0 and drafter.rounds["head"] > 0     # both sources drafted
    assert drafter.tallies == {} and drafter.chosen == {}                    # released


def spy_on_head(drafter: HybridDrafter, rounds: list) -> None:
    """Record ``(context, k, drafts)`` of every row the head drafts for."""
    propose = drafter.head.propose

    def propose_hook(seqs, ks):
        proposals = propose(seqs, ks)
        rounds.extend((list(s.context), k, p.tree.tokens[1:])     # a chain's drafts
                      for s, k, p in zip(seqs, ks, proposals, strict=True) if k > 0)
        return proposals

    drafter.head.propose = propose_hook


@pytest.mark.parametrize("driver", ["single", "engine", "engine-chunked"])
def test_the_heads_drafts_equal_an_uncached_reference(target, heads, driver):
    """A head that missed the target's features of a context round, or got them twice or out of
    order, drafts something else than the reference, which recomputes every feature from scratch."""
    head, rounds = heads["random"], []
    if driver == "single":
        drafter = HybridDrafter(SuffixDrafter(), EagleDrafter(head), min_match=1)
        spy_on_head(drafter, rounds)
        for prompt in PROMPTS:
            ms.speculative_generate(target, drafter, prompt, NEW, k=4, adaptive=False)
    else:
        engine = Engine(target, drafter=HybridDrafter(SuffixDrafter(), EagleDrafter(head),
                                                      min_match=1),
                        k=4, max_batch_size=3, block_size=4, adaptive=False,
                        max_num_batched_tokens=5 if driver == "engine-chunked" else None)
        drafter = engine.drafter
        spy_on_head(drafter, rounds)
        engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
        assert drafter.head.pending == {}
    assert drafter.rounds["context"] > 5 and len(rounds) > 20
    for context, k, drafts in rounds:
        assert drafts == reference_drafts(target, head, context, k)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_engine_equals_single_runs(target, heads, baselines, kv_cache):
    template = HybridDrafter(SuffixDrafter(), EagleDrafter(heads["copy"]), min_match=1)
    engine = Engine(target, drafter=template, k=3, max_batch_size=4, kv_cache=kv_cache,
                    block_size=4, adaptive=False)
    assert engine.drafter is not template                     # the engine owns a clone
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    for prompt, base, result in zip(PROMPTS, baselines, results, strict=True):
        single = ms.speculative_generate(target, HybridDrafter(SuffixDrafter(),
                                                               EagleDrafter(heads["copy"]),
                                                               min_match=1), prompt, NEW, k=3,
                                            adaptive=False)
        assert result.tokens == single.tokens == base
        assert result.stats.accepted_per_round == single.stats.accepted_per_round
    assert engine.drafter.rounds["context"] > 0 and engine.drafter.rounds["head"] > 0
    if kv_cache == "paged":
        assert engine.target_cache.num_used_blocks == engine.draft_cache.num_used_blocks == 0


def test_a_draft_model_can_stand_in_for_the_head(target, baselines):
    """Any batched drafter is a head: a draft model's cache catches up lazily after context
    rounds."""
    template = HybridDrafter(SuffixDrafter(), ms.ModelDrafter(noisy_copy(target, 0.05)))
    for prompt, base in zip(PROMPTS, baselines, strict=True):
        assert ms.speculative_generate(target, template, prompt, NEW, k=3,
                                       adaptive=False).tokens == base
    engine = Engine(target, drafter=template, k=3, max_batch_size=4, block_size=4,
                    adaptive=False)              # draft every round: the sources are tested
    assert [r.tokens for r in engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)] \
        == baselines
    for drafter in (template, engine.drafter):
        assert drafter.rounds["context"] > 0 and drafter.rounds["head"] > 0
        assert drafter.accepted["head"] > 0


def test_bad_sources_are_refused(heads):
    with pytest.raises(ValueError, match="head"):
        HybridDrafter(SuffixDrafter(), None)
    with pytest.raises(ValueError, match="context"):
        HybridDrafter(EagleDrafter(heads["random"]), EagleDrafter(heads["random"]))
    with pytest.raises(ValueError):
        HybridDrafter(head=EagleDrafter(heads["random"]), decay=0)


# ---------------------------------------------------------------------- 3. sampled law


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.8)],
                         ids=["t1", "top_p"])
def test_sampled_output_has_the_targets_law(params):
    """The first two of three tokens follow the target's exact law, k = 2. The prompt ends in a
    3-token repeat, so the first round drafts from the context (one-hot q); after a rejection the
    match is short and the head drafts (its own q, zero outside V' = {0, 2, 4})."""
    target = tiny_llama(vocab=5, seed=3, scale=0.5)
    head = random_head(target, torch.arange(0, 5, 2), seed=4)
    params = ms.SamplingParams(**params)
    prompt = [0, 1, 2, 3, 0, 1, 2]
    law = exact_two_token_law(target, prompt, params)
    n = 1200
    engine = Engine(target, drafter=HybridDrafter(SuffixDrafter(), EagleDrafter(head), min_match=2),
                    k=2, max_batch_size=64, block_size=4)
    results = engine.generate([prompt] * n, [dataclasses.replace(params, seed=s) for s in range(n)],
                              progress=False, max_new_tokens=3)
    counts = torch.zeros(25)
    for result in results:
        counts[result.tokens[0] * 5 + result.tokens[1]] += 1
    rounds, accepted = engine.drafter.rounds, engine.drafter.accepted
    assert rounds["context"] > 100 and rounds["head"] > 100
    assert 0 < accepted["context"] and 0 < accepted["head"]
    assert sum(accepted.values()) < sum(r.stats.tested for r in results)     # rejections too
    keep = law * n >= 5                                                # merge rare cells into one
    merged_counts = torch.cat([counts[keep], counts[~keep].sum()[None]])
    merged_law = torch.cat([law[keep], law[~keep].sum()[None]])
    assert chi_square_pvalue(merged_counts, merged_law) > 1e-3
