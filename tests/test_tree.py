"""Several proposals: iterative speculative sampling and draft trees (Stratos §2, §2.1, App. A)."""

import itertools

import pytest
import torch
from lawcheck import (
    _node_paths,
    autoregressive_law,
    chi_square_pvalue,
    max_law_error,
    random_table_model,
    tree_law,
)

import minispec as ms


def iterative_law(p: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Exact law of ``ms.iterative_speculative_sample``: every proposal draw and every decision."""
    K, V = qs.shape
    law = torch.zeros_like(p)
    for proposals in itertools.product(range(V), repeat=K):
        weight = 1.0
        for j, x in enumerate(proposals):
            weight *= float(qs[j, x])
        if weight == 0:
            continue
        for pattern in itertools.product([0.0, 1.0], repeat=K):
            result = ms.iterative_speculative_sample(p, qs, proposals=proposals, uniforms=pattern)
            used = len(result.accept_probs)
            if any(u != 0.0 for u in pattern[used:]):
                continue
            branch = weight
            for u, a in zip(pattern[:used], result.accept_probs, strict=True):
                branch *= a if u == 0.0 else 1 - a
            if branch == 0:
                continue
            if result.accepted_index is not None:
                law[result.token] += branch
            else:
                law += branch * result.final_probs
    return law


@pytest.mark.parametrize("seed", range(6))
def test_iterative_speculative_sampling_exact_law(seed):
    vocab, K = 4, 3
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    qs = torch.softmax(torch.randn(K, vocab, generator=g, dtype=torch.float64) * 2, -1)
    if seed % 2:
        qs[1] = qs[0]                            # repeated proposals are allowed
        p[0] = 0
        p = p / p.sum()
    assert torch.allclose(iterative_law(p, qs), p, atol=1e-9, rtol=0)


def test_iterative_monte_carlo_and_acceptance_grows_with_k():
    vocab = 6
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(vocab, generator=g), -1)
    qs = torch.softmax(torch.randn(4, vocab, generator=g), -1)
    n = 6000
    results = [ms.iterative_speculative_sample(p, qs, g) for _ in range(n)]
    counts = torch.bincount(torch.tensor([r.token for r in results]), minlength=vocab)
    assert chi_square_pvalue(counts, p) > 1e-3
    # More proposals can only add chances: P(some proposal accepted) with K = 1 <= with K = 4.
    accepted_any = sum(r.accepted_index is not None for r in results) / n
    accepted_first = sum(r.accepted_index == 0 for r in results) / n
    assert accepted_any > accepted_first


def test_draft_tree_structure():
    tree = ms.DraftTree.from_drafts([[5, 6, 7], [5, 8], [9]])
    # Depth-first numbering: root, 5, 6, 7, 8, 9.
    assert tree.tokens == [-1, 5, 6, 7, 8, 9]
    assert tree.parents == [-1, 0, 1, 2, 1, 0]
    assert tree.draft_nodes == [[1, 2, 3], [1, 4], [5]]
    assert tree.children(1) == [2, 4]
    mask = tree.ancestor_mask()
    assert mask[3].tolist() == [True, True, True, True, False, False]
    assert mask[4].tolist() == [True, True, False, False, True, False]


def greedy_reference(p, drafts):
    """Brute force: the longest draft prefix that is the target's greedy continuation, then its
    argmax."""
    best: tuple[int, ...] = ()
    for draft in drafts:
        accepted: tuple[int, ...] = ()
        for x in draft:
            if int(p(accepted).argmax()) != x:
                break
            accepted += (x,)
        best = max(best, accepted, key=len)
    return list(best) + [int(p(best).argmax())]


@pytest.mark.parametrize("seed", range(40))
def test_greedy_tree_finds_longest_accepted_path(seed):
    vocab = 3
    p = random_table_model(vocab, seed=seed, zeros=0.0)
    g = torch.Generator().manual_seed(seed)
    drafts = [torch.randint(vocab, (int(torch.randint(1, 4, (1,), generator=g)),),
                            generator=g).tolist()
              for _ in range(int(torch.randint(1, 5, (1,), generator=g)))]
    tree = ms.DraftTree.from_drafts(drafts)
    target = torch.stack([p(path) for path in _node_paths(tree)])
    one_hot = torch.zeros_like(target).scatter_(-1, target.argmax(-1, keepdim=True), 1.0)
    proposal = ms.Proposal.from_tree(tree)
    verdict = ms.verify(proposal, one_hot)
    assert verdict.tokens == greedy_reference(p, drafts)
    # Forcing greedy mode on the soft rows, or giving the argmaxes alone, gives the same answer.
    assert ms.verify(proposal, target, greedy=True).tokens == verdict.tokens
    fast = ms.verify(proposal, target.argmax(-1).tolist())
    assert (fast.tokens, fast.path, fast.bonus) == (verdict.tokens, verdict.path, verdict.bonus)
    assert fast.final_probs is None


@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_tree_exact_law(seed):
    vocab, depth = 3, 2
    p = random_table_model(vocab, seed=10 + seed, zeros=0.2)
    qs = [random_table_model(vocab, seed=20 + seed, zeros=0.2),
          random_table_model(vocab, seed=30 + seed, zeros=0.0, sharp=2.0)]
    law = tree_law(p, qs, vocab, depth)
    assert max_law_error(law, autoregressive_law(p, vocab, depth + 1)) < 1e-9


def test_sampled_tree_with_one_hot_proposals_monte_carlo():
    """Deterministic drafters (several n-gram candidates): one-hot proposals stay exact."""
    vocab = 4
    p = random_table_model(vocab, seed=3, zeros=0.0)
    drafts = [[0, 1], [0, 2], [3]]
    proposal = ms.Proposal.from_drafts(drafts)
    target = torch.stack([p(path) for path in _node_paths(proposal.tree)]).float()
    g = torch.Generator().manual_seed(0)
    n = 6000
    firsts = [ms.verify(proposal, target, g, greedy=False).tokens[0] for _ in range(n)]
    counts = torch.bincount(torch.tensor(firsts), minlength=vocab)
    assert chi_square_pvalue(counts, p(()).float()) > 1e-3


def test_proposal_from_drafts_draws_each_draft_in_order():
    """SpecInfer's draws: at every node each draft through it proposes its next token, in draft
    order, with its own q row; a child two drafts share is drawn twice."""
    qs = [torch.full((2, 4), 0.25), torch.full((2, 4), 0.25) * torch.tensor([2.0, 0, 1, 1]),
          torch.tensor([[0.1, 0.2, 0.3, 0.4]])]
    proposal = ms.Proposal.from_drafts([[1, 2], [1, 3], [0]], qs)
    assert proposal.tree.tokens == [-1, 1, 2, 3, 0]
    assert [[c for c, _ in d] for d in proposal.draws] == [[1, 1, 4], [2, 3], [], [], []]
    assert torch.equal(proposal.draws[0][1][1], qs[1][0])
    assert torch.equal(proposal.draws[0][2][1], qs[2][0])
    assert torch.equal(proposal.draws[1][1][1], qs[1][1])
    assert proposal.depth == 2 and not proposal.is_chain
    assert all(q is None for d in ms.Proposal.from_drafts([[1, 2], [1, 3]]).draws for _, q in d)
    chain = ms.Proposal.chain([5, 6])
    assert chain.tree.tokens == [-1, 5, 6] and chain.tree.parents == [-1, 0, 1]
    assert chain.is_chain and chain.depth == 2 and chain.tree.draft_nodes == [[1, 2]]


def test_tree_bad_inputs():
    tree = ms.DraftTree.from_drafts([[0, 1]])
    proposal = ms.Proposal.from_tree(tree)
    with pytest.raises(ValueError, match=r"\[N, V\] with N = 3"):
        ms.verify(proposal, torch.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="2 argmax ids for a tree of 3 nodes"):
        ms.verify(proposal, [0, 1])
    with pytest.raises(ValueError, match="lie in"):
        ms.verify(ms.Proposal.from_drafts([[0, 5]]), torch.full((3, 3), 1 / 3))
    with pytest.raises(ValueError, match="sum to 1"):
        ms.verify(proposal, torch.full((3, 3), 0.5))
    with pytest.raises(ValueError, match="argmaxes"):
        ms.verify(proposal, [0, 1, 2], greedy=False)
    with pytest.raises(ValueError, match=r"draft_probs\[0\] must be \[2, V\]"):
        ms.Proposal.from_tree(tree, [torch.full((1, 3), 1 / 3)])
    with pytest.raises(ValueError, match=r"draft_probs\[0\] must be \[2, V\]"):
        ms.Proposal.from_tree(tree, [torch.full((3,), 1 / 3)])
    with pytest.raises(ValueError, match="draft_probs for 2 drafts"):
        ms.Proposal.from_tree(tree, [torch.full((2, 3), 1 / 3)] * 2)
    with pytest.raises(ValueError, match=r"draft_probs\[0\] rows must sum to 1"):
        ms.Proposal.from_tree(tree, [torch.full((2, 3), 0.5)])
    with pytest.raises(ValueError, match=r"draft_probs\[1\] contains NaN"):
        ms.Proposal.from_drafts([[0], [1]], [torch.full((1, 3), 1 / 3),
                                             torch.tensor([[float("nan"), 0.5, 0.5]])])
    with pytest.raises(ValueError, match="probability 0"):      # a tested draw q gives 0
        ms.verify(ms.Proposal.from_tree(tree, [torch.tensor([[1.0, 0.0, 0.0]] * 2)]),
                  torch.full((3, 3), 1 / 3), greedy=False, uniforms=[0.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        ms.DraftTree.from_drafts([])
    with pytest.raises(ValueError, match="probability 0"):
        ms.iterative_speculative_sample(torch.tensor([0.5, 0.5]), torch.tensor([[1.0, 0.0]]),
                                        proposals=[1])
