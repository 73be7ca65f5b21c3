"""Speculation under a grammar stays exact: the core's hook, with a toy grammar (no llguidance).

The target's law under a grammar is ``p`` masked to the allowed tokens and renormalized at every
position. The round masks ``q`` with the same mask from the same grammar state, verifies against
the masked ``p``, proposes forced tokens as one-hot drafts and commits only accepted tokens. Checked
here: by exact enumeration of the accept rule on masked toy models, by greedy identity with a
constrained greedy reference computed without any cache, by a chi-square test of the sampled
two-token law, and by what the grammar is told (only accepted tokens, never a rejected one).
"""

from __future__ import annotations

import pytest
import torch
from lawcheck import (
    autoregressive_law,
    chi_square_pvalue,
    max_law_error,
    random_table_model,
    tree_law,
    verify_law,
)
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.core import constraint as hook
from minispec.core.constraint import Constraint
from minispec.grammar import ForcedDrafter

pytestmark = pytest.mark.usefixtures("one_thread")

V = 8                    # a small vocabulary: the two-token law has few cells
FORCER, SPAN = 5, [6, 7]  # after token 5 the grammar forces 6 then 7
LENGTH = 7               # the toy grammar ends after 7 tokens


def toy_allowed(history: list[int], vocab: int = V) -> torch.Tensor:
    """The toy grammar: ``t`` may follow ``s`` iff ``(t - s) % 3 != 0``; 5 forces 6, 7; tokens 6
    and 7 appear nowhere else."""
    allowed = torch.ones(vocab, dtype=torch.bool)
    if history and history[-1] == FORCER:
        return allowed.logical_not().index_fill(0, torch.tensor([SPAN[0]]), True)
    if len(history) >= 2 and history[-2:] == [FORCER, SPAN[0]]:
        return allowed.logical_not().index_fill(0, torch.tensor([SPAN[1]]), True)
    allowed[SPAN] = False
    if history:
        allowed[[t for t in range(vocab) if (t - history[-1]) % 3 == 0]] = False
    return allowed


class ToyGrammar(Constraint):
    """The toy grammar as a [`Constraint`]: it records every path masked and every commit."""

    def __init__(self, vocab: int = V, fail_after: int | None = None) -> None:
        self.vocab, self.history, self.paths, self.fail_after = vocab, [], [], fail_after

    def mask(self, path):
        if self.fail_after is not None and len(self.history) >= self.fail_after:
            raise ValueError("the toy grammar broke")
        self.paths.append((len(self.history), list(path)))
        return toy_allowed(self.history + list(path), self.vocab)

    def forced(self, limit):
        span = SPAN if self.history[-1:] == [FORCER] else (
            SPAN[1:] if self.history[-2:] == [FORCER, SPAN[0]] else [])
        return span[:limit]

    def commit(self, tokens):
        for t in tokens:
            assert toy_allowed(self.history, self.vocab)[t], f"committed a forbidden token {t}"
            self.history.append(t)

    @property
    def finished(self):
        return len(self.history) >= LENGTH


@pytest.fixture
def toy(monkeypatch):
    """Requests with ``regex="toy"`` get a ToyGrammar; the grammars made, in order."""
    made = []

    def factory(sampling, tokenizer, vocab_size, eos):
        if sampling.regex != "toy":
            return None
        made.append(ToyGrammar(vocab_size, fail_after=3 if sampling.seed == 666 else None))
        return made[-1]

    monkeypatch.setattr(hook, "FACTORIES", [factory])
    return made


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(vocab=V, seed=2, scale=0.25)
    return target, noisy_copy(target, 0.08)


def constrained_greedy(target, prompt, n):
    """The reference: argmax of the masked target, token by token, without any cache."""
    grammar, out = ToyGrammar(), []
    with torch.inference_mode():
        while len(out) < n and not grammar.finished:
            ids = torch.tensor([prompt + out])
            logits = target(ids, torch.arange(ids.shape[1])[None])[0, -1]
            out.append(int(logits.masked_fill(~grammar.mask([]), float("-inf")).argmax()))
            grammar.commit(out[-1:])
    return out


