"""Drafters without a model: draft by looking the continuation up in the text itself.

* [`NGramDrafter`][minispec.drafters.ngram.NGramDrafter] is akunu's predictor: counts of 2- to
  4-grams over a window of recent tokens, most frequent continuation, longest context first.
* [`PromptLookupDrafter`][minispec.drafters.ngram.PromptLookupDrafter] copies what followed the last
  earlier occurrence of the context's suffix (prompt lookup decoding).

Both are deterministic, so ``q`` is one-hot (``Draft.probs is None``) and sampling stays exact.
Each answers ``propose(context, k) -> Draft`` for one sequence (their
[`LookupDrafter`][minispec.drafters.ngram.LookupDrafter] base, shared with the suffix drafter,
wraps what their ``lookup(context, k)`` finds) and syncs its tables with ``context`` on every call,
so rollback needs no extra call: the context *is* the accepted sequence. The decoding loops drive
them through [`minispec.drafters.base.PerRequestDrafter`][minispec.drafters.base.PerRequestDrafter]
(one instance per request).
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import islice

import torch

from minispec.core.sampling import SamplingParams
from minispec.core.speculative import Draft

__all__ = ["LookupDrafter", "NGramDrafter", "PromptLookupDrafter"]


class LookupDrafter:
    """What the drafters without a model share: ``propose`` drafts the token ids that ``lookup``
    finds in the text, deterministically, so ``q`` is one-hot (``Draft.probs is None``)."""

    forwards = 0                             # no model: drafting is lookups

    def lookup(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` token ids to draft after ``context``."""
        raise NotImplementedError

    def propose(self, context: list[int], k: int, sampling: SamplingParams | None = None,
                generator: torch.Generator | None = None) -> Draft:
        """Draft up to ``k`` tokens after ``context`` (one-hot ``q``: ``probs=None``)."""
        return Draft(torch.tensor(self.lookup(context, k), dtype=torch.long))


class NGramDrafter(LookupDrafter):
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
        if max_order < 2 or window < max_order:
            raise ValueError(f"need max_order >= 2 and window >= max_order, got {max_order}, "
                             f"{window}")
        self.max_order, self.window = max_order, window
        self.history: deque[int] = deque()
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.last_seen: dict[tuple[tuple[int, ...], int], int] = {}
        self._ingested: list[int] = []       # the context consumed so far
        self._clock = 0

    def reset(self) -> None:
        """Forget every table (a new, unrelated sequence)."""
        self.__init__(self.max_order, self.window)

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

    def continuations(self, history: list[int], b: int) -> list[int]:
        """Up to ``b`` distinct tokens that followed the longest known suffix of ``history``,
        most frequent first (the most recent on ties)."""
        for n in range(min(self.max_order - 1, len(history)), 0, -1):
            ctx = tuple(history[-n:])
            if row := self.counts.get(ctx):
                return heapq.nlargest(b, row, key=lambda t: (row[t], self.last_seen[(ctx, t)]))
        return []

    def predict(self, k: int) -> list[int]:
        """Chain up to ``k`` most-frequent continuations, longest context first."""
        tentative = self._tail()
        out: list[int] = []
        while len(out) < k and (best := self.continuations(tentative, 1)):
            out += best
            tentative += best
        return out

    def lookup(self, context: list[int], k: int) -> list[int]:
        """Ingest the newly accepted tokens of ``context``, then predict up to ``k`` tokens."""
        if context[: len(self._ingested)] != self._ingested:
            self.reset()                     # not a continuation: a new sequence
        for token in context[len(self._ingested):]:
            self.update(token)
        self._ingested = list(context)
        return self.predict(k)


class PromptLookupDrafter(LookupDrafter):
    """Prompt lookup decoding: copy what followed an earlier occurrence of the context's suffix.

    The longest suffix of the context (``max_ngram`` tokens down to ``min_ngram``) that also occurs
    earlier in the context is looked up; the ``k`` tokens that followed its most recent earlier
    occurrence are the draft. Deterministic, so ``q`` is one-hot.

    Attributes:
        last_match: tokens of context the last lookup matched on (0: none).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.last_match = 0

    def match(self, context: list[int]) -> tuple[int, int]:
        """The longest suffix of ``context`` (``max_ngram`` tokens down to ``min_ngram``) that also
        occurs earlier: ``(its length, where its latest earlier occurrence ends)``, or ``(0, -1)``
        when none reaches ``min_ngram``."""
        longest = min(self.max_ngram, len(context) - 1)
        # Every earlier occurrence of the suffix ends on a copy of the last token. Visit those ends
        # latest first (list.index scans in C), measure how long a suffix matches there, and keep
        # the first end with the longest match: the latest occurrence of the longest suffix.
        last = len(context) - 1
        backwards = context[-2::-1]                    # context[last - 1], ..., context[0]
        best_len, best_end = 0, -1
        i = 0
        while best_len < longest:
            try:
                i = backwards.index(context[last], i)
            except ValueError:
                break
            end = last - 1 - i                         # context[end] == context[last]
            n = 1
            while n < longest and n <= end and context[end - n] == context[last - n]:
                n += 1
            if n > best_len:
                best_len, best_end = n, end
            i += 1
        return (best_len, best_end) if best_len >= self.min_ngram else (0, -1)

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The up-to-``k`` tokens that followed the latest earlier match of the longest suffix."""
        self.last_match, end = self.match(context)
        return context[end + 1:end + 1 + k] if self.last_match else []
