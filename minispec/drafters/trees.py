"""Draft *trees* (SpecInfer, EAGLE-2): what the drafters share to draw them.

``branching = (3, 2, 1, 1)`` means: 3 children of the root (the last context token), 2 children of
each of those, then single children -- a tree of depth ``k = 4`` with 3 + 6 + 6 + 6 = 21 nodes. The
target scores the whole tree in one forward and [`verify`][minispec.core.speculative.verify] walks
down it, in the same round as a chain ([`minispec.decoding.runner`][minispec.decoding.runner]).

How children are chosen, and which ``q`` each one carries (``q`` must be the distribution a token
was actually drawn from, or verification is not exact):

* **greedy** (temperature 0): the top-``b`` tokens of the drafter at the node, distinct. The target
  accepts a child only if it is its own argmax, so any choice is exact (Stratos App. A).
* **sampled**, draft model or EAGLE head: ``b`` tokens drawn **independently, with replacement**
  from ``q(. | node)`` (SpecInfer's expansion), tried one after another at every node by
  [`verify`][minispec.core.speculative.verify] (Stratos §2). Equal draws share one child node but
  are each tried (a repeated proposal is exact; dropping it is not).
* **chosen**, not drawn (an n-gram table's most frequent continuations; a dynamic tree's likeliest
  children): ``q`` is one-hot (``None``), and iterative sampling with one-hot proposals stays
  exact.

[`grow_tree`][minispec.drafters.trees.grow_tree] grows a tree by a rule (a context drafter's
continuations), [`grow_levels`][minispec.drafters.trees.grow_levels] with a model, one forward per
depth (the draft model and the EAGLE head). A [`TreeShape`][minispec.core.tree.TreeShape] grows
itself (EAGLE-2's dynamic tree, in ``minispec.extra_drafters.dynamic``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.core.constraint import ask
from minispec.core.sampling import (
    apply_repetition_penalty,
    is_int,
    non_finite,
    probs_for_rows,
    sample,
)
from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal, TreeShape, tree_size
from minispec.models.llama import TreeAttention

__all__ = ["MAX_TREE_NODES", "check_branching", "choose_children", "feed_level", "grow_levels",
           "grow_tree"]

#: The most nodes (root included) a draft tree may have. The target scores every node in one
#: forward and published trees use tens to a few hundred nodes, so a larger tree costs more than it
#: can gain; something like ``branching=(3000,)`` is a mistake, refused before any drafting.
MAX_TREE_NODES = 1024


def check_branching(branching, k: int) -> tuple[int, ...] | TreeShape:
    """``branching`` as a tuple of ``k`` integers >= 1 (padded with 1s: chains; cut to ``k``), or
    a [`TreeShape`][minispec.core.tree.TreeShape] at depth ``k`` (it checks itself).

    Raises:
        ValueError: naming ``branching``: not a non-empty sequence of integers >= 1 (nor a valid
            tree shape), or a tree of more than ``MAX_TREE_NODES`` nodes (counted by
            ``tree_size`` after the cut to ``k``).
    """
    if isinstance(branching, TreeShape):
        checked = branching.checked(k)
    else:
        try:
            values = tuple(branching)
        except TypeError:  # an int, None, ...
            values = ()
        if not values or not all(is_int(b) and b >= 1 for b in values):
            raise ValueError("branching must be a non-empty tuple of integers >= 1 or a "
                             f"tree shape (ms.DynamicTree), got {branching!r}")
        checked = (values + (1,) * k)[:k]
    if (nodes := tree_size(checked)) > MAX_TREE_NODES:
        raise ValueError(f"branching={branching!r} with k={k} makes a tree of {nodes} nodes; "
                         f"at most MAX_TREE_NODES={MAX_TREE_NODES} are allowed")
    return checked


def grow_tree(root: int, branching: tuple[int, ...], state: Any,
              children: Callable[[int, Any, int], Any],
              fed: Callable[[list[int], list[int], list[int], int], None] | None = None
              ) -> Proposal:
    """A tree, breadth-first: ``children(node, state, b)`` gives up to ``b`` triples ``(token, q,
    its state)`` below node ``node`` in state ``state`` (``q``: the distribution ``token`` was
    drawn from, ``None`` for a deterministic drafter's one-hot); the root (token ``root``) has
    state ``state``. Equal draws below one node share a child node, each draw kept (module
    docstring). After every depth ``t`` but the last, ``fed(frontier, parents, tokens, t)`` is
    told the new nodes (a cached drafter scores them)."""
    parents, tokens, draws, states = [-1], [root], [[]], [state]
    frontier = [0]
    for depth, b in enumerate(branching, start=1):
        first = len(tokens)                                  # this depth's nodes: first..
        for node in frontier:
            for token, q, child_state in children(node, states[node], b):
                child = next((c for c, _ in draws[node] if tokens[c] == token), len(tokens))
                if child == len(tokens):             # a new token below this node: a new child
                    parents.append(node)
                    tokens.append(token)
                    draws.append([])
                    states.append(child_state)
                draws[node].append((child, q))
        frontier = list(range(first, len(tokens)))
        if fed is not None and depth < len(branching):
            fed(frontier, parents, tokens, depth)
    return Proposal.build(parents, tokens, draws)


def grow_levels(seq: Sequence, branching: tuple[int, ...], root: tuple[Tensor, int],
                score: Callable[..., Tensor], storage: dict[int, int]) -> Proposal:
    """A tree expanded with a model, one forward per depth: every frontier node gets ``b``
    children ([`choose_children`][minispec.drafters.trees.choose_children]); then, unless it is the
    last depth, the new nodes are scored in ONE forward with tree attention.

    Args:
        seq: the row (its context, sampling and generator).
        branching: children per node at each depth.
        root: the drafter's logits at the root ``(1, V)`` and ``start``, the positions its cache
            holds; node ``i`` (creation order) is stored past them and sees them plus its own fed
            ancestors.
        score: ``score(frontier, parents, ids, positions, tree)`` -> logits ``(F, V)`` of the
            frontier nodes, ``ids`` ``(1, F)`` at RoPE ``positions`` ``(1, F)``.
        storage: filled with created node -> cache position, for the nodes fed.
    """
    logits, start = root                            # (1, V); cache positions held
    rows = {0: logits[0]}                           # node -> the drafter's logits there (V,)
    return grow_tree(seq.context[-1], branching, [],
                     lambda node, path, b: choose_children(seq, rows[node], path, b),
                     functools.partial(feed_level, score, storage, rows, start))


def choose_children(seq: Sequence, logits: Tensor, path: list[int], b: int
                    ) -> list[tuple[int, Tensor | None, list[int]]]:
    """``b`` children of the node at ``path`` (below the root): greedy top-b (q None; after the
    repetition penalty the target applies too, as a greedy chain drafts the penalised argmax),
    else b i.i.d. draws from q; each as ``(token, q, its path)``. NaN logits fail the request."""
    if non_finite(logits):
        raise ValueError("draft logits contain NaN or +inf")
    mask = ask(seq, "mask", path)                                 # a grammar's, or None: all
    if seq.sampling.greedy:
        if not seq.sampling.raw_argmax:
            logits = apply_repetition_penalty(logits, seq.context + path,
                                              seq.sampling.repetition_penalty)
        if mask is not None:                        # only allowed children, as many as there are
            logits, b = logits.masked_fill(~mask, float("-inf")), min(b, int(mask.sum()))
        return [(int(t), None, path + [int(t)]) for t in logits.topk(b).indices]
    q = probs_for_rows(logits[None], [seq.sampling], [seq.context + path], [mask])[0]   # (V,)
    return [(t, q, path + [t]) for t in [int(sample(q, seq.generator)) for _ in range(b)]]


def feed_level(score: Callable[..., Tensor], storage: dict[int, int], rows: dict[int, Tensor],
                start: int, frontier: list[int], parents: list[int], tokens: list[int],
                depth: int) -> None:
    """Feed the nodes of ``depth`` at RoPE position ``start + depth - 1``; each sees the
    committed ``start`` positions and its fed ancestors. The logits at each node ``(V,)`` go to
    ``rows``."""
    first = start + len(storage)
    storage.update({node: first + i for i, node in enumerate(frontier)})
    # (1, F, W): may node f see tree position start + w (W: the nodes stored so far)
    mask = torch.zeros(1, len(frontier), len(storage), dtype=torch.bool)
    for row, node in enumerate(frontier):
        while node != 0:                            # the node and its fed ancestors
            mask[0, row, storage[node] - start] = True
            node = parents[node]
    device = rows[0].device
    stored = torch.arange(first, first + len(frontier), device=device)[None]         # (1, F)
    tree = TreeAttention(stored, torch.tensor([start], device=device), mask.to(device))
    ids = torch.tensor([[tokens[node] for node in frontier]], device=device)          # (1, F)
    positions = torch.full_like(ids, start + depth - 1)                               # (1, F)
    rows.update(zip(frontier, score(frontier, parents, ids, positions, tree), strict=True))
