"""Drafters without a model: draft by looking the continuation up in the text itself.

* [`NGramDrafter`][minispec.drafters.ngram.NGramDrafter] is akunu's predictor: counts of 2- to
  4-grams over a window of recent tokens, most frequent continuation, longest context first.
* [`PromptLookupDrafter`][minispec.drafters.ngram.PromptLookupDrafter] copies what followed the last
  earlier occurrence of the context's suffix (prompt lookup decoding).

Both are deterministic, so ``q`` is one-hot (``probs=None``) and sampling stays exact. Their base,
[`ContextDrafter`][minispec.drafters.ngram.ContextDrafter] (shared with the suffix drafter), is
one request's state: ``lookup(context, k)`` syncs its tables with ``context`` on every call, so
rollback needs no extra call (the context *is* the accepted sequence), and ``propose`` keeps one
such state per request.
"""

from __future__ import annotations

import copy
import heapq
from collections import deque
from itertools import islice

import torch

from minispec.core.sampling import SamplingParams, check_args, is_int
from minispec.core.sequence import Sequence
from minispec.core.speculative import Draft
from minispec.core.tree import Proposal
from minispec.drafters.base import Drafter, Shape
from minispec.drafters.trees import grow_tree

__all__ = ["DRAFTERS", "ContextDrafter", "NGramDrafter", "PromptLookupDrafter"]


class ContextDrafter(Drafter):
    """What the drafters without a model share: drafts looked up in the request's own text,
    deterministic, so ``q`` is one-hot.

    An instance is one request's state (its tables, its index): ``lookup(context, k)`` drafts a
    chain after ``context`` and ``lookup_tree(context, branching)`` a tree. Each defaults to the
    other -- a chain is the tree with one child per node, and a tree, by default, that chain -- so
    a subclass overrides at least one of them.
    [`propose`][minispec.drafters.ngram.ContextDrafter.propose] keeps a clone per request
    (``requests``, by ``seq.request_id``); a row whose lookup raises fails alone. A clone
    (``clone``, ``copy.deepcopy``) is of the same class (a subclass keeps its overrides and its own
    attributes, deep-copied) with no request state.

    Attributes:
        last_match: tokens of context the last lookup matched on (0: none).
    """

    last_match: int = 0

    def __init__(self) -> None:
        self.requests: dict[str, ContextDrafter] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the request (a new, unrelated sequence)."""
        self.last_match = 0

    def lookup(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` token ids to draft after ``context`` (default: the tree ``lookup_tree``
        draws with one child per node). A subclass overrides ``lookup`` or ``lookup_tree``."""
        return self.lookup_tree(context, (1,) * k).tree.tokens[1:]

    def lookup_tree(self, context: list[int], branching: tuple[int, ...]) -> Proposal:
        """A tree after ``context`` with up to ``branching[t]`` children per node at depth ``t``
        (default: the chain ``lookup`` drafts, one child per node)."""
        if type(self).lookup is ContextDrafter.lookup:          # each default calls the other
            raise NotImplementedError(f"{type(self).__name__} overrides neither lookup nor "
                                      "lookup_tree")
        return Proposal.chain(self.lookup(context, len(branching)))

    def draft(self, context: list[int], k: int, sampling: SamplingParams | None = None,
              generator: torch.Generator | None = None) -> Draft:
        """Draft up to ``k`` tokens after ``context`` (one-hot ``q``: ``probs=None``; as
        [`OneContext.draft`][minispec.check.one_context.OneContext.draft] gives a model drafter,
        which samples)."""
        return Draft(torch.tensor(self.lookup(context, k), dtype=torch.long))

    def propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """Each row's chain (``lookup``) or tree (``lookup_tree``), by its request's state."""
        proposals = []
        for seq, shape in zip(seqs, shapes, strict=True):
            try:
                if seq.request_id not in self.requests:
                    self.requests[seq.request_id] = self.for_request(seq)
                state = self.requests[seq.request_id]
                proposals.append(state.lookup_tree(seq.context, shape) if isinstance(shape, tuple)
                                 else Proposal.chain(state.lookup(seq.context, shape)))
            except Exception as error:       # this request's drafter is broken: it alone fails
                seq.fail(error)
                proposals.append(Proposal.chain([]))
        return proposals

    def for_request(self, seq: Sequence) -> ContextDrafter:
        """A fresh state for ``seq`` (a clone)."""
        return self.clone()

    def release(self, seq: Sequence) -> None:
        self.requests.pop(seq.request_id, None)

    def clone(self) -> ContextDrafter:
        """The same class and settings with no request state."""
        return copy.deepcopy(self)

    def __deepcopy__(self, memo: dict) -> ContextDrafter:
        """A copy of the same class and settings (a subclass's own state deep-copied) with no
        request state."""
        twin = type(self).__new__(type(self))
        twin.__dict__.update(copy.deepcopy({name: value for name, value in vars(self).items()
                                            if name != "requests"}, memo))
        twin.requests = {}
        twin.reset()
        return twin


