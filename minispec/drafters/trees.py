"""Drafters that propose a *tree* of drafts with a static branching per depth (SpecInfer, EAGLE-2).

``branching = (3, 2, 1, 1)`` means: 3 children of the root (the last context token), 2 children of
each of those, then single children -- a tree of depth ``k = 4`` with 3 + 6 + 6 + 6 = 21 nodes. The
target scores the whole tree in one forward ([`TreeAttention`][minispec.models.llama.TreeAttention])
and [`verify`][minispec.core.speculative.verify] walks down it, in the same round as a
chain ([`minispec.decoding.runner`][minispec.decoding.runner]).

How children are chosen, and which ``q`` each one carries (``q`` must be the distribution a token
was actually drawn from, or verification is not exact):

* **greedy** (temperature 0): the top-``b`` tokens of the drafter at the node, distinct. The target
  accepts a child only if it is its own argmax, so any choice is exact (Stratos App. A).
* **sampled**, draft model or EAGLE head: ``b`` tokens drawn **independently, with replacement**
  from ``q(. | node)`` (SpecInfer's expansion), verified by its multi-step speculative sampling,
  [`speculate`][minispec.core.speculative.speculate] (Stratos §2), at
  every node: the draws are tried one after another, each against what the target has left. Equal
  draws share one child node but are each tried (a repeated proposal is exact; dropping it is not).
* n-gram table: the ``b`` most frequent distinct continuations, deterministic, so ``q`` is one-hot
  (``None``); iterative sampling with one-hot proposals stays exact.

Each request gets its own ``SingleTreeDrafter``, driven row by row by the batched
[`TreeDrafter`][minispec.drafters.trees.TreeDrafter]; the draft model's and the EAGLE head's
(``LevelTreeDrafter``) keep only the accepted path in their caches after verification.
[`Proposal`][minispec.core.tree.Proposal] numbers nodes depth-first.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.core.sampling import SamplingParams, is_int, probs_for_rows, sample
from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal, tree_size
from minispec.drafters.base import DRAFTERS, Drafter, ModelDrafter, common_prefix
from minispec.drafters.eagle import EagleDrafter, full_vocab
from minispec.drafters.ngram import NGramDrafter
from minispec.drafters.suffix import SuffixDrafter
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama, TreeAttention

__all__ = ["EagleTreeDrafter", "LevelTreeDrafter", "NGramTreeDrafter", "SuffixTreeDrafter",
           "TreeDrafter", "TreeModelDrafter", "as_tree_drafter", "check_branching", "grow_tree"]


#: The most nodes (root included) a draft tree may have. The target scores every node in one
#: forward and published trees use tens to a few hundred nodes, so a larger tree costs more than it
#: can gain; something like ``branching=(3000,)`` is a mistake, refused before any drafting.
MAX_TREE_NODES = 1024


def check_branching(branching, k: int) -> tuple[int, ...]:
    """``branching`` as a tuple of ``k`` integers >= 1 (padded with 1s: chains; cut to ``k``).

    Raises:
        ValueError: naming ``branching``: not a non-empty sequence of integers >= 1, or a tree of
            more than ``MAX_TREE_NODES`` nodes (counted by ``tree_size`` after the cut to ``k``).
    """
    try:
        values = tuple(branching)
    except TypeError:  # an int, None, ...
        values = ()
    if not values or not all(is_int(b) and b >= 1 for b in values):
        raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {branching!r}")
    checked = (values + (1,) * k)[:k]
    if (nodes := tree_size(checked)) > MAX_TREE_NODES:
        raise ValueError(f"branching={branching!r} with k={k} makes a tree of {nodes} nodes; "
                         f"at most MAX_TREE_NODES={MAX_TREE_NODES} are allowed")
    return checked


class SingleTreeDrafter:
    """What one request's tree drafter does each round; the hooks default to nothing."""

    forwards = 0

    def propose_tree(self, seq: Sequence, branching: tuple[int, ...]) -> Proposal:
        """A tree after ``seq.context`` with ``branching[t]`` children per node at depth ``t``."""
        raise NotImplementedError

    def observe_tree(self, proposal: Proposal, path: list[int], hidden: Tensor | None) -> None:
        """Verify kept the nodes ``path``; ``hidden``: the target's features of root and path."""

    def observe_tree_prefill(self, start: int, hidden: Tensor) -> None:
        """The target prefilled positions ``start..``; ``hidden`` holds their features."""


