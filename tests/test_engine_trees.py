"""Draft trees in the engine: the same round as ``speculative_generate`` drives, over a batch.

* greedy: every request's tokens equal plain greedy decoding of it alone, for each tree drafter,
  paged and contiguous caches, with requests of different lengths sharing steps;
* sampled: the first two tokens of seeded tree runs in the engine follow the target's exact law;
* preemption: a pool too small for every request's tree forces preemption by recompute; nothing
  is lost, nothing duplicated, and every block comes back -- the draft model's too: its trees are
  drawn in the engine's paged draft pool, bounded by ``num_blocks`` like the target's.
"""

from __future__ import annotations

import pytest
import torch
from lawcheck import chi_square_pvalue
from test_tree_attention import LAW_PARAMS, LAW_PROMPT, law_models  # noqa: F401 (fixture)
from tinymodels import noisy_copy, tiny_llama

import minispec as ms

PROMPTS = [[1], [3, 4, 5], [10, 11] * 6, list(range(20, 40)), [7, 7, 7, 7]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target, noisy_copy(target, 0.05, seed=None)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_engine_trees_equal_greedy(pair, kv_cache, drafter):
    target, draft = pair
    engine = ms.Engine(target, drafter=draft if drafter == "model" else "ngram", k=3,
                       branching=(3, 2, 1), max_batch_size=3, kv_cache=kv_cache, block_size=4)
    outs = engine.generate(PROMPTS, max_new_tokens=25, progress=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.tokens == ms.generate(target, prompt, 25).tokens
    assert engine.target_forwards < sum(len(o.tokens) for o in outs)   # trees did accept drafts
    if kv_cache == "paged":
        assert engine.target_cache.num_used_blocks == 0


def test_engine_trees_under_preemption_lose_nothing(pair):
    target, draft = pair
    engine = ms.Engine(target, draft=draft, k=3, branching=(2, 2, 1), max_batch_size=4,
                       block_size=4, num_blocks=30)
    ids = [engine.add_request(p, max_new_tokens=30) for p in PROMPTS * 2]
    tokens, peak = {rid: [] for rid in ids}, 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += [] if out.token is None else [out.token]
        peak = max(peak, engine.draft_cache.num_used_blocks)
    assert engine.scheduler.num_preemptions > 0
    for prompt, rid in zip(PROMPTS * 2, ids, strict=True):
        assert tokens[rid] == ms.generate(target, prompt, 30).tokens
    assert isinstance(engine.draft_cache, ms.PagedKVCache)      # the trees' draft memory: a pool
    assert engine.draft_cache.num_blocks == 30 and 0 < peak <= 30
    for cache in (engine.target_cache, engine.draft_cache):
        assert cache.num_used_blocks == 0 and cache.num_free_blocks == cache.num_blocks


def engine_law_pvalue(target, draft, law: torch.Tensor, branching, n: int = 1500) -> float:
    """Chi-square p-value of the first two tokens of ``n`` seeded requests served by one engine
    with draft trees of ``branching`` (depth 2: each request is alone in its first round) against
    ``law``, rare cells merged."""
    engine = ms.Engine(target, draft=draft, k=2, branching=branching, max_batch_size=16)
    params = [ms.SamplingParams(**LAW_PARAMS, seed=s) for s in range(n)]
    outs = engine.generate([LAW_PROMPT] * n, params, max_new_tokens=3, progress=False)
    counts = torch.zeros(25)
    for out in outs:
        counts[out.tokens[0] * 5 + out.tokens[1]] += 1
    keep = law * n >= 5
    return chi_square_pvalue(torch.cat([counts[keep], counts[~keep].sum()[None]]),
                             torch.cat([law[keep], law[~keep].sum()[None]]))


def test_engine_sampled_trees_have_the_target_law(law_models):  # noqa: F811
    """First two tokens of 1,500 seeded requests (each alone in its first round: a depth-2 tree,
    2 draws per node) against the exact law; a false alarm has probability 1e-3."""
    target, draft, law = law_models
    assert engine_law_pvalue(target, draft, law, (2, 2)) > 1e-3