class NGramDrafter(ContextDrafter):
    """akunu's n-gram predictor: frequency tables of 2..4-grams over a sliding window.

    For each context of ``1..max_order-1`` tokens the table counts which token followed it. A
    proposal looks up the longest context first (3 tokens, then 2, then 1), takes its most frequent
    continuation (the most recent one on ties), appends it and repeats, stopping early when no
    context matches. The tables are seeded from the prompt and updated with every accepted token.

    Unlike akunu, which keeps counts forever and only windows its history, counts here cover just
    the last ``window`` tokens (a count is removed when its n-gram slides out), so memory is
    bounded and the predictor follows recent text.
    """

    def __init__(self, max_order: int = 4, window: int = 512) -> None:
        check_args("NGramDrafter", [
            ("max_order", max_order, is_int(max_order) and max_order >= 2, "an integer >= 2"),
            ("window", window, is_int(window) and (not is_int(max_order) or window >= max_order),
             f"an integer >= max_order ({max_order!r})")])
        self.max_order, self.window = max_order, window
        super().__init__()

    def reset(self) -> None:
        """Forget every table (a new, unrelated sequence)."""
        self.history: deque[int] = deque()
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.last_seen: dict[tuple[tuple[int, ...], int], int] = {}
        self._ingested: list[int] = []       # the context consumed so far
        self._clock = 0

    def update(self, token: int) -> None:
        """Slide one accepted token into the window and count the n-grams it completes."""
        self._clock += 1
        if len(self.history) == self.window:
            self._forget_oldest()
        tail = self._tail()
        for n in range(1, len(tail) + 1):
            ctx = tuple(tail[-n:])
            row = self.counts.setdefault(ctx, {})
            row[token] = row.get(token, 0) + 1
            self.last_seen[(ctx, token)] = self._clock
        self.history.append(token)

    def _tail(self) -> list[int]:
        """The last ``max_order - 1`` tokens of the window (the longest lookup context)."""
        return list(islice(reversed(self.history), self.max_order - 1))[::-1]

    def _forget_oldest(self) -> None:
        """Remove the n-grams whose first token is leaving the window."""
        items = list(islice(self.history, self.max_order))   # only the n-grams that start here
        for n in range(1, len(items)):
            ctx, nxt = tuple(items[:n]), items[n]
            row = self.counts[ctx]
            row[nxt] -= 1
            if row[nxt] == 0:
                del row[nxt]
                self.last_seen.pop((ctx, nxt), None)
                if not row:
                    del self.counts[ctx]
        self.history.popleft()

    def _longest(self, history: list[int]) -> tuple[int, ...]:
        """The longest suffix of ``history`` seen before (``()``: none)."""
        for n in range(min(self.max_order - 1, len(history)), 0, -1):
            if tuple(history[-n:]) in self.counts:
                return tuple(history[-n:])
        return ()

    def continuations(self, history: list[int], b: int) -> list[int]:
        """Up to ``b`` distinct tokens that followed the longest known suffix of ``history``,
        most frequent first (the most recent on ties)."""
        ctx = self._longest(history)
        row = self.counts.get(ctx, {})                      # () is never counted: no row
        return heapq.nlargest(b, row, key=lambda t: (row[t], self.last_seen[(ctx, t)]))

    def predict(self, k: int) -> list[int]:
        """Chain up to ``k`` most-frequent continuations, longest context first."""
        return self.grow((1,) * k).tree.tokens[1:]

    def grow(self, branching: tuple[int, ...]) -> Proposal:
        """A tree after the window: the ``b`` most frequent distinct continuations per node; a
        node with no known continuation gets no children."""
        tail = self._tail()
        return grow_tree(tail[-1] if tail else -1, branching, tail, lambda _, path, b: [
            (t, None, path + [t]) for t in self.continuations(path, b)])

    def lookup_tree(self, context: list[int], branching: tuple[int, ...]) -> Proposal:
        """Ingest the newly accepted tokens of ``context``, then grow a tree (``lookup``: a chain)
        from the tables."""
        if context[: len(self._ingested)] != self._ingested:
            self.reset()                     # not a continuation: a new sequence
        for token in context[len(self._ingested):]:
            self.update(token)
        self._ingested = list(context)
        self.last_match = len(self._longest(self._tail()))     # what a hybrid weighs
        return self.grow(branching)


