"""Dynamic draft trees (EAGLE-2): shaped by the drafter's confidence, verified like any tree.

* the rule: ``grow_dynamic`` scores the ``top_k`` likeliest nodes of each depth and keeps the
  nodes of highest value (path probability), checked against a brute-force enumeration on a
  drafter given by a table; ``best_tree_size`` against a brute-force maximum;
* exactness: greedy output equals the target's for a draft model and an EAGLE head, in both
  drivers (the engine under preemption too), and the sampled law holds (children are chosen, so
  their ``q`` is one-hot);
* input checks: bad fields and a context drafter are refused before any forward.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_eagle import every_other, random_head, self_copy_head
from test_engine_trees import engine_law_pvalue
from test_tree_attention import law_models  # noqa: F401 (fixture)
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.core.theory import best_tree_size
from minispec.extra_drafters import dynamic
from minispec.extra_drafters.dynamic import grow_dynamic
from minispec.extra_drafters.eagle import EagleDrafter

NEW = 24
PROMPTS = [[1], [3, 4, 5], [10, 11] * 6, list(range(20, 40)), [7, 7, 7, 7]]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target, noisy_copy(target, 0.05, seed=None)


# ---------------------------------------------------------------------- the rule


def table_drafter(vocab: int, seed: int = 0):
    """Draft logits that depend on the last token only: ``table[token]`` (V,)."""
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def reference_values(table, root: int, top_k: int, depth: int) -> dict[tuple[int, ...], float]:
    """Every candidate EAGLE-2 creates, by brute force: path -> its log value."""
    log_q = torch.log_softmax(table.double(), dim=-1)
    level = {(): 0.0}
    out = {}
    for _ in range(depth):
        best = sorted(level, key=lambda p: -level[p])[:top_k]          # expanded nodes
        level = {}
        for path in best:
            last = path[-1] if path else root
            for t in log_q[last].topk(top_k).indices.tolist():
                level[path + (t,)] = level_value = (out.get(path, 0.0) + log_q[last, t].item())
                out[path + (t,)] = level_value
    return out


@pytest.mark.parametrize("top_k, nodes, depth", [(2, 5, 3), (3, 8, 4), (4, 30, 3)])
def test_the_kept_nodes_are_the_likeliest_candidates(top_k, nodes, depth):
    vocab, root = 12, 3
    table = table_drafter(vocab)
    seq = ms.Sequence.new("t", [5, root], None, max_new_tokens=8, max_seq_len=64,
                          vocab_size=vocab)

    def score(frontier, parents, ids, positions, tree):
        return table[ids[0]]                                           # (F, V)

    shape = ms.DynamicTree(top_k=top_k, nodes=nodes, depth=depth)
    proposal = grow_dynamic(seq, shape, (table[root][None], 2), score, {})
    tree = proposal.tree
    kept = {tuple(tree.tokens[i] for i in path) for path in _paths(tree)}
    values = reference_values(table, root, top_k, depth)
    ranked = sorted(values.values(), reverse=True)
    assert len(kept) == min(nodes, len(values)) == len(tree) - 1
    assert {round(values[p], 9) for p in kept} == {round(v, 9) for v in ranked[:len(kept)]}
    assert proposal.depth <= depth and all(q is None for d in proposal.draws for _, q in d)


def _paths(tree):
    """Every non-root node's path from the root (node ids)."""
    paths = {0: []}
    for i in range(1, len(tree)):
        paths[i] = paths[tree.parents[i]] + [i]
    return [paths[i] for i in range(1, len(tree))]


def test_best_tree_size_maximises_tokens_per_cost():
    values = [0.9, 0.7, 0.4, 0.2, 0.1, 0.05]
    for r in ([1.0] * 8, [1, 1.1, 1.2, 1.4, 1.8, 2.5, 3.5], [1, 2, 3, 4, 5, 6, 7]):
        for draft in (0.0, 0.5):
            want = max(range(7), key=lambda n: ((1 + sum(values[:n])) / (draft + r[n]), -n))
            assert best_tree_size(values, r, draft) == want
    assert best_tree_size(values, None) == len(values)                # free: keep them all
    assert best_tree_size(values, [1, 2, 3, 4, 5, 6, 7]) == 0         # a step per node: a chain
    assert best_tree_size(values, [1.0, 1.0]) == len(values)          # a short curve extends


def test_a_costly_verify_keeps_fewer_nodes(pair, monkeypatch):
    """The cost curve decides N: a flat r verifies every node asked for, a steep one fewer."""
    target, draft = pair
    sizes: list[int] = []

    def spied(*args):
        proposal = grow_dynamic(*args)
        sizes.append(len(proposal.tree) - 1)
        return proposal

    monkeypatch.setattr(dynamic, "grow_dynamic", spied)
    means = {}
    for name, cost in [("flat", (1.0,) * 40), ("steep", tuple(1 + 0.5 * t for t in range(40)))]:
        sizes.clear()
        tree = ms.DynamicTree(top_k=3, nodes=12, verify_cost=cost)
        out = ms.speculative_generate(target, draft, PROMPTS[3], NEW, k=4, branching=tree)
        assert out.tokens == ms.generate(target, PROMPTS[3], NEW).tokens
        means[name] = (sum(sizes) / len(sizes), max(sizes))
    assert means["flat"][1] == 12          # depth 4: 3 + 9 + 9 + 9 candidates, 12 kept
    assert means["steep"][0] < means["flat"][0] / 2


