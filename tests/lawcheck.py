"""Exact enumeration of the output law of minispec's verifiers, for the exactness tests.

The verifiers take their acceptance uniforms from an optional ``uniforms`` argument. Feeding
``u = 0`` forces "accept" whenever acceptance is possible (``p(x) > 0``) and ``u = 1`` forces
"reject" whenever rejection is possible (``p(x) < q(x)``); weighting each forced branch by its
probability, ``min(1, p/q)`` or ``1 - min(1, p/q)``, enumerates every random path of the
implementation exactly. The last token's law is read from ``final_probs``.

Toy "language models" here are functions ``prefix tuple -> [V] float64 distribution``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable

import torch

import minispec as ms

Model = Callable[[tuple[int, ...]], torch.Tensor]


def random_table_model(vocab: int, seed: int, zeros: float = 0.3, sharp: float = 1.0) -> Model:
    """A context-dependent model over ``vocab`` tokens, some probabilities exactly zero."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def model(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in cache:
            g = torch.Generator().manual_seed(hash((seed,) + prefix) % 2**31)
            logits = torch.randn(vocab, generator=g, dtype=torch.float64) * sharp
            mask = torch.rand(vocab, generator=g, dtype=torch.float64) < zeros
            mask[logits.argmax()] = False          # keep at least one token
            cache[prefix] = torch.softmax(logits.masked_fill(mask, float("-inf")), -1)
        return cache[prefix]

    return model


def autoregressive_law(p: Model, vocab: int, length: int) -> dict[tuple[int, ...], float]:
    """The target's law over sequences of ``length`` tokens."""
    law = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for i, x in enumerate(seq):
            prob *= float(p(seq[:i])[x])
        if prob > 0:
            law[seq] = prob
    return law


def extend_with_target(p: Model, prefix: tuple[int, ...], weight: float, vocab: int, length: int,
                       law: dict[tuple[int, ...], float]) -> None:
    """Continue ``prefix`` with the target up to ``length`` tokens, adding the law into ``law``."""
    if weight == 0:
        return
    if len(prefix) == length:
        law[prefix] += weight
        return
    probs = p(prefix)
    for x in range(vocab):
        extend_with_target(p, prefix + (x,), weight * float(probs[x]), vocab, length, law)


def accept_prob(p_x: float, q_x: float) -> float:
    return min(1.0, p_x / q_x)


def verify_law(p: Model, q: Model | None, vocab: int, k: int,
               deterministic_draft: Callable[[tuple[int, ...]], int] | None = None
               ) -> dict[tuple[int, ...], float]:
    """Exact law of ``k + 1`` tokens: one ``ms.verify`` round (drafts from ``q``), then the target.

    With ``q = None`` the drafts come from ``deterministic_draft`` and the chain gets
    ``probs=None`` (one-hot q). Verify draws one uniform per test, lazily: ``n`` zeros then a
    one stop the walk after exactly ``n`` accepts.
    """
    law: dict[tuple[int, ...], float] = defaultdict(float)
    drafts = (itertools.product(range(vocab), repeat=k) if q is not None
              else [_deterministic(deterministic_draft, k)])
    for draft in drafts:
        weight = 1.0
        if q is not None:
            for i, x in enumerate(draft):
                weight *= float(q(draft[:i])[x])
        if weight == 0:
            continue
        target_probs = torch.stack([p(draft[:i]) for i in range(k + 1)])
        draft_probs = None if q is None else torch.stack([q(draft[:i]) for i in range(k)])
        accepts = [accept_prob(float(target_probs[i, x]),
                               1.0 if q is None else float(draft_probs[i, x]))
                   for i, x in enumerate(draft)]
        # Branch n: drafts 1..n accepted, draft n+1 rejected (or all k accepted when n == k).
        for n in range(k + 1):
            branch = weight
            for i in range(n):
                branch *= accepts[i]
            if n < k:
                branch *= 1 - accepts[n]
            if branch == 0:
                continue
            uniforms = torch.tensor([0.0] * n + [1.0] * (k - n), dtype=torch.float64)
            verdict = ms.verify(ms.Proposal.chain(list(draft), draft_probs), target_probs,
                                greedy=False, uniforms=uniforms)
            assert verdict.num_accepted == n
            assert verdict.tokens[:n] == list(draft[:n])
            for y in range(vocab):
                extend_with_target(p, tuple(draft[:n]) + (y,),
                                   branch * float(verdict.final_probs[y]), vocab, k + 1, law)
    return law


def _deterministic(draft_fn, k: int) -> tuple[int, ...]:
    draft: tuple[int, ...] = ()
    for _ in range(k):
        draft += (draft_fn(draft),)
    return draft


def max_law_error(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in keys)


def tree_law(p: Model, qs: list[Model], vocab: int, depth: int) -> dict[tuple[int, ...], float]:
    """Exact law of ``depth + 1`` tokens: ``ms.verify`` on a tree of ``len(qs)`` sampled drafts
    (``ms.Proposal.from_tree``), then the target."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    K = len(qs)
    for flat in itertools.product(range(vocab), repeat=K * depth):
        drafts = [flat[j * depth:(j + 1) * depth] for j in range(K)]
        weight = 1.0
        for j, draft in enumerate(drafts):
            for i, x in enumerate(draft):
                weight *= float(qs[j](draft[:i])[x])
        if weight == 0:
            continue
        tree = ms.DraftTree.from_drafts(drafts)
        paths = _node_paths(tree)
        target_probs = torch.stack([p(path) for path in paths])
        draft_probs = [torch.stack([qs[j](d[:i]) for i in range(depth)])
                       for j, d in enumerate(drafts)]
        proposal = ms.Proposal.from_tree(tree, draft_probs)
        max_tests = K * depth
        for pattern in itertools.product([0.0, 1.0], repeat=max_tests):
            verdict = ms.verify(proposal, target_probs, greedy=False, uniforms=list(pattern))
            used = len(verdict.accept_probs)
            if any(u != 0.0 for u in pattern[used:]):
                continue                   # count each real path once (canonical tail)
            branch = weight
            for u, a in zip(pattern[:used], verdict.accept_probs, strict=True):
                branch *= a if u == 0.0 else 1 - a
            if branch == 0:
                continue
            accepted = tuple(verdict.tokens[:-1])
            for y in range(vocab):
                extend_with_target(p, accepted + (y,), branch * float(verdict.final_probs[y]),
                                   vocab, depth + 1, law)
    return law


def _node_paths(tree: ms.DraftTree) -> list[tuple[int, ...]]:
    """The token path from the root to each node (the root's path is empty)."""
    paths: list[tuple[int, ...]] = [()]
    for node in range(1, len(tree)):
        paths.append(paths[tree.parents[node]] + (tree.tokens[node],))
    return paths


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit of ``counts`` to ``probs`` over the support of
    ``probs``.

    Raises AssertionError if a token outside the support was observed.
    """
    from scipy.stats import chisquare

    counts, probs = counts.double(), probs.double()
    support = probs > 0
    assert counts[~support].sum() == 0, "observed a token the distribution gives probability 0"
    expected = probs[support] / probs[support].sum() * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)