class LevelTreeDrafter(SingleTreeDrafter):
    """What the cached tree drafters share: expand every node, one forward per depth.

    At each depth every frontier node gets ``b`` children by the rule of the module docstring
    (``_choose``); then, unless it is the last depth, the new nodes are fed in ONE forward with
    tree attention: the cache holds ``start`` committed positions, node ``i`` (creation order) is
    stored past them and sees them plus its own fed ancestors. A subclass says how the root's
    logits are obtained (``_start``) and how a level is scored (``_forward_level``).

    Attributes: model -- the draft model or head; cache, slot -- its own one-slot cache, with room
    for one tree past ``max_seq_len``; storage -- created node -> cache position (fed nodes of the
    latest tree, emptied when the next one starts); forwards -- drafter forwards so far.
    """

    def __init__(self, model, max_seq_len: int, max_nodes: int) -> None:
        self.model = model
        # tree nodes are stored past the context: room for max_nodes more
        self.cache = ContiguousKVCache.for_model(model, 1, max_seq_len, extra=max_nodes)
        self.slot = self.cache.allocate()
        self.storage: dict[int, int] = {}

    @torch.inference_mode()
    def propose_tree(self, seq: Sequence, branching: tuple[int, ...]) -> Proposal:
        """A tree after ``seq.context`` with ``branching[t]`` children per node at depth ``t``."""
        self.storage = {}
        if (root := self._start(seq)) is None:       # nothing to draft from yet: the root alone
            return Proposal.chain([])
        logits, start = root                         # (1, V); cache positions held
        rows = {0: logits[0]}                        # node -> the drafter's logits there (V,)
        return grow_tree(seq.context[-1], branching, [],
                         lambda node, path, b: self._choose(seq, rows[node], path, b),
                         functools.partial(self._feed_level, rows, start))

    def _choose(self, seq: Sequence, logits: Tensor, path: list[int], b: int):
        """``b`` children of the node at ``path`` (below the root): greedy top-b (q None), else b
        i.i.d. draws from q; each as ``(token, q, its path)``. NaN logits fail the request."""
        if torch.isnan(logits).any():
            raise ValueError("draft logits contain NaN")
        if seq.sampling.greedy:
            return [(int(t), None, path + [int(t)]) for t in logits.topk(b).indices]
        q = probs_for_rows(logits[None], [seq.sampling], [seq.context + path])[0]       # (V,)
        return [(t, q, path + [t]) for t in [int(sample(q, seq.generator)) for _ in range(b)]]

    def _feed_level(self, rows: dict[int, Tensor], start: int, frontier: list[int],
                    parents: list[int], tokens: list[int], depth: int) -> None:
        """Feed the nodes of ``depth`` at RoPE position ``start + depth - 1``; each sees the
        committed ``start`` positions and its fed ancestors. The drafter's logits at each node
        ``(V,)`` go to ``rows``."""
        first = start + len(self.storage)
        self.storage.update({node: first + i for i, node in enumerate(frontier)})
        # (1, F, W): may node f see tree position start + w (W: the nodes stored so far)
        mask = torch.zeros(1, len(frontier), len(self.storage), dtype=torch.bool)
        for row, node in enumerate(frontier):
            while node != 0:                         # the node and its fed ancestors
                mask[0, row, self.storage[node] - start] = True
                node = parents[node]
        device = self.cache.device
        storage = torch.arange(first, first + len(frontier), device=device)[None]  # (1, F)
        tree = TreeAttention(storage, torch.tensor([start], device=device), mask.to(device))
        self.forwards += 1
        ids = torch.tensor([[tokens[node] for node in frontier]], device=device)       # (1, F)
        positions = torch.full_like(ids, start + depth - 1)                            # (1, F)
        rows.update(zip(frontier, self._forward_level(frontier, parents, ids, positions, tree),
                        strict=True))                # (F, V)

    def _start(self, seq: Sequence) -> tuple[Tensor, int] | None:
        """Sync the cache with ``seq.context``: the root's logits ``(1, V)`` and the cache
        positions now held (or None: no tree this round)."""
        raise NotImplementedError

    def _forward_level(self, frontier: list[int], parents: list[int], ids: Tensor,
                       positions: Tensor, tree: TreeAttention) -> Tensor:
        """Score the frontier nodes, ``ids`` ``(1, F)`` at ``positions`` ``(1, F)`` (one forward
        with ``tree``): logits ``(F, V)``."""
        raise NotImplementedError


