"""A batched drafter's failure stays with the rows responsible (issue "Every failure stays with its
request", item 1).

When one batched ``propose`` raises because of one row (a draft model, an EAGLE head, a user's own
drafter), or returns a ``q`` for one row that is no distribution, the round puts every row's
random stream back, lets the drafter rewind, asks each half again until the rows responsible are
found, and fails those alone: every other row decodes exactly as it does without them -- greedy,
and sampled with its own seed (float64 pair: see ``test_round.pair``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_eagle import random_head
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.drafters.model import ModelDrafter
from minispec.extra_drafters.eagle import EagleDrafter

NEW = 12
HEALTHY = [[1, 2, 3, 1, 2], [5, 6, 5, 6, 5], list(range(10, 22))]
POISON = 33                    # a prompt that starts with it breaks the drafter for its row

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target.double(), noisy_copy(target, 0.05, seed=None).double()


def seeded(sampling: ms.SamplingParams, seeds: list[int]) -> list[ms.SamplingParams]:
    return [dataclasses.replace(sampling, seed=None if sampling.seed is None else s)
            for s in seeds]


def serve(target, prompts, sampling, seeds, **drafter):
    engine = ms.Engine(target, k=3, max_batch_size=4, block_size=4, adaptive=False, **drafter)
    results = engine.generate(prompts, seeded(sampling, seeds), progress=False,
                              max_new_tokens=NEW)
    return results, engine


def check_alone(results, engine, expected, bad: int, words: str) -> None:
    """Row ``bad`` failed naming ``words``; the others equal ``expected``; no block is in use."""
    assert results[bad].finish_reason == "error" and words in results[bad].error
    healthy = [r for i, r in enumerate(results) if i != bad]
    assert [r.tokens for r in healthy] == expected
    assert [r.finish_reason for r in healthy] == ["length"] * len(healthy)
    for cache in (engine.target_cache, engine.draft_cache):
        assert cache is None or cache.num_used_blocks == 0


class BrokenForOne(ModelDrafter):
    """A draft model whose batched step raises whenever the poisoned row is in the batch (as a
    shape or device error caused by one request would), after it has drawn for the others."""

    def _chain_step(self, seqs, drafts):
        logits = super()._chain_step(seqs, drafts)
        if any(seq.context[0] == POISON for seq in seqs):
            raise RuntimeError("draft step broken by one request")
        return logits

    def clone(self):
        return BrokenForOne(self.model, self.max_seq_len)


class BadQForOne(ModelDrafter):
    """A draft model whose ``q`` for the poisoned row is not a distribution."""

    def _choose(self, seqs, logits, drafts):
        for seq, (token, q) in zip(seqs, super()._choose(seqs, logits, drafts), strict=True):
            yield token, (q * 3 if seq.context[0] == POISON and q is not None else q)

    def clone(self):
        return BadQForOne(self.model, self.max_seq_len)


@pytest.mark.parametrize("kind, words, temperature", [
    (BrokenForOne, "broken by one request", 0.0), (BrokenForOne, "broken by one request", 0.8),
    (BadQForOne, "q", 0.8)])                   # (greedy rows declare no q to spoil)
def test_a_draft_model_that_fails_one_row_fails_that_row_alone(pair, kind, words, temperature):
    target, draft = pair
    sampling = ms.SamplingParams(temperature=temperature, seed=0 if temperature else None)
    alone, _ = serve(target, HEALTHY, sampling, [0, 1, 2], draft=draft)
    prompts = HEALTHY[:1] + [[POISON, 4, 5]] + HEALTHY[1:]
    results, engine = serve(target, prompts, sampling, [0, 99, 1, 2], drafter=kind(draft))
    check_alone(results, engine, [r.tokens for r in alone], 1, words)


def test_an_eagle_head_that_fails_one_row_fails_that_row_alone(monkeypatch):
    """The head's batched catch-up raises when the poisoned row is in it; the rewind puts the
    other rows' features back, and they draft from them when asked again."""
    target = tiny_llama(seed=0)                       # float32, as the head
    head = random_head(target)
    alone, _ = serve(target, HEALTHY, ms.SamplingParams(temperature=0.0), [0, 1, 2],
                     drafter=EagleDrafter(head))
    assert [r.finish_reason for r in alone] == ["length"] * 3 and alone[0].stats.rounds
    catch_up = EagleDrafter._catch_up

    def broken(self, seqs):
        out = catch_up(self, seqs)
        if any(seq.context[0] == POISON for seq in seqs):
            raise RuntimeError("head broken by one request")
        return out

    monkeypatch.setattr(EagleDrafter, "_catch_up", broken)
    prompts = HEALTHY[:2] + [[POISON, 4, 5]] + HEALTHY[2:]
    results, engine = serve(target, prompts, ms.SamplingParams(temperature=0.0), [0, 1, 9, 2],
                            drafter=EagleDrafter(head))
    check_alone(results, engine, [r.tokens for r in alone], 2, "head broken by one request")


def test_a_user_drafter_that_raises_for_one_row_is_asked_again_in_halves(pair):
    """A drafter of one's own: the batch is split until the poisoned row is alone; the calls say
    so (the whole batch, then halves), and the healthy rows still draft."""
    target, _ = pair
    calls: list[int] = []

    class Repeat(ms.Drafter):
        def propose(self, seqs, shapes):
            calls.append(len(seqs))
            if any(seq.context[0] == POISON for seq in seqs):
                raise RuntimeError("user drafter bug")
            return [ms.Proposal.chain(seq.context[len(seq.context) - k:])    # its last k
                    for seq, k in zip(seqs, shapes, strict=True)]

    expected = [ms.generate(target, p, NEW).tokens for p in HEALTHY]
    prompts = HEALTHY[:1] + [[POISON, 4, 5]] + HEALTHY[1:]
    results, engine = serve(target, prompts, ms.SamplingParams(temperature=0.0), [0, 1, 2, 3],
                            drafter=Repeat())
    check_alone(results, engine, expected, 1, "user drafter bug")
    assert calls[:5] == [4, 2, 1, 1, 2]                # 4 rows, then the half with the poison


def test_the_rewind_puts_the_random_streams_back():
    """``_propose`` restores each row's generator before asking again: the healthy rows draw
    the same numbers as in a run without the failure (checked on the generators themselves)."""
    from minispec.core.sequence import Sequence
    from minispec.decoding.runner import SpeculativeRunner

    class DrawsThenFails(ms.Drafter):
        def propose(self, seqs, shapes):
            for seq in seqs:
                torch.rand(3, generator=seq.generator)          # draws, then ...
            if len(seqs) > 1:
                raise RuntimeError("fails in a batch")
            return [ms.Proposal.chain([]) for _ in seqs]

    target = tiny_llama(seed=0)
    seqs = [Sequence(str(i), [1, 2], ms.SamplingParams(temperature=1.0, seed=i)) for i in range(2)]
    fresh = [Sequence(str(i), [1, 2], ms.SamplingParams(temperature=1.0, seed=i)) for i in range(2)]
    runner = SpeculativeRunner(target, ms.ContiguousKVCache.for_model(target, 2), DrawsThenFails())
    runner._propose(seqs, [2, 2])
    for seq, ref in zip(seqs, fresh, strict=True):
        torch.rand(3, generator=ref.generator)                  # one draw each, as when alone
        assert torch.equal(seq.generator.get_state(), ref.generator.get_state())
