"""Draft trees: what a drafter proposes in one round, chain or tree (SpecInfer, Stratos §2).

A round's guesses form a prefix tree over the last context token. Node ``0`` is the root; every
other node holds one draft token and hangs under the token it continues. A chain of ``k`` drafts
(Algorithm 1) is the tree with one child per node; several drafts of the same context share the
nodes of their common prefix (SpecInfer, Miao et al. 2024). The target scores every node in one
forward with tree attention
([`DraftTree.ancestor_mask`][minispec.core.tree.DraftTree.ancestor_mask]), and
[`verify`][minispec.core.speculative.verify] walks down the tree.

A [`Proposal`][minispec.core.tree.Proposal] adds *how* each node was drawn: at every node, the
proposals made there in draw order, each with the ``q`` it came from (or ``None`` for a one-hot
proposal), which is what the accept rule needs. This module is bookkeeping on token ids only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minispec.core.sampling import check_probs

__all__ = ["DraftTree", "Proposal", "TreeShape", "tree_size"]


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

        This is the tree-attention mask: node ``i`` may attend to exactly those nodes. A parent
        is numbered before its children, so its row is complete when a child copies it.
        """
        mask = torch.eye(len(self), dtype=torch.bool)                           # (N, N)
        for i in range(1, len(self)):
            mask[i] |= mask[self.parents[i]]          # the node itself, then its parent's ancestors
        return mask


class TreeShape:
    """A draft tree's shape that a drafter grows itself, instead of a fixed branching tuple.

    Subclasses (a dynamic tree, EAGLE-2's, in ``minispec.extra_drafters.dynamic``) say how deep
    they are (``len``), how many cache positions a round may store (``size``), how to cut
    themselves to depth ``k`` (``checked``) and how to grow (``grow``, called by a model drafter
    with the row, the root's logits and a function that scores one depth).
    """

    size: int = 1

    def __len__(self) -> int:
        raise NotImplementedError

    def checked(self, k: int) -> TreeShape:
        """This shape at depth ``k``; ``ValueError`` for a bad setting."""
        raise NotImplementedError

    def grow(self, seq, root, score, storage) -> Proposal:
        """The row's proposal, grown from ``root`` with ``score`` (see ``grow_levels``)."""
        raise NotImplementedError


def tree_size(branching: Sequence[int] | TreeShape) -> int:
    """Nodes of a full tree with this branching, the root included: ``1 + b1 + b1 b2 + ...``
    (depth ``t`` holds ``b1 ... bt`` nodes; the root's is the empty product, 1). For a
    [`TreeShape`][minispec.core.tree.TreeShape], the positions its round may store (its
    ``size``)."""
    if isinstance(branching, TreeShape):
        return branching.size
    return sum(math.prod(branching[:t]) for t in range(len(branching) + 1))


def _id(t: object) -> object:
    """A draft id as an ``int`` if it is a true integer (numpy's, a one-element integer tensor),
    else as it is: ``1.9`` and ``True`` are no token ids, and truncating them would hide it."""
    t = t.item() if isinstance(t, Tensor) and t.numel() == 1 else t
    return int(t) if hasattr(t, "__index__") and not isinstance(t, bool) else t   # no float has


@dataclass
class Proposal:
    """A draft tree and how it was drawn: what a drafter proposes in one round.

    A chain of ``k`` drafts is the tree with one child per node
    ([`Proposal.chain`][minispec.core.tree.Proposal.chain]).

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
    def chain(cls, tokens: Sequence[int] | Tensor, probs: Tensor | None = None,
              check: bool = True) -> Proposal:
        """The chain ``root -> tokens[0] -> tokens[1] ...`` (Algorithm 1's drafts).

        Args:
            tokens: ``[k]`` the drafts ``d_1..d_k``: integers (numpy's and one-element tensors
                become ``int``); anything else (``1.9``, ``True``) is kept as it is, so the
                round refuses the proposal and fails its request alone.
            probs: ``[k, V]`` row ``i`` is the ``q`` that ``d_{i+1}`` was drawn from, or ``None``
                for a deterministic drafter (one-hot ``q``).
            check: check that each ``q`` row is a distribution (``False``: a batched drafter
                leaves it to the round, which fails a bad row alone).
        """
        tokens = tokens.tolist() if isinstance(tokens, Tensor) else [_id(t) for t in tokens]
        k = len(tokens)
        if probs is not None:
            if probs.ndim != 2 or probs.shape[0] != k:
                raise ValueError(f"probs must be [k, V] with k = {k}, got {tuple(probs.shape)}")
            if check:
                check_probs(probs, "probs")
        draws = [[(i + 1, None if probs is None else probs[i])] for i in range(k)] + [[]]
        return cls.build(list(range(-1, k)), [-1, *tokens], draws)

    @classmethod
    def from_drafts(cls, drafts: Sequence[Sequence[int]],
                    draft_probs: Sequence[Tensor] | None = None) -> Proposal:
        """Several drafts of one context merged into a prefix tree
        ([`DraftTree.from_drafts`][minispec.core.tree.DraftTree.from_drafts]), each drawn from its
        own ``q`` rows (``draft_probs[j]``: ``[len(drafts[j]), V]``; ``None``: one-hot)."""
        return cls.from_tree(DraftTree.from_drafts(drafts), draft_probs)

    @classmethod
    def from_tree(cls, tree: DraftTree, draft_probs: Sequence[Tensor] | None = None) -> Proposal:
        """The draws of a tree built from drafts: at every node, each draft through it proposes
        its next token, in draft order (SpecInfer; a child two drafts share is drawn twice)."""
        if draft_probs is not None and len(draft_probs) != len(tree.draft_nodes):
            raise ValueError(f"got draft_probs for {len(draft_probs)} drafts, the tree has "
                             f"{len(tree.draft_nodes)}")
        draws: list[list[tuple[int, Tensor | None]]] = [[] for _ in range(len(tree))]
        for j, nodes in enumerate(tree.draft_nodes):
            q = None if draft_probs is None else draft_probs[j]
            if q is not None and (q.ndim != 2 or q.shape[0] != len(nodes)):
                raise ValueError(f"draft_probs[{j}] must be [{len(nodes)}, V], "
                                 f"got {tuple(q.shape)}")
            if q is not None:
                check_probs(q, f"draft_probs[{j}]")
            for depth, (parent, child) in enumerate(zip([0, *nodes], nodes, strict=False)):
                draws[parent].append((child, None if q is None else q[depth]))
        return cls(tree, draws, list(range(len(tree))))

    @classmethod
    def build(cls, parents: list[int], tokens: list[int],
              draws: list[list[tuple[int, Tensor | None]]]) -> Proposal:
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