class TreeModelDrafter(LevelTreeDrafter):
    """Proposes a tree with a draft model: one draft forward per depth, all nodes of a depth at
    once.

    The draft model scores the frontier with tree attention: its cache holds the context at
    positions ``0..n-1``, and the nodes fed so far at ``n, n+1, ...`` (breadth-first); the last
    depth is never fed. [`observe_tree`][minispec.drafters.trees.TreeModelDrafter.observe_tree]
    compacts that cache to the accepted path.

    Args:
        model: the draft [`Llama`][minispec.models.llama.Llama].
        max_seq_len: longest context (the cache gets room for one tree on top).
        max_nodes: most tree nodes one round may feed.
    """

    def __init__(self, model: Llama, max_seq_len: int, max_nodes: int) -> None:
        super().__init__(model, max_seq_len, max_nodes)
        self.fed: list[int] = []                    # context tokens at positions 0..len-1

    def _start(self, seq: Sequence) -> tuple[Tensor, int]:
        """Feed the context past the common prefix (at least the last token: the root)."""
        context, n = seq.context, seq.num_tokens
        common = common_prefix(self.fed, context, limit=n - 1)
        self.cache.truncate_to(self.slot, common)
        device = self.model.device
        logits = self.model(torch.tensor([context[common:]], device=device),
                            torch.arange(common, n, device=device)[None], self.cache, [self.slot])
        self.forwards += 1
        self.fed = list(context)
        return logits[0, -1:], n                                                         # (1, V)

    def _forward_level(self, frontier, parents, ids, positions, tree) -> Tensor:
        return self.model(ids, positions, self.cache, [self.slot], tree=tree)[0]        # (F, V)

    def observe_tree(self, proposal: Proposal, path: list[int], hidden: Tensor | None) -> None:
        """Keep the context plus the fed nodes of the accepted ``path`` (depth-first node ids)."""
        kept = [proposal.created[i] for i in path if proposal.created[i] in self.storage]
        self.cache.compact(self.slot, len(self.fed), [self.storage[c] for c in kept])
        self.fed += [proposal.tree.tokens[i] for i in path[:len(kept)]]


class EagleTreeDrafter(LevelTreeDrafter):
    """Proposes a tree with an EAGLE head ([`minispec.drafters.eagle`][minispec.drafters.eagle]):
    one head forward per depth.

    The head's cache holds the real pairs ``(f_j, x_{j+1})``, ``j = 0..n-2``, fed from the target's
    features. A tree node ``d`` at depth ``t`` is the pair ``(f'_parent, d)`` at pair position
    ``n - 2 + t``: the head's OWN predicted feature of its parent (the root's: the head's output
    at the last real pair), as EAGLE-1 drafts a chain; siblings share a position and see only
    their ancestors (tree attention in the head's layer). After the target's verify,
    [`observe_tree`][minispec.drafters.trees.EagleTreeDrafter.observe_tree] drops every tree pair
    (they were fed guessed features) and keeps the target's features of the root and the ACCEPTED
    path only, fed as real pairs next round. Draft logits over the head's ``V'`` are spread over the
    full vocabulary (``-inf``, so ``q = 0``, outside).

    Args:
        head: an [`EagleHead`][minispec.models.eagle_head.EagleHead] bound to the target.
        max_seq_len: longest context (the cache gets room for one tree on top).
        max_nodes: most tree nodes one round may feed.
    """

    def __init__(self, head, max_seq_len: int, max_nodes: int) -> None:
        super().__init__(head, max_seq_len, max_nodes)
        self.chain = EagleDrafter(self.model)       # keeps and feeds the real pairs, in our cache
        self.chain.attach(self.cache)
        # the request, as the chain sees it (probe.draft_len: the real pairs held in our slot)
        self.probe = Sequence("tree", [0], SamplingParams(), draft_slot=self.slot)
        self.features: dict[int, Tensor] = {}       # created node -> the head's feature (D,)

    def observe_tree_prefill(self, start: int, hidden: Tensor) -> None:
        """The target's features of the prefilled positions ``start..``: ``(T, D)``."""
        self.chain.observe_prefill([self.probe], [start], [hidden])

    def _start(self, seq: Sequence) -> tuple[Tensor, int] | None:
        """Feed the pending real pairs (the chain's catch-up forward); the root's logits come from
        the last one."""
        if seq.num_tokens < 2:                       # no pair yet: nothing to draft from
            return None
        self.probe.prompt, self.probe.generated = seq.prompt, seq.generated
        logits, feature = self.chain._catch_up([self.probe])                    # (1, V'), (1, D)
        self.forwards += 1
        self.features = {0: feature[0]}
        return full_vocab(self.model, logits), seq.num_tokens - 1

    def _forward_level(self, frontier, parents, ids, positions, tree) -> Tensor:
        parent = torch.stack([self.features[parents[node]] for node in frontier])[None]
        # (1, F, V'), (1, F, D)
        logits, feature = self.model(ids, parent, positions, self.cache, [self.slot], tree=tree)
        self.features.update(zip(frontier, feature[0], strict=True))
        return full_vocab(self.model, logits[0])                              # (F, V)

    def observe_tree(self, proposal: Proposal, path: list[int], hidden: Tensor | None) -> None:
        """Drop the tree's pairs; ``hidden`` is the target's ``(len(path) + 1, D)`` features of
        the root and the accepted ``path``, the next round's real pairs."""
        self.cache.truncate_to(self.slot, self.cache.length(self.slot) - len(self.storage))
        self.chain.observe([self.probe], [len(path)], [hidden], [path])