class PromptLookupDrafter(ContextDrafter):
    """Prompt lookup decoding: copy what followed an earlier occurrence of the context's suffix.

    The longest suffix of the context (``max_ngram`` tokens down to ``min_ngram``) that also occurs
    earlier in the context is looked up; the ``k`` tokens that followed its most recent earlier
    occurrence are the draft. Deterministic, so ``q`` is one-hot; ``last_match`` is the length of
    the suffix the last lookup matched on (0: none).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        check_args("PromptLookupDrafter", [
            ("max_ngram", max_ngram, is_int(max_ngram) and max_ngram >= 1, "an integer >= 1"),
            ("min_ngram", min_ngram, is_int(min_ngram) and 1 <= min_ngram
             and (not is_int(max_ngram) or min_ngram <= max_ngram),
             f"an integer in [1, max_ngram ({max_ngram!r})]")])
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        super().__init__()

    def match(self, context: list[int]) -> tuple[int, int]:
        """The longest suffix of ``context`` (``max_ngram`` tokens down to ``min_ngram``) that also
        occurs earlier: ``(its length, where its latest earlier occurrence ends)``, or ``(0, -1)``
        when none reaches ``min_ngram``."""
        last = len(context) - 1
        longest = min(self.max_ngram, last)
        # Every earlier occurrence of the suffix ends on a copy of the last token. Visit those ends
        # latest first (list.index scans in C), measure how long a suffix matches there, and keep
        # the first end with the longest match: the latest occurrence of the longest suffix.
        backwards = context[::-1]                      # backwards[i] = context[last - i]
        best_len, best_end = 0, -1
        i = 0                                          # an end i tokens before the last
        while best_len < longest:
            try:
                i = backwards.index(backwards[0], i + 1)
            except ValueError:
                break
            n = 1                                      # tokens n back agree at both ends
            while n < longest and i + n <= last and backwards[i + n] == backwards[n]:
                n += 1
            if n > best_len:
                best_len, best_end = n, last - i
        return (best_len, best_end) if best_len >= self.min_ngram else (0, -1)

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The up-to-``k`` tokens that followed the latest earlier match of the longest suffix."""
        self.last_match, end = self.match(context)
        return context[end + 1:end + 1 + k] if self.last_match else []


#: The drafters made by name (``drafter="ngram"``); the package adds the drafters of its wings
#: (``"suffix"``) when it is imported.
DRAFTERS: dict[str, type[ContextDrafter]] = {"ngram": NGramDrafter,
                                             "prompt_lookup": PromptLookupDrafter}
