"""A draft tree fails its own row alone, as a chain does (issue "Every input checked", item 1).

A row whose tree drafter raises, or whose sampled draft logits are NaN, ends with
``finish_reason="error"``, its memory (the target's blocks and a draft model's, trees included) is
freed, and every other row decodes exactly as it does without it (float64 pair: see
``test_round.pair``).
"""

import dataclasses

import pytest
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import NGramDrafter

NEW = 16
HEALTHY = [[1, 2, 3, 1, 2], [5, 6, 5, 6, 5], list(range(10, 22))]
BRANCHING = (2, 2, 1)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target.double(), noisy_copy(target, 0.05, seed=None).double()


def served(target, prompts, sampling, kv_cache="paged", **drafter):
    """Serve ``prompts`` (each with its own seed) with draft trees; the results and the engine."""
    engine = ms.Engine(target, k=3, branching=BRANCHING, max_batch_size=4, kv_cache=kv_cache,
                       block_size=4, **drafter)
    params = [dataclasses.replace(sampling, seed=None if sampling.seed is None else i)
              for i in range(len(prompts))]
    return engine.generate(prompts, params, progress=False, max_new_tokens=NEW), engine


def check_alone(results, engine, expected, bad: int, words: str):
    """Row ``bad`` failed with ``words`` in its error; the others equal ``expected``; no block
    is left in use."""
    assert results[bad].finish_reason == "error" and words in results[bad].error
    healthy = [r for i, r in enumerate(results) if i != bad]
    assert [r.finish_reason for r in healthy] == ["length"] * len(healthy)
    assert [r.tokens for r in healthy] == expected
    for cache in (engine.target_cache, engine.draft_cache):
        if isinstance(cache, ms.PagedKVCache):
            assert cache.num_used_blocks == 0


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_a_tree_drafter_that_raises_fails_its_row_alone(pair, monkeypatch, kv_cache):
    target, _ = pair
    propose = NGramDrafter.lookup_tree

    def flaky(self, context, branching):
        if context[0] == 33:
            raise RuntimeError("tree drafter bug")
        return propose(self, context, branching)

    monkeypatch.setattr(NGramDrafter, "lookup_tree", flaky)
    greedy = ms.SamplingParams(temperature=0.0)
    expected = [ms.generate(target, p, NEW).tokens for p in HEALTHY]
    prompts = HEALTHY[:1] + [[33, 1, 2]] + HEALTHY[1:]
    results, engine = served(target, prompts, greedy, kv_cache, drafter="ngram")
    check_alone(results, engine, expected, 1, "tree drafter bug")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_draft_logits_in_a_tree_fail_that_row_alone(pair, monkeypatch, temperature):
    """The draft model's logits are NaN for the row whose prompt starts with 33 (a broken draft
    model, as a NaN weight read by that request alone would make it); the target is healthy."""
    target, draft = pair
    start = ModelDrafter._tree_root

    def poisoned(self, seq):
        logits, n = start(self, seq)
        return (logits * float("nan") if seq.context[0] == 33 else logits), n

    sampling = ms.SamplingParams(temperature=temperature, seed=0 if temperature else None)
    alone, _ = served(target, HEALTHY, sampling, draft=draft)
    monkeypatch.setattr(ModelDrafter, "_tree_root", poisoned)
    prompts = HEALTHY[:2] + [[33, 4, 5]] + HEALTHY[2:]
    params = [dataclasses.replace(sampling, seed=None if sampling.seed is None else i)
              for i in (0, 1, 99, 2)]                 # the healthy rows keep their seeds
    engine = ms.Engine(target, draft=draft, k=3, branching=BRANCHING, max_batch_size=4,
                       block_size=4)
    results = engine.generate(prompts, params, progress=False, max_new_tokens=NEW)
    check_alone(results, engine, [r.tokens for r in alone], 2, "NaN")