class NGramTreeDrafter(SingleTreeDrafter):
    """Proposes a tree from an n-gram table: the ``b`` most frequent distinct continuations per
    node. Nothing to observe after verify: the table syncs with the context on the next call.

    Args:
        ngram: the [`NGramDrafter`][minispec.drafters.ngram.NGramDrafter] whose tables are used
            (a new one if None).
    """

    def __init__(self, ngram: NGramDrafter | None = None) -> None:
        self.ngram = ngram or NGramDrafter()

    def propose_tree(self, seq: Sequence, branching: tuple[int, ...]) -> Proposal:
        """A tree after ``seq.context``; a node with no known continuation gets no children."""
        g = self.ngram
        g.propose(seq.context, 0)                      # ingest the accepted tokens, predict nothing
        tail = list(g.history)[-(g.max_order - 1):]    # a node's state: the history it continues
        return grow_tree(seq.context[-1], branching, tail, lambda _, path, b: [
            (t, None, path + [t]) for t in g.continuations(path, b)])


class SuffixTreeDrafter(SingleTreeDrafter):
    """Proposes a tree from suffix matches ([`minispec.drafters.suffix`][minispec.drafters.suffix]):
    at each node, the ``b`` most frequent tokens that followed the occurrences of the longest
    match still agreeing with the node's path; a child whose path probability (its share of the
    occurrences, multiplied down the tree) falls below ``min_prob`` is not proposed, and the depth
    is capped as a chain's (``draft_factor``). Deterministic: one-hot ``q``.

    Args:
        suffix: the [`SuffixDrafter`][minispec.drafters.suffix.SuffixDrafter] whose settings and
            store are used (a new one if None).
    """

    def __init__(self, suffix: SuffixDrafter | None = None) -> None:
        self.suffix = suffix or SuffixDrafter()

    def propose_tree(self, seq: Sequence, branching: tuple[int, ...]) -> Proposal:
        """A tree after ``seq.context``; a node with no continuation gets no children."""
        s = self.suffix
        match = s.match(seq.context)

        def children(_: int, state: tuple[list, list[int], float], b: int):
            ends, path, prob = state                 # occurrences, path, path probability
            options = match.following(ends, path)
            total = sum(len(e) for _, e in options)
            for token, kept in options[:b]:
                if prob * len(kept) / total < s.min_prob:
                    break                            # options are most frequent first
                yield token, None, (kept, path + [token], prob * len(kept) / total)

        depth = s.draft_limit(match.length, len(branching))
        return grow_tree(seq.context[-1], branching[:depth], (match.ends, [], 1.0), children)


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
        level = []
        for node in frontier:
            for token, q, child_state in children(node, states[node], b):
                child = next((c for c, _ in draws[node] if tokens[c] == token), len(tokens))
                if child == len(tokens):             # a new token below this node: a new child
                    level.append(child)
                    parents.append(node)
                    tokens.append(token)
                    draws.append([])
                    states.append(child_state)
                draws[node].append((child, q))
        frontier = level
        if fed is not None and depth < len(branching):
            fed(frontier, parents, tokens, depth)
    return Proposal.build(parents, tokens, draws)


