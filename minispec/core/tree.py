"""Several proposals at once: iterative speculative sampling and draft trees (Stratos §2, App. A).

Speculative sampling can be chained. If the draft ``q_1``'s proposal is rejected, the residual
``p_1 = norm(max(0, p - q_1))`` is itself a target we can speculate on with another proposal
``q_2``, and so on; only after the last rejection do we sample from what is left. The token that
comes out still has law ``p`` (Stratos §2). SpecInfer (Miao et al. 2024) applies this at every node
of a prefix tree of drafts: the children of a node are the proposals, tried one after another.

For greedy decoding the tree is simpler (Stratos App. A): at each node the target's argmax is the
only acceptable child, so walking down while a child matches finds the longest accepted path.

The functions consume their random numbers in a fixed order (proposal after proposal, in draft
order) and report the acceptance probability of every test they made, so tests can enumerate every
branch exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minispec.core.sampling import one_hot, sample
from minispec.core.speculative import accepts, check_probs, residual

__all__ = ["DraftTree", "IterativeResult", "TreeProposal", "TreeVerdict",
           "iterative_speculative_sample", "tree_size", "verify_proposal", "verify_tree",
           "walk_greedy"]


def _uniform_stream(uniforms: Iterable[float] | None, generator: torch.Generator | None,
                    device: torch.device) -> Iterator[Tensor]:
    """Yield ``u ~ U[0, 1)`` one at a time, from ``uniforms`` when given, else from
    ``generator``."""
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
        p = residual(p, q)  # speculate on what the target has left: p_j ∝ max(0, p_{j-1} - q_j)
    return None, p


@dataclass(frozen=True)
class IterativeResult:
    """Outcome of [`iterative_speculative_sample`][minispec.core.tree.iterative_speculative_sample].

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


def iterative_speculative_sample(p: Tensor, qs: Tensor, generator: torch.Generator | None = None,
                                 *, proposals: Sequence[int] | None = None,
                                 uniforms: Iterable[float] | None = None) -> IterativeResult:
    """Iterative speculative sampling with proposals ``q_1..q_K`` (Stratos §2).

    Args:
        p: ``[V]`` target distribution.
        qs: ``[K, V]`` proposal distributions (they may repeat).
        generator: random stream.
        proposals: ``[K]`` tokens ``x_j ~ q_j`` already drawn (drawn here when ``None``).
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        An [`IterativeResult`][minispec.core.tree.IterativeResult] whose token has law ``p``.
    """
    if p.ndim != 1 or qs.ndim != 2 or qs.shape[1] != p.shape[0]:
        raise ValueError(f"expected p [V] and qs [K, V], got {tuple(p.shape)} and "
                         f"{tuple(qs.shape)}")
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
    """Outcome of [`verify_tree`][minispec.core.tree.verify_tree].

    Attributes:
        tokens: accepted path tokens, then one token drawn at the last node reached.
        path: the accepted nodes (excluding the root).
        final_probs: ``[V]`` the distribution the last token was drawn from.
        accept_probs: acceptance probability of each test made, in order (sampled mode).
    """

    tokens: list[int]
    path: list[int]
    final_probs: Tensor | None
    accept_probs: list[float]

    @property
    def num_accepted(self) -> int:
        """How many draft tokens were accepted (the depth of the accepted path)."""
        return len(self.path)