DRAFTERS = {
    "draft model": lambda d: (d, None), "draft tree (2, 1)": lambda d: (d, (2, 1)),
    "prompt lookup": lambda d: ("prompt_lookup", None),
    "prompt lookup tree": lambda d: ("prompt_lookup", (2, 1)),
    "forced only": lambda d: (ForcedDrafter(), None),
}


def test_the_mask_comes_before_every_other_adjustment():
    logits = torch.tensor([[3.0, 0.6, 0.5, -1.0], [0.1, 0.2, 0.3, 0.4]])
    mask = torch.tensor([False, True, True, False])
    sp = ms.SamplingParams(temperature=0.7, top_k=1, repetition_penalty=1.3)
    p = ms.core.sampling.probs_for_rows(logits, [sp, sp], [[1], [1]], [mask, None])
    # row 0: token 0 is masked out first, so top-k keeps token 2 (0.6 / 1.3 < 0.5), not token 0
    assert torch.equal(p[0], torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert torch.equal(p[1], ms.probs_from_logits(logits[1], sp, [1]))    # no mask: unchanged
    masked = ms.core.sampling.probs_for_rows(logits, [ms.SamplingParams()] * 2, None,
                                             [mask, mask])
    restricted = torch.softmax(logits, -1) * mask
    torch.testing.assert_close(masked, restricted / restricted.sum(-1, keepdim=True))


def masked(model, grammar_of):
    """``model`` under the mask ``grammar_of(prefix)``, through ``probs_for_rows`` (float64)."""
    def law(prefix):
        logits = model(prefix).log().float()[None]
        return ms.core.sampling.probs_for_rows(logits, [ms.SamplingParams()], None,
                                               [grammar_of(prefix)])[0].double()
    return law


@pytest.mark.parametrize("seed", [0, 1])
def test_masking_p_and_q_alike_is_exact_by_enumeration(seed):
    vocab = 4
    def allowed(prefix):                # no token twice in a row, no token 3 first
        return torch.arange(vocab) != (prefix[-1] if prefix else 3)

    p = masked(random_table_model(vocab, seed, zeros=0.0), allowed)
    q = masked(random_table_model(vocab, seed + 10, zeros=0.0), allowed)
    want = autoregressive_law(p, vocab, 3)
    assert max_law_error(verify_law(p, q, vocab, 2), want) < 1e-6         # float32 masks
    assert max_law_error(tree_law(p, [q, q], vocab, 2), want) < 1e-6


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_under_a_grammar_is_constrained_greedy(toy, pair, name):
    target, draft = pair
    drafter, branching = DRAFTERS[name](draft)
    prompt = [1, 2, 4, 1, 2]
    result = ms.speculative_generate(target, drafter, prompt, 12, k=3, branching=branching,
                                     sampling=ms.SamplingParams(temperature=0, regex="toy"))
    assert result.tokens == constrained_greedy(target, prompt, 12)
    assert result.finish_reason == "grammar" and len(result.tokens) == LENGTH
    grammar = toy[-1]
    assert grammar.history == result.tokens          # commits: exactly the emitted tokens
    assert all(start <= len(result.tokens) for start, _ in grammar.paths)


def two_token_law(target, prompt, sampling):
    """``P(x1, x2)`` of the masked target, by direct forwards: ``(V * V,)``."""
    def next_probs(ids):
        logits = target(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1]
        return ms.core.sampling.probs_for_rows(logits[None], [sampling], None,
                                               [toy_allowed(ids[len(prompt):])])[0]

    with torch.inference_mode():
        first = next_probs(prompt)
        second = torch.stack([next_probs(prompt + [x]) for x in range(V)])
    return (first[:, None] * second).reshape(-1)


@pytest.mark.parametrize("branching", [None, (2, 1)])
def test_sampled_output_has_the_masked_law(toy, pair, branching):
    target, draft = pair
    prompt, runs = [3, 1], 1200
    sp = ms.SamplingParams(temperature=1.0, regex="toy")
    counts = torch.zeros(V * V)
    for seed in range(runs):
        sampling = ms.SamplingParams(temperature=1.0, regex="toy", seed=seed)
        out = ms.speculative_generate(target, draft, prompt, 2, k=2, branching=branching,
                                      sampling=sampling).tokens
        counts[out[0] * V + out[1]] += 1
    # a law error shows up as p < 1e-6 at 1,200 runs; a correct one fails 1 run in a million
    assert chi_square_pvalue(counts, two_token_law(target, prompt, sp)) > 1e-6


@pytest.mark.parametrize("branching", [None, (2, 1)])
def test_a_rejected_path_never_reaches_the_grammar(toy, pair, branching):
    target, draft = pair[0], noisy_copy(pair[0], 0.5)          # a poor draft: many rejections
    rejected = explored = 0
    for seed in range(4):
        sampling = ms.SamplingParams(temperature=1.0, regex="toy", seed=seed)
        result = ms.speculative_generate(target, draft, [1, 2, 4], 12, k=3, branching=branching,
                                         sampling=sampling)
        grammar = toy[-1]
        assert grammar.history == result.tokens     # committed: the accepted tokens, no other
        assert all(toy_allowed(result.tokens[:i])[t] for i, t in enumerate(result.tokens))
        rejected += sum(result.stats.drafted_per_round) - result.stats.accepted
        # masked, then rolled back: a path the grammar was shown that the output does not follow
        explored += sum(result.tokens[start:start + len(path)] != path
                        for start, path in grammar.paths)
    assert rejected > 0 and explored > 0


def test_forced_tokens_are_drafts_the_target_cannot_reject(toy, pair):
    target, _ = pair
    prompt = [1, 2, 4]
    result = ms.speculative_generate(target, ForcedDrafter(), prompt, LENGTH, k=3,
                                     sampling=ms.SamplingParams(temperature=1.0, regex="toy",
                                                                seed=0))
    spans = [r for r in result.rounds if r.drafts]
    assert all(r.drafts == SPAN[-len(r.drafts):] and r.num_accepted == len(r.drafts)
               for r in spans)
    forced = [i for i, t in enumerate(result.tokens[:-2]) if t == FORCER]
    assert len(spans) >= len(forced)           # every forced span was drafted, none rejected


def test_a_broken_grammar_fails_its_request_alone(toy, pair):
    target, draft = pair
    prompts = [[1, 2, 4], [3, 1], [2, 2, 2]]
    samplings = [ms.SamplingParams(temperature=0, regex="toy", seed=666), None,
                 ms.SamplingParams(temperature=0, regex="toy")]
    alone = [ms.speculative_generate(target, draft, prompts[i], 10, k=3, sampling=samplings[i])
             for i in (1, 2)]
    engine = ms.Engine(target, draft=draft, k=3, max_batch_size=3)
    results = engine.generate(prompts, sampling=samplings, max_new_tokens=10, progress=False)
    assert results[0].finish_reason == "error" and "toy grammar broke" in results[0].error
    assert [r.tokens for r in results[1:]] == [r.tokens for r in alone]
    assert results[2].finish_reason == "grammar"


def test_sampling_params_refuse_a_grammar_of_the_wrong_type():
    for kwargs, field in (({"json_schema": 5}, "json_schema"), ({"regex": 3}, "regex"),
                          ({"json_schema": " "}, "json_schema"),
                          ({"json_schema": {}, "regex": "a"}, "json_schema")):
        with pytest.raises(ValueError, match=field):
            ms.SamplingParams(**kwargs)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert ms.SamplingParams(json_schema=schema).json_schema == (
        '{"type": "object", "properties": {"a": {"type": "integer"}}}')       # its key order
    hash(ms.SamplingParams(json_schema=schema))                                # still hashable


def test_a_grammar_without_a_factory_is_refused(monkeypatch, pair):
    monkeypatch.setattr(hook, "FACTORIES", [])
    with pytest.raises(ValueError, match="grammar wing"):
        ms.generate(pair[0], [1, 2], 4, ms.SamplingParams(regex="a+"))