class TreeDrafter(Drafter):
    """The batched face of tree drafting: one
    [`SingleTreeDrafter`][minispec.drafters.trees.SingleTreeDrafter] per request (with its own
    cache, if any), driven row by row.

    Args:
        make: makes one request's tree drafter from its ``Sequence``.
        source: the chain drafter it stands for (its ``wants_hidden``, ``max_seq_len`` and
            ``check_target`` apply), or ``None``: a plain ``Drafter`` (no features, no length
            limit of its own, any target).
    """

    def __init__(self, make: Callable[[Sequence], SingleTreeDrafter], source: Drafter | None = None
                 ) -> None:
        self.make, self.source = make, source or Drafter()
        self.wants_hidden, self.max_seq_len = self.source.wants_hidden, self.source.max_seq_len
        self.instances: dict[str, SingleTreeDrafter] = {}
        self.proposals: dict[str, Proposal] = {}

    def check_target(self, target: Llama) -> None:
        self.source.check_target(target)

    def _instance(self, seq: Sequence) -> SingleTreeDrafter:
        if seq.request_id not in self.instances:
            self.instances[seq.request_id] = self.make(seq)
        return self.instances[seq.request_id]

    def propose_trees(self, seqs: list[Sequence], branchings: list[tuple[int, ...]]
                      ) -> list[Proposal]:
        """Each row's tree, drafted row by row; a row whose drafter raises fails alone (its
        proposal is the root alone, which the runner skips) and the others go on."""
        for seq, branching in zip(seqs, branchings, strict=True):
            root = Proposal.chain([])  # empty branching: no room to draft
            drafter = self._instance(seq)
            before = drafter.forwards
            try:
                self.proposals[seq.request_id] = (drafter.propose_tree(seq, branching)
                                                  if branching else root)
            except Exception as error:       # this request's drafter is broken: it alone fails
                seq.fail(error)
                self.proposals[seq.request_id] = root
            seq.stats.draft_forwards += drafter.forwards - before
            self.forwards += drafter.forwards - before
        return [self.proposals[seq.request_id] for seq in seqs]

    def observe_prefill(self, seqs: list[Sequence], starts: list[int], hidden: list[Tensor] | None
                        ) -> None:
        for b, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
            if hidden is not None:
                self._instance(seq).observe_tree_prefill(start, hidden[b])

    def observe(self, seqs: list[Sequence], num_accepted: list[int], hidden: list[Tensor] | None,
                paths: list[list[int]]) -> None:
        for b, seq in enumerate(seqs):
            self.instances[seq.request_id].observe_tree(
                self.proposals.pop(seq.request_id), paths[b], None if hidden is None else hidden[b])

    def release(self, seq: Sequence) -> None:
        self.instances.pop(seq.request_id, None)
        self.proposals.pop(seq.request_id, None)


def as_tree_drafter(spec: Any, max_nodes: int) -> TreeDrafter:
    """A draft model, a [`ModelDrafter`][minispec.drafters.base.ModelDrafter], an
    [`EagleDrafter`][minispec.drafters.eagle.EagleDrafter] (its head), ``"ngram"``, an
    [`NGramDrafter`][minispec.drafters.ngram.NGramDrafter], ``"suffix"``, a
    [`SuffixDrafter`][minispec.drafters.suffix.SuffixDrafter] or a ``TreeDrafter`` -> a
    ``TreeDrafter`` whose trees hold at most ``max_nodes`` nodes. ``ValueError`` otherwise."""
    if isinstance(spec, TreeDrafter):
        return spec
    if isinstance(spec, Llama):
        spec = ModelDrafter(spec)
    if isinstance(spec, (ModelDrafter, EagleDrafter)):
        tree = TreeModelDrafter if isinstance(spec, ModelDrafter) else EagleTreeDrafter
        return TreeDrafter(lambda seq: tree(spec.model, seq.max_seq_len, max_nodes), spec)
    if spec in ("ngram", "suffix"):                            # the drafter of that name
        spec = DRAFTERS[spec]()
    if isinstance(spec, (NGramDrafter, SuffixDrafter)):
        tree = NGramTreeDrafter if isinstance(spec, NGramDrafter) else SuffixTreeDrafter
        return TreeDrafter(lambda seq: tree(copy.deepcopy(spec)))   # a suffix copy shares a store
    raise ValueError(f"a tree drafter is a draft model, a ModelDrafter, an EagleDrafter, 'ngram', "
                     f"an NGramDrafter, 'suffix' or a SuffixDrafter, got {spec!r}")