def verify_tree(tree: DraftTree, target_probs: Tensor, draft_probs: Sequence[Tensor] | None = None,
                generator: torch.Generator | None = None, *, greedy: bool | None = None,
                uniforms: Iterable[float] | None = None) -> TreeVerdict:
    """Verify a tree of drafts against the target: SpecInfer's rule, or greedy (Stratos §2.1,
    App. A).

    Args:
        tree: the prefix tree of the drafts
            ([`DraftTree.from_drafts`][minispec.core.tree.DraftTree.from_drafts]).
        target_probs: ``[N, V]`` row ``i`` is ``p(. | context, path to node i)``; row 0 is the
            root, i.e. the target's next-token distribution after the context.
        draft_probs: for each draft ``j``, ``[len(draft_j), V]``: row ``t`` is the distribution its
            token ``t`` was drawn from; ``None`` means one-hot proposals (deterministic drafters).
        generator: random stream.
        greedy: exact-match mode (walk down while a child is the target's argmax); ``None`` picks
            it when every target row is one-hot.
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        A [`TreeVerdict`][minispec.core.tree.TreeVerdict]. In sampled mode the emitted tokens have
        the target's law; in greedy mode they are the target's greedy continuation, with the longest
        accepted path.
    """
    n, V = len(tree), target_probs.shape[-1]
    if target_probs.ndim != 2 or target_probs.shape[0] != n:
        raise ValueError(f"target_probs must be [N, V] with N = {n} tree nodes, "
                         f"got {tuple(target_probs.shape)}")
    if draft_probs is not None:
        if len(draft_probs) != len(tree.draft_nodes):
            raise ValueError(f"got draft_probs for {len(draft_probs)} drafts, the tree has "
                             f"{len(tree.draft_nodes)}")
        for j, (q, nodes) in enumerate(zip(draft_probs, tree.draft_nodes, strict=True)):
            if q.shape != (len(nodes), V):
                raise ValueError(f"draft_probs[{j}] must be [{len(nodes)}, V], "
                                 f"got {tuple(q.shape)}")
            check_probs(q, f"draft_probs[{j}]")
    draws: list[list[tuple[int, Tensor | None]]] = [[] for _ in range(n)]
    for j, nodes in enumerate(tree.draft_nodes):  # every draft proposes its next token at a node
        for depth, child in enumerate(nodes):
            parent = nodes[depth - 1] if depth else 0
            draws[parent].append((child, None if draft_probs is None else draft_probs[j][depth]))
    proposal = TreeProposal(tree, draws)
    return verify_proposal(proposal, target_probs, generator, greedy=greedy, uniforms=uniforms)


def verify_proposal(proposal: TreeProposal, target_probs: Tensor,
                    generator: torch.Generator | None = None, *, greedy: bool | None = None,
                    uniforms: Iterable[float] | None = None) -> TreeVerdict:
    """Walk down a draft tree: the accept rule the decoding round runs on a tree (SpecInfer).

    At each node the draws made there are tried in draw order by iterative speculative sampling
    (each against what the target has left after the earlier rejections); the first accepted
    one is the next node. When every draw is rejected (or the node is a leaf) the last token is
    drawn from what is left -- the emitted tokens have the target's law (Stratos §2). Greedy: the
    child whose token is the target's argmax, until there is none; then that argmax.

    Args:
        proposal: the tree and, per node, its draws ``(child, q)`` (``q = None``: one-hot).
        target_probs: ``[N, V]`` the target's distribution at every node (row 0: the root).
        generator: random stream for the uniforms and the last draw.
        greedy: exact-match mode; ``None`` picks it when every target row is one-hot.
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        A [`TreeVerdict`][minispec.core.tree.TreeVerdict]: the accepted path and its tokens, plus
        one more token.
    """
    check_probs(target_probs, "target_probs")
    tokens = proposal.tree.tokens
    if greedy is None:
        greedy = bool((target_probs.amax(dim=-1) == 1).all())
    if greedy:                              # exact match: argmaxes only, nothing is drawn
        verdict = walk_greedy(proposal, target_probs.argmax(dim=-1).tolist())
        last = torch.tensor(verdict.tokens[-1], device=target_probs.device)
        point = one_hot(last, target_probs.shape[-1]).to(target_probs.dtype)
        return TreeVerdict(verdict.tokens, verdict.path, point, [])
    node, path, accept_probs = 0, [], []
    us = _uniform_stream(uniforms, generator, target_probs.device)
    while True:
        draws = proposal.draws[node]        # try the draws made here, against what p has left
        chosen, p = _try_proposals(target_probs[node], [(tokens[c], q) for c, q in draws], us,
                                   accept_probs)
        if chosen is None:                  # every draw rejected (or a leaf): sample what is left
            last = int(sample(p, generator))
            return TreeVerdict([tokens[i] for i in path] + [last], path, p, accept_probs)
        node = draws[chosen][0]
        path.append(node)