# ---------------------------------------------------------------------- exactness


@pytest.mark.parametrize("nodes", [1, 6, 20])
def test_greedy_output_is_the_targets_with_a_draft_model(pair, nodes):
    target, draft = pair
    tree = ms.DynamicTree(top_k=3, nodes=nodes)
    for prompt in PROMPTS:
        out = ms.speculative_generate(target, draft, prompt, NEW, k=4, branching=tree)
        assert out.tokens == ms.generate(target, prompt, NEW).tokens
        assert out.stats.target_forwards == out.stats.rounds


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_output_is_the_targets_with_an_eagle_head(pair, vocab):
    target, _ = pair
    head = random_head(target, None if vocab == "full" else every_other(target.config.vocab_size))
    for prompt in PROMPTS:
        out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=4,
                                      branching=ms.DynamicTree(top_k=3, nodes=8))
        assert out.tokens == ms.generate(target, prompt, NEW).tokens


def test_a_head_that_knows_the_target_gets_its_dynamic_tree_accepted():
    target = tiny_llama(seed=0, layers=1)
    drafter = EagleDrafter(self_copy_head(target))
    out = ms.speculative_generate(target, drafter, list(range(10, 22)), NEW, k=4,
                                  branching=ms.DynamicTree(top_k=2, nodes=6))
    assert out.tokens == ms.generate(target, list(range(10, 22)), NEW).tokens
    assert NEW / out.stats.target_forwards > 2                 # most rounds accept several


@pytest.mark.parametrize("drafter", ["model", "eagle"])
def test_the_engine_under_preemption_equals_greedy(pair, drafter):
    target, draft = pair
    spec = draft if drafter == "model" else EagleDrafter(random_head(target))
    engine = ms.Engine(target, drafter=spec, k=4, branching=ms.DynamicTree(top_k=3, nodes=8),
                       max_batch_size=4, block_size=4, num_blocks=24)
    outs = engine.generate(PROMPTS * 2, max_new_tokens=30, progress=False)
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(PROMPTS * 2, outs, strict=True):
        assert out.tokens == ms.generate(target, prompt, 30).tokens
    for cache in (engine.target_cache, engine.draft_cache):
        assert cache.num_used_blocks == 0


def test_sampled_dynamic_trees_have_the_target_law(law_models):  # noqa: F811
    """First two tokens of 1,500 seeded requests, each's first round a dynamic tree of depth 2;
    a false alarm has probability 1e-3."""
    target, draft, law = law_models
    assert engine_law_pvalue(target, draft, law, ms.DynamicTree(top_k=2, nodes=4)) > 1e-3


# ---------------------------------------------------------------------- input checks


@pytest.mark.parametrize("bad", [dict(top_k=0), dict(nodes=0), dict(top_k=1.5),
                                 dict(verify_cost=()), dict(verify_cost=(1.0, -1.0)),
                                 dict(verify_cost=(1.0, math.nan)), dict(draft_cost=-0.1),
                                 dict(nodes=5000)])
def test_bad_dynamic_trees_are_refused(pair, bad):
    target, draft = pair
    with pytest.raises(ValueError, match="DynamicTree|MAX_TREE_NODES"):
        ms.speculative_generate(target, draft, [1, 2], 4, k=3, branching=ms.DynamicTree(**bad))
    with pytest.raises(ValueError, match="DynamicTree|MAX_TREE_NODES"):
        ms.Engine(target, draft=draft, k=3, branching=ms.DynamicTree(**bad))


def test_a_context_drafter_cannot_grow_a_dynamic_tree(pair):
    """Only a drafter whose model scores its nodes grows one; a hybrid's context source cannot."""
    target, _ = pair
    hybrid = ms.HybridDrafter(head=EagleDrafter(random_head(target)))
    for drafter in ("ngram", hybrid):
        with pytest.raises(ValueError, match="draft model or an EAGLE head"):
            ms.speculative_generate(target, drafter, [1, 2], 4, k=3, branching=ms.DynamicTree())
        with pytest.raises(ValueError, match="draft model or an EAGLE head"):
            ms.Engine(target, drafter=drafter, k=3, branching=ms.DynamicTree())


def test_the_bench_prices_a_dynamic_tree_on_this_device(pair, capsys):
    """``minispec bench --tree-nodes N``: r(T) measured for T = 1..N + 1, one for one token."""
    from minispec.tools.cli import dynamic_tree

    target, _ = pair
    tree = dynamic_tree(target, nodes=5, top_k=2, threads=1)
    assert (tree.nodes, tree.top_k, len(tree.verify_cost)) == (5, 2, 6)
    r = tree.verify_cost
    assert r[0] == 1.0 and all(1 <= a <= b < math.inf for a, b in zip(r, r[1:], strict=False))
    assert "r(T) on this device, T = 1..6" in capsys.readouterr().out
    out = ms.speculative_generate(target, _, PROMPTS[2], 8, k=3, branching=tree)
    assert out.tokens == ms.generate(target, PROMPTS[2], 8).tokens
