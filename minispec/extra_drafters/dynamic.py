"""EAGLE-2's dynamic draft tree: a tree shaped by the drafter's confidence, not a fixed branching.

A [`DynamicTree`][minispec.extra_drafters.dynamic.DynamicTree] is a
[`TreeShape`][minispec.core.tree.TreeShape]: given where a fixed branching tuple goes
(``branching=``), a model drafter (the draft model, an EAGLE head) grows it with
[`grow_dynamic`][minispec.extra_drafters.dynamic.grow_dynamic], one forward per depth, through the
same tree machinery as a fixed tree ([`minispec.drafters.trees`][minispec.drafters.trees]).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from minispec.core.sampling import is_int, is_real, non_finite
from minispec.core.sequence import Sequence
from minispec.core.theory import best_tree_size
from minispec.core.tree import Proposal, TreeShape
from minispec.drafters.trees import feed_level

__all__ = ["DynamicTree", "grow_dynamic"]


@dataclass(frozen=True)
class DynamicTree(TreeShape):
    """A draft tree shaped by the drafter's confidence (EAGLE-2), not by a fixed branching.

    Expansion: the root gets its ``top_k`` likeliest children; at every further depth the
    ``top_k`` nodes of the depth above with the highest *value* (the product of the draft
    probabilities along their path: EAGLE-2's estimate of the chance the target accepts them) are
    scored, ``top_k`` children each. Then the ``nodes`` nodes of highest value are verified -- or
    fewer, as many as pay for their verify cost
    ([`best_tree_size`][minispec.core.theory.best_tree_size]). The children are chosen, not
    drawn, so each carries a one-hot ``q``: exact for sampling as for greedy.

    Used where a branching is (``branching=``): ``len`` is its depth and ``shape[:k]`` cuts it to
    depth ``k``, as for a tuple.

    Attributes:
        top_k: children per expanded node, and nodes expanded per depth.
        nodes: the most draft nodes verified (the root not counted).
        depth: draft depth (the round's ``k``; set by the loop).
        verify_cost: ``r(T)``, the cost of verifying ``T`` tokens in one target forward over one
            step, for ``T = 1, 2, ..`` (a device's measured curve); ``None``: verification is free,
            so all ``nodes`` are kept.
        draft_cost: one draft forward's cost over one target step (``c``).
    """

    top_k: int = 4
    nodes: int = 16
    depth: int = 4
    verify_cost: tuple[float, ...] | None = None
    draft_cost: float = 0.0

    def __len__(self) -> int:
        return self.depth

    def __getitem__(self, cut: slice) -> DynamicTree:
        return dataclasses.replace(self, depth=len(range(self.depth)[cut]))

    @property
    def size(self) -> int:
        """The positions its round may store in either cache: its nodes, or the nodes a drafter
        feeds while expanding, whichever is more (the root included)."""
        return 1 + max(self.nodes, (self.depth - 1) * self.top_k)

    def checked(self, k: int) -> DynamicTree:
        """This tree at depth ``k``; ``ValueError`` unless ``top_k`` and ``nodes`` are integers
        >= 1, ``draft_cost`` a finite number >= 0 and ``verify_cost`` None or positive numbers."""
        checked, cost = dataclasses.replace(self, depth=k), self.verify_cost
        if not (is_int(checked.top_k) and checked.top_k >= 1 and is_int(checked.nodes)
                and checked.nodes >= 1 and is_real(checked.draft_cost) and checked.draft_cost >= 0
                and (cost is None or (len(cost) >= 1 and all(is_real(r) and r > 0 for r in cost)))):
            raise ValueError(f"a DynamicTree needs top_k and nodes integers >= 1, a finite "
                             f"draft_cost >= 0 and verify_cost None or positive numbers, got "
                             f"{checked!r}")
        return checked

    def grow(self, seq: Sequence, root: tuple[Tensor, int], score: Callable[..., Tensor],
             storage: dict[int, int]) -> Proposal:
        """[`grow_dynamic`][minispec.extra_drafters.dynamic.grow_dynamic] on this shape."""
        return grow_dynamic(seq, self, root, score, storage)


def grow_dynamic(seq: Sequence, shape: DynamicTree, root: tuple[Tensor, int],
                 score: Callable[..., Tensor], storage: dict[int, int]) -> Proposal:
    """A tree expanded by confidence (EAGLE-2,
    [`DynamicTree`][minispec.extra_drafters.dynamic.DynamicTree]): every depth scores its
    ``top_k`` nodes of highest value in one forward, each gets its ``top_k`` likeliest children;
    then the nodes of highest value are kept, as many as pay (``best_tree_size``). Arguments as
    [`grow_levels`][minispec.drafters.trees.grow_levels]."""
    logits, start = root                                    # (1, V); cache positions held
    rows = {0: logits[0]}                                   # node -> the drafter's logits (V,)
    parents, tokens, values = [-1], [seq.context[-1]], [0.0]        # values: log confidence
    frontier = [0]
    for depth in range(1, shape.depth + 1):
        first = len(tokens)                     # this depth's nodes: first..; the best go on
        for node in frontier:
            if non_finite(rows[node]):
                raise ValueError("draft logits contain NaN or +inf")
            top = torch.log_softmax(rows[node].float(), dim=-1).topk(shape.top_k)
            parents += [node] * shape.top_k                 # its top_k likeliest children
            tokens += top.indices.tolist()
            values += [values[node] + log_q for log_q in top.values.tolist()]
        frontier = sorted(range(first, len(tokens)), key=lambda i: -values[i])[: shape.top_k]
        if depth < shape.depth:
            feed_level(score, storage, rows, start, frontier, parents, tokens, depth)
    ranked = sorted(range(1, len(tokens)), key=lambda i: (-values[i], i))[: shape.nodes]
    n = best_tree_size([math.exp(values[i]) for i in ranked], shape.verify_cost,
                       shape.draft_cost * shape.depth)
    kept = [0] + sorted(ranked[:n])              # a parent's value is at least its child's
    index = {node: i for i, node in enumerate(kept)}
    draws = [[(index[c], None) for c in kept if parents[c] == node] for node in kept]
    proposal = Proposal.build([-1] + [index[parents[c]] for c in kept[1:]],
                              [tokens[c] for c in kept], draws)
    proposal.created = [kept[i] for i in proposal.created]     # the drafter's own numbering
    return proposal