def walk_greedy(proposal: TreeProposal, target_argmax: Sequence[int]) -> TreeVerdict:
    """Greedy verification of a proposal (Stratos App. A): from the root, step to the child whose
    token is the target's argmax while there is one; then emit that argmax.

    Args:
        proposal: the tree (a chain is a tree too).
        target_argmax: ``[N]`` the target's argmax at every node.

    Returns:
        A [`TreeVerdict`][minispec.core.tree.TreeVerdict] (no distributions: ``final_probs`` is
        ``None``): the longest path of the target's own greedy tokens, plus its next one.
    """
    tokens, node, path = proposal.tree.tokens, 0, []
    while (child := next((c for c, _ in proposal.draws[node]
                          if tokens[c] == target_argmax[node]), None)) is not None:
        path.append(child)
        node = child
    return TreeVerdict([tokens[i] for i in path] + [target_argmax[node]], path, None, [])


def tree_size(branching: Sequence[int]) -> int:
    """Nodes of a full tree with this branching, the root included: ``1 + b1 + b1 b2 + ...``
    (depth ``t`` holds ``b1 ... bt`` nodes; the root's is the empty product, 1)."""
    return sum(math.prod(branching[:t]) for t in range(len(branching) + 1))


@dataclass
class TreeProposal:
    """A draft tree and how it was drawn: what a drafter proposes in one round.

    A chain of ``k`` drafts is the tree with one child per node
    ([`TreeProposal.chain`][minispec.core.tree.TreeProposal.chain]).

    Attributes:
        tree: the nodes, depth-first (node 0 = root = last context token); ``draft_nodes`` holds
            the root-to-leaf paths.
        draws: for each node, the proposals tried at it, in draw order: ``(child node, q)`` with
            ``q`` the ``[V]`` distribution the child was drawn from, or ``None`` (one-hot: greedy
            or deterministic). A child drawn twice appears twice.
        created: for each node, its index in creation (breadth-first) order, the drafter's own.
    """

    tree: DraftTree
    draws: list[list[tuple[int, Tensor | None]]]
    created: list[int] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Length of the longest root-to-leaf path (a chain's ``k``)."""
        return max((len(p) for p in self.tree.draft_nodes), default=0)

    def depths(self) -> list[int]:
        """The depth of every node (the root's is 0): its RoPE offset from the last token."""
        depth = [0] * len(self.tree)
        for i in range(1, len(self.tree)):
            depth[i] = depth[self.tree.parents[i]] + 1
        return depth

    def main_chain(self, path: list[int]) -> list[int]:
        """For traces: the accepted tokens, then the first draw at each node below."""
        chain = [self.tree.tokens[i] for i in path]
        node = path[-1] if path else 0
        while self.draws[node]:
            node = self.draws[node][0][0]
            chain.append(self.tree.tokens[node])
        return chain

    @property
    def is_chain(self) -> bool:
        """Whether every node has at most one draw (Algorithm 1's case)."""
        return all(len(d) <= 1 for d in self.draws)

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int], probs: Tensor | None = None) -> TreeProposal:
        """The chain ``root -> tokens[0] -> tokens[1] ...``; ``probs`` ``[k, V]`` or ``None``."""
        k = len(tokens)
        tree = DraftTree([root, *tokens], list(range(-1, k)), [list(range(1, k + 1))] if k else [])
        draws = [[(i + 1, None if probs is None else probs[i])] for i in range(k)] + [[]]
        return cls(tree, draws, list(range(k + 1)))

    @classmethod
    def build(cls, parents: list[int], tokens: list[int],
              draws: list[list[tuple[int, Tensor | None]]]) -> TreeProposal:
        """Renumber nodes made breadth-first (``parents[i] < i``) depth-first."""
        children: list[list[int]] = [[] for _ in parents]
        for i, parent in enumerate(parents[1:], start=1):
            children[parent].append(i)
        order, stack = [], [0]
        while stack:                                  # depth-first, children in creation order
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(children[node]))
        new = {old: i for i, old in enumerate(order)}
        tree = DraftTree([tokens[o] for o in order], [-1] + [new[parents[o]] for o in order[1:]])
        paths = [[]]                                  # each node's path from the root
        for i in range(1, len(order)):                # a parent comes before its children
            paths.append(paths[tree.parents[i]] + [i])
        tree.draft_nodes = [paths[i] for i, o in enumerate(order) if not children[o] and i > 0]
        remapped = [[(new[c], q) for c, q in draws[o]] for o in order]
        return cls(tree, remapped, order)
