"""Several proposals at once: iterative speculative sampling and draft trees (Stratos §2, App. A).

Speculative sampling can be chained. If the draft ``q_1``'s proposal is rejected, the residual
``p_1 = norm(max(0, p - q_1))`` is itself a target we can speculate on with another proposal ``q_2``,
and so on; only after the last rejection do we sample from what is left. The token that comes out
still has law ``p`` (Stratos §2). SpecInfer (Miao et al. 2024) applies this at every node of a prefix
tree of drafts: the children of a node are the proposals, tried one after another.

For greedy decoding the tree is simpler (Stratos App. A): at each node the target's argmax is the only
acceptable child, so walking down while a child matches finds the longest accepted path.

The functions consume their random numbers in a fixed order (proposal after proposal, in draft
order) and report the acceptance probability of every test they made, so tests can enumerate every
branch exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minispec.sampling import one_hot, sample
from minispec.speculative import accepts, check_probs, residual

__all__ = ["DraftTree", "IterativeResult", "TreeVerdict", "iterative_speculative_sample", "verify_tree"]


def _uniform_stream(uniforms: Iterable[float] | None, generator: torch.Generator | None,
                    device: torch.device) -> Iterator[Tensor]:
    """Yield ``u ~ U[0, 1)`` one at a time, from ``uniforms`` when given, else from ``generator``."""
    if uniforms is not None:
        for u in uniforms:
            yield torch.as_tensor(float(u), device=device)
        raise ValueError("ran out of the uniforms that were passed in")
    while True:
        yield torch.rand((), generator=generator, device=device)


def _try_proposals(p: Tensor, proposals: Sequence[tuple[int, Tensor | None]],
                   us: Iterator[Tensor], accept_probs: list[float]) -> tuple[int | None, Tensor]:
    """Iterative speculative sampling over ``proposals`` (token ``x_j`` drawn from ``q_j``).

    Returns ``(index of the accepted proposal or None, distribution left after the rejections)``.
    ``q_j = None`` means a one-hot proposal (a deterministic drafter).
    """
    for j, (x, q) in enumerate(proposals):
        q = one_hot(torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype) if q is None else q
        if q[x] <= 0:
            raise ValueError(f"proposal {j} is token {x} but its q gives it probability 0")
        accept_probs.append(min(1.0, float(p[x] / q[x])))
        if accepts(next(us), p[x], q[x]):
            return j, p
        p = residual(p, q)          # speculate on what the target has left: p_j ∝ max(0, p_{j-1} - q_j)
    return None, p


@dataclass(frozen=True)
class IterativeResult:
    """Outcome of [`iterative_speculative_sample`][minispec.tree.iterative_speculative_sample].

    Attributes:
        token: the emitted token (law ``p``).
        accepted_index: which proposal was accepted, or ``None`` if all were rejected.
        final_probs: ``[V]`` the residual the token was drawn from after all rejections (or the
            ``p_{j-1}`` the accepted proposal was tested against).
        accept_probs: ``min(1, p_{j-1}(x_j) / q_j(x_j))`` for each proposal tested, in order.
    """

    token: int
    accepted_index: int | None
    final_probs: Tensor
    accept_probs: list[float]


def iterative_speculative_sample(
    p: Tensor,
    qs: Tensor,
    generator: torch.Generator | None = None,
    *,
    proposals: Sequence[int] | None = None,
    uniforms: Iterable[float] | None = None,
) -> IterativeResult:
    """Iterative speculative sampling with proposals ``q_1..q_K`` (Stratos §2).

    Args:
        p: ``[V]`` target distribution.
        qs: ``[K, V]`` proposal distributions (they may repeat).
        generator: random stream.
        proposals: ``[K]`` tokens ``x_j ~ q_j`` already drawn (drawn here when ``None``).
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        An [`IterativeResult`][minispec.tree.IterativeResult] whose token has law ``p``.
    """
    if p.ndim != 1 or qs.ndim != 2 or qs.shape[1] != p.shape[0]:
        raise ValueError(f"expected p [V] and qs [K, V], got {tuple(p.shape)} and {tuple(qs.shape)}")
    check_probs(p, "p")
    check_probs(qs, "qs")
    if proposals is None:
        proposals = [int(sample(q, generator)) for q in qs]
    if len(proposals) != qs.shape[0]:
        raise ValueError(f"got {len(proposals)} proposals for {qs.shape[0]} distributions")
    accept_probs: list[float] = []
    us = _uniform_stream(uniforms, generator, p.device)
    j, left = _try_proposals(p, list(zip(proposals, qs, strict=True)), us, accept_probs)
    token = proposals[j] if j is not None else int(sample(left, generator))
    return IterativeResult(token, j, left, accept_probs)


@dataclass
class DraftTree:
    """A prefix tree built from several drafts that continue the same context.

    Node ``0`` is the root (the last context token); node ``i > 0`` holds ``tokens[i]`` and hangs
    under ``parents[i]``. Nodes are numbered in depth-first order, the order SpecInfer feeds them to
    the target with tree attention. Drafts that share a prefix share its nodes.

    Attributes:
        tokens: ``[N]`` token of each node (``-1`` for the root).
        parents: ``[N]`` parent of each node (``-1`` for the root).
        draft_nodes: for each draft, the node of each of its tokens.
    """

    tokens: list[int] = field(default_factory=lambda: [-1])
    parents: list[int] = field(default_factory=lambda: [-1])
    draft_nodes: list[list[int]] = field(default_factory=list)

    @classmethod
    def from_drafts(cls, drafts: Sequence[Sequence[int]]) -> DraftTree:
        """Merge ``drafts`` (token lists) into a prefix tree numbered depth-first."""
        if not drafts:
            raise ValueError("need at least one draft")
        # Build a nested dict trie, then number it depth-first.
        trie: dict = {}
        for draft in drafts:
            level = trie
            for token in draft:
                level = level.setdefault(int(token), {})
        tree = cls()
        numbering: dict[tuple[int, ...], int] = {(): 0}

        def visit(level: dict, path: tuple[int, ...]) -> None:
            for token, children in level.items():
                numbering[path + (token,)] = len(tree.tokens)
                tree.tokens.append(token)
                tree.parents.append(numbering[path])
                visit(children, path + (token,))

        visit(trie, ())
        tree.draft_nodes = [[numbering[tuple(int(t) for t in d[: i + 1])] for i in range(len(d))]
                            for d in drafts]
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Child nodes of ``node``, in numbering order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def ancestor_mask(self) -> Tensor:
        """``[N, N]`` bool: ``mask[i, j]`` iff node ``j`` is node ``i`` or one of its ancestors.

        This is the tree-attention mask: node ``i`` may attend to exactly those nodes.
        """
        n = len(self)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j != -1:
                mask[i, j] = True
                j = self.parents[j]
        return mask


@dataclass(frozen=True)
class TreeVerdict:
    """Outcome of [`verify_tree`][minispec.tree.verify_tree].

    Attributes:
        tokens: accepted path tokens, then one token drawn at the last node reached.
        path: the accepted nodes (excluding the root).
        final_probs: ``[V]`` the distribution the last token was drawn from.
        accept_probs: acceptance probability of each test made, in order (sampled mode).
    """

    tokens: list[int]
    path: list[int]
    final_probs: Tensor
    accept_probs: list[float]

    @property
    def num_accepted(self) -> int:
        """How many draft tokens were accepted (the depth of the accepted path)."""
        return len(self.path)


def verify_tree(
    tree: DraftTree,
    target_probs: Tensor,
    draft_probs: Sequence[Tensor] | None = None,
    generator: torch.Generator | None = None,
    *,
    greedy: bool | None = None,
    uniforms: Iterable[float] | None = None,
) -> TreeVerdict:
    """Verify a tree of drafts against the target: SpecInfer's rule, or greedy (Stratos §2.1, App. A).

    Args:
        tree: the prefix tree of the drafts
            ([`DraftTree.from_drafts`][minispec.tree.DraftTree.from_drafts]).
        target_probs: ``[N, V]`` row ``i`` is ``p(. | context, path to node i)``; row 0 is the
            root, i.e. the target's next-token distribution after the context.
        draft_probs: for each draft ``j``, ``[len(draft_j), V]``: row ``t`` is the distribution its
            token ``t`` was drawn from; ``None`` means one-hot proposals (deterministic drafters).
        generator: random stream.
        greedy: exact-match mode (walk down while a child is the target's argmax); ``None`` picks
            it when every target row is one-hot.
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        A [`TreeVerdict`][minispec.tree.TreeVerdict]. In sampled mode the emitted tokens have the
        target's law; in greedy mode they are the target's greedy continuation, with the longest
        accepted path.
    """
    n = len(tree)
    if target_probs.ndim != 2 or target_probs.shape[0] != n:
        raise ValueError(f"target_probs must be [N, V] with N = {n} tree nodes, got {tuple(target_probs.shape)}")
    check_probs(target_probs, "target_probs")
    if draft_probs is not None:
        if len(draft_probs) != len(tree.draft_nodes):
            raise ValueError(f"got draft_probs for {len(draft_probs)} drafts, the tree has {len(tree.draft_nodes)}")
        for j, (q, nodes) in enumerate(zip(draft_probs, tree.draft_nodes, strict=True)):
            if q.shape != (len(nodes), target_probs.shape[1]):
                raise ValueError(f"draft_probs[{j}] must be [{len(nodes)}, V], got {tuple(q.shape)}")
            check_probs(q, f"draft_probs[{j}]")
    if greedy is None:
        greedy = bool((target_probs.amax(dim=-1) == 1).all())

    node, depth, path, accept_probs = 0, 0, [], []
    us = _uniform_stream(uniforms, generator, target_probs.device)
    while True:
        p = target_probs[node]
        # The proposals at this node: every draft passing through it that has a token at `depth`.
        through = [j for j, nodes in enumerate(tree.draft_nodes)
                   if len(nodes) > depth and (depth == 0 or nodes[depth - 1] == node)]
        if greedy:
            best = int(p.argmax())
            child = next((tree.draft_nodes[j][depth] for j in through
                          if tree.tokens[tree.draft_nodes[j][depth]] == best), None)
            if child is None:
                point = one_hot(torch.tensor(best, device=p.device), p.shape[-1]).to(p.dtype)
                return TreeVerdict([tree.tokens[i] for i in path] + [best], path, point, [])
        else:
            proposals = [(tree.tokens[tree.draft_nodes[j][depth]],
                          None if draft_probs is None else draft_probs[j][depth]) for j in through]
            chosen, p = _try_proposals(p, proposals, us, accept_probs)
            if chosen is None:
                token = int(sample(p, generator))
                return TreeVerdict([tree.tokens[i] for i in path] + [token], path, p, accept_probs)
            child = tree.draft_nodes[through[chosen]][depth]
        path.append(child)
        node, depth = child, depth + 1
