"""Drafters that propose a *tree* of drafts with a static branching per depth (SpecInfer, EAGLE-2).

``branching = (3, 2, 1, 1)`` means: 3 children of the root (the last context token), 2 children of
each of those, then single children -- a tree of depth ``k = 4`` with 3 + 6 + 6 + 6 = 21 nodes. The
target scores the whole tree in one forward (:class:`minispec.model.TreeAttention`) and
:mod:`minispec.tree_decoding` walks down it.

How children are chosen, and which ``q`` each one carries (``q`` must be the distribution a token was
actually drawn from, or verification is not exact):

* **greedy** (temperature 0): the top-``b`` tokens of the drafter at the node, distinct. The target
  accepts a child only if it is its own argmax, so any choice is exact (Stratos App. A).
* **sampled**, draft model: ``b`` tokens drawn **independently, with replacement** from ``q(. | node)``
  -- SpecInfer's expansion, verified with its multi-step speculative sampling, i.e.
  :func:`minispec.tree.iterative_speculative_sample` (Stratos §2) at every node: the draws are tried
  one after another, each against what the target has left. Equal draws share one child node but
  are each tried (a repeated proposal is exact; dropping it would not be).
* n-gram table: the ``b`` most frequent distinct continuations, deterministic, so ``q`` is one-hot
  (``None``); iterative sampling with one-hot proposals stays exact.

A :class:`TreeProposal` numbers its nodes depth-first (like :class:`minispec.tree.DraftTree`); the
drafter remembers what it stored and, after verification, :meth:`TreeModelDrafter.observe` compacts
its own cache to the accepted path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from minispec.drafters import ModelDrafter
from minispec.kv_cache import ContiguousKVCache, cache_args_for_model
from minispec.model import Llama, TreeAttention
from minispec.ngram import NGramDrafter
from minispec.sampling import SamplingParams, probs_for_rows, sample
from minispec.sequence import Sequence
from minispec.tree import DraftTree

__all__ = ["NGramTreeDrafter", "TreeModelDrafter", "TreeProposal", "check_branching", "tree_size"]


def check_branching(branching, k: int) -> tuple[int, ...]:
    """``branching`` as a tuple of ``k`` integers >= 1 (padded with 1s: chains; cut to ``k``).

    Raises ValueError for anything else.
    """
    if isinstance(branching, int) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                             for b in branching) or not branching:
        raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {branching!r}")
    return (tuple(branching) + (1,) * k)[:k]


def tree_size(branching: tuple[int, ...]) -> int:
    """Nodes of a full tree with this branching, the root included: ``1 + b1 + b1 b2 + ...``."""
    total, width = 1, 1
    for b in branching:
        width *= b
        total += width
    return total


@dataclass
class TreeProposal:
    """A draft tree and how it was drawn.

    Attributes:
        tree: the nodes, depth-first (node 0 = root = last context token); ``draft_nodes`` holds
            the root-to-leaf paths, so :func:`minispec.tree.verify_tree` can walk it greedily.
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
        """Length of the longest root-to-leaf path."""
        return max((len(p) for p in self.tree.draft_nodes), default=0)

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
        leaves = [i for i, o in enumerate(order) if not children[o] and i > 0]
        for leaf in leaves:
            path, node = [], leaf
            while node != 0:
                path.insert(0, node)
                node = tree.parents[node]
            tree.draft_nodes.append(path)
        remapped = [[(new[c], q) for c, q in draws[o]] for o in order]
        return cls(tree, remapped, order)


class TreeModelDrafter:
    """Proposes a tree with a draft model: one draft forward per depth, all nodes of a depth at once.

    The draft model scores the frontier with tree attention: its cache holds the context at
    positions ``0..n-1``, and the nodes fed so far at ``n, n+1, ...`` (breadth-first); the last depth
    is never fed. :meth:`observe` compacts that cache to the accepted path.

    Args:
        model: the draft :class:`~minispec.model.Llama` (or a :class:`ModelDrafter`: its model).
        max_seq_len: longest context (the cache gets room for one tree on top).
        max_nodes: most tree nodes one round may feed.
    """

    def __init__(self, model: Llama | ModelDrafter, max_seq_len: int, max_nodes: int) -> None:
        self.model = model.model if isinstance(model, ModelDrafter) else model
        args = cache_args_for_model(self.model, max_seq_len)
        args["max_seq_len"] += max_nodes            # tree nodes are stored past the context
        self.cache = ContiguousKVCache(num_slots=1, **args)
        self.slot = self.cache.allocate()
        self.fed: list[int] = []                    # context tokens at positions 0..len-1
        self.storage: dict[int, int] = {}           # created node -> cache position (fed nodes)
        self.forwards = 0

    @torch.inference_mode()
    def propose(self, seq: Sequence, branching: tuple[int, ...]) -> TreeProposal:
        """A tree after ``seq.context`` with ``branching[t]`` children per node at depth ``t``."""
        context, n = seq.context, seq.num_tokens
        common = 0
        while common < min(len(self.fed), n - 1) and self.fed[common] == context[common]:
            common += 1
        self.cache.truncate_to(self.slot, common)
        feed = context[common:]                     # at least the last token: the root's logits
        logits = self._forward(feed, list(range(common, n)), None)[-1:]             # (1, V)
        self.fed, self.storage = list(context), {}
        parents, tokens, paths = [-1], [context[-1]], [[]]
        draws: list[list[tuple[int, Tensor | None]]] = [[]]
        frontier = [0]
        for depth, b in enumerate(branching, start=1):
            children = []
            for node, row in zip(frontier, logits, strict=True):
                for token, q in self._choose(seq, row, context + paths[node], b):
                    same = [c for c, _ in draws[node] if tokens[c] == token]
                    child = same[0] if same else len(tokens)
                    if not same:
                        parents.append(node)
                        tokens.append(token)
                        paths.append(paths[node] + [token])
                        draws.append([])
                        children.append(child)
                    draws[node].append((child, q))
            frontier = children
            if depth < len(branching):
                logits = self._feed_level(frontier, parents, tokens, n - 1 + depth)        # (F, V)
        return TreeProposal.build(parents, tokens, draws)

    def _choose(self, seq: Sequence, logits: Tensor, context: list[int], b: int):
        """``b`` children of a node: greedy top-b (q None), else b i.i.d. draws from q."""
        sp: SamplingParams = seq.sampling
        if sp.greedy:
            return [(int(t), None) for t in logits.topk(b).indices]
        q = probs_for_rows(logits[None], [sp], [context])[0]                              # (V,)
        return [(int(sample(q, seq.generator)), q) for _ in range(b)]

    def _feed_level(self, frontier: list[int], parents: list[int], tokens: list[int],
                    position: int) -> Tensor:
        """Feed one depth of nodes at RoPE ``position``; each sees the context and its ancestors."""
        start = len(self.fed)
        first = start + len(self.storage)
        for i, node in enumerate(frontier):
            self.storage[node] = first + i
        width = len(self.storage)                    # tree positions start .. start + width - 1
        mask = torch.zeros(1, len(frontier), width, dtype=torch.bool)
        for row, node in enumerate(frontier):
            while node != 0:                         # the node and its fed ancestors
                mask[0, row, self.storage[node] - start] = True
                node = parents[node]
        storage = torch.arange(first, first + len(frontier))[None]
        tree = TreeAttention(storage, torch.tensor([start]), mask)
        return self._forward([tokens[node] for node in frontier], [position] * len(frontier), tree)

    def _forward(self, ids: list[int], positions: list[int], tree: TreeAttention | None) -> Tensor:
        device = self.model.device
        if tree is not None:
            tree = TreeAttention(tree.storage.to(device), tree.start.to(device), tree.mask.to(device))
        logits = self.model(torch.tensor([ids], device=device), torch.tensor([positions], device=device),
                            self.cache, [self.slot], tree=tree)                          # (1, T, V)
        self.forwards += 1
        return logits[0]

    def observe(self, proposal: TreeProposal, path: list[int]) -> None:
        """Keep the context plus the fed nodes of the accepted ``path`` (depth-first node ids)."""
        kept = [proposal.created[i] for i in path if proposal.created[i] in self.storage]
        n = len(self.fed)
        self.cache.compact(self.slot, n, [self.storage[c] for c in kept])
        self.fed += [proposal.tree.tokens[i] for i in path[:len(kept)]]
        self.storage = {}


class NGramTreeDrafter:
    """Proposes a tree from an n-gram table: the ``b`` most frequent distinct continuations per node.

    Args:
        ngram: the :class:`~minispec.ngram.NGramDrafter` whose tables are used (a new one if None).
    """

    def __init__(self, ngram: NGramDrafter | None = None) -> None:
        self.ngram = ngram or NGramDrafter()
        self.forwards = 0

    def propose(self, seq: Sequence, branching: tuple[int, ...]) -> TreeProposal:
        """A tree after ``seq.context``; a node with no known continuation gets no children."""
        g = self.ngram
        g.propose(seq.context, 0)                     # ingest the accepted tokens, predict nothing
        tail = list(g.history)[-(g.max_order - 1):]
        parents, tokens, paths = [-1], [seq.context[-1]], [tail]
        draws: list[list[tuple[int, Tensor | None]]] = [[]]
        frontier = [0]
        for b in branching:
            children = []
            for node in frontier:
                for token in self.continuations(paths[node], b):
                    draws[node].append((len(tokens), None))
                    children.append(len(tokens))
                    parents.append(node)
                    tokens.append(token)
                    paths.append(paths[node] + [token])
                    draws.append([])
            frontier = children
        return TreeProposal.build(parents, tokens, draws)

    def continuations(self, history: list[int], b: int) -> list[int]:
        """Up to ``b`` distinct tokens that followed the longest known suffix of ``history``,
        most frequent first (the most recent on ties)."""
        g = self.ngram
        for n in range(min(g.max_order - 1, len(history)), 0, -1):
            ctx = tuple(history[-n:])
            row = g.counts.get(ctx)
            if row:
                return sorted(row, key=lambda t: (row[t], g.last_seen[(ctx, t)]), reverse=True)[:b]
        return []

    def observe(self, proposal: TreeProposal, path: list[int]) -> None:
        """Nothing to do: the table syncs with the context on the next call."""
