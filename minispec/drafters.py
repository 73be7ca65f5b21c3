"""Drafters: where the ``k`` guesses of each round come from.

Every drafter answers one question, ``propose(context, k, sampling, generator) -> Draft``: given
the tokens accepted so far, guess up to ``k`` next tokens, and say which distribution ``q`` each
guess was drawn from (``None`` for a deterministic drafter, which verify treats as one-hot ``q``:
sampling stays exact).

* :class:`ModelDrafter` runs a small draft model with its own KV cache (Leviathan et al.).
* :class:`NGramDrafter` is akunu's predictor: counts of 2- to 4-grams over a window of recent
  tokens, most frequent continuation, longest context first.
* :class:`PromptLookupDrafter` copies what followed the last earlier occurrence of the context's
  suffix (prompt lookup decoding).

A drafter holds per-sequence state (a cache, n-gram tables) and syncs it with ``context`` on every
call, so rollback needs no extra call: the context *is* the accepted sequence.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from minispec.kv_cache import ContiguousKVCache
from minispec.sampling import SamplingParams, apply_repetition_penalty, probs_from_logits, sample

if TYPE_CHECKING:
    from minispec.model import Llama

__all__ = ["Draft", "Drafter", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter"]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distributions they were drawn from.

    Attributes:
        tokens: ``[n]`` int64, ``0 <= n <= k`` guesses.
        probs: ``[n, V]`` row ``i`` is the ``q`` token ``i`` was drawn from, or ``None`` when the
            drafter is deterministic (one-hot ``q``).
    """

    tokens: Tensor
    probs: Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    """What :func:`minispec.speculative_generate` needs from a drafter."""

    forwards: int

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        """Guess up to ``k`` tokens that follow ``context`` (all tokens accepted so far)."""
        ...


class ModelDrafter:
    """Drafts with a small language model that shares the target's tokenizer.

    The draft model keeps its own KV cache. On each call it finds how much of ``context`` it has
    already cached (the longest common prefix with what it fed before), rolls its cache back to
    that point, and feeds the rest: normally just the last accepted token, two tokens when the
    previous round accepted all ``k`` drafts (``d_k`` was sampled but never fed: the draft lags by
    one), and the whole prompt on first use (lazy prefill).

    Args:
        model: the draft :class:`minispec.model.Llama`.
        max_seq_len: size of its cache (default: the model's ``max_position_embeddings``).
    """

    def __init__(self, model: Llama, max_seq_len: int | None = None) -> None:
        self.model = model
        self.cache = ContiguousKVCache.for_model(model, num_slots=1, max_seq_len=max_seq_len)
        self.slot = self.cache.allocate()
        self.fed: list[int] = []          # token ids whose keys/values sit in the cache
        self.forwards = 0

    @property
    def max_seq_len(self) -> int:
        """Longest context (plus drafts) this drafter can hold."""
        return self.cache.max_seq_len

    def check_compatible(self, target_vocab_size: int, target_eos: tuple[int, ...]) -> None:
        """Raise ``ValueError`` if the draft cannot share the target's token ids."""
        config = self.model.config
        if config.vocab_size != target_vocab_size:
            raise ValueError(f"draft vocab_size {config.vocab_size} != target vocab_size "
                             f"{target_vocab_size}: the models must share one tokenizer")
        if target_eos and config.eos_token_ids and set(config.eos_token_ids) != set(target_eos):
            raise ValueError(f"draft eos ids {config.eos_token_ids} != target eos ids {target_eos}: "
                             "the models must share one tokenizer")

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        """Sample ``k`` tokens from the draft model, with the target's sampling adjustments."""
        if not context:
            raise ValueError("context must hold at least one token")
        # Roll back to the longest prefix of `context` already in the cache; keep >= 1 token to feed.
        if context[: len(self.fed)] == self.fed:       # the usual case, compared in C
            common = len(self.fed)
        else:
            common = 0
            for a, b in zip(self.fed, context, strict=False):
                if a != b:
                    break
                common += 1
        common = min(common, len(context) - 1)
        self.cache.truncate_to(self.slot, common)
        del self.fed[common:]
        feed = context[common:]
        tokens: list[int] = []
        probs: list[Tensor] = []
        seen = list(context) if sampling.repetition_penalty != 1 else None   # grows with drafts
        for _ in range(k):
            logits = self._forward(feed)   # (V,) logits after the last fed token
            if sampling.greedy:
                # Sampling from a one-hot q returns its argmax: take it directly.
                token = _greedy_token(logits, sampling, seen)
            else:
                q = probs_from_logits(logits, sampling, context_ids=seen)
                token = int(sample(q, generator))
                probs.append(q)
            tokens.append(token)
            if seen is not None:
                seen.append(token)
            feed = [token]
        device = self.model.device
        ids = torch.tensor(tokens, dtype=torch.long, device=device)
        if sampling.greedy and tokens:                 # q is one-hot at each greedy draft
            V = self.model.config.vocab_size
            return Draft(ids, torch.zeros(len(tokens), V, device=device).scatter_(-1, ids[:, None], 1.0))
        return Draft(ids, torch.stack(probs) if probs else None)

    def _forward(self, feed: list[int]) -> Tensor:
        start = len(self.fed)
        ids = torch.tensor([feed], dtype=torch.long, device=self.model.device)          # (1, T)
        positions = torch.arange(start, start + len(feed), device=self.model.device)[None]  # (1, T)
        logits = self.model(ids, positions, self.cache, [self.slot])                       # (1, T, V)
        self.fed.extend(feed)
        self.forwards += 1
        return logits[0, -1]


def _greedy_token(logits: Tensor, sampling: SamplingParams, seen: list[int] | None) -> int:
    """The argmax of ``probs_from_logits(logits, sampling, seen)`` at temperature 0, no one-hot."""
    logits = logits.float()
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    return int(logits.argmax())


class NGramDrafter:
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
            raise ValueError(f"need max_order >= 2 and window >= max_order, got {max_order}, {window}")
        self.max_order = max_order
        self.window = window
        self.forwards = 0                    # no model: drafting is table lookups
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
        for n in range(1, self.max_order):
            if len(tail) >= n:
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
        for n in range(1, self.max_order):
            if len(items) > n:
                ctx, nxt = tuple(items[:n]), items[n]
                row = self.counts[ctx]
                row[nxt] -= 1
                if row[nxt] == 0:
                    del row[nxt]
                    self.last_seen.pop((ctx, nxt), None)
                    if not row:
                        del self.counts[ctx]
        self.history.popleft()

    def predict(self, k: int) -> list[int]:
        """Chain up to ``k`` most-frequent continuations, longest context first."""
        tentative = self._tail()
        out: list[int] = []
        for _ in range(k):
            token = None
            for n in range(min(self.max_order - 1, len(tentative)), 0, -1):
                row = self.counts.get(tuple(tentative[-n:]))
                if row:
                    ctx = tuple(tentative[-n:])
                    token = max(row, key=lambda t: (row[t], self.last_seen[(ctx, t)]))
                    break
            if token is None:
                break
            out.append(token)
            tentative.append(token)
        return out

    def propose(self, context: list[int], k: int, sampling: SamplingParams | None = None,
                generator: torch.Generator | None = None) -> Draft:
        """Ingest the newly accepted tokens of ``context``, then predict up to ``k`` tokens."""
        if context[: len(self._ingested)] != self._ingested:
            self.reset()                     # not a continuation: a new sequence
        for token in context[len(self._ingested):]:
            self.update(token)
        self._ingested = list(context)
        return Draft(torch.tensor(self.predict(k), dtype=torch.long))


class PromptLookupDrafter:
    """Prompt lookup decoding: copy what followed an earlier occurrence of the context's suffix.

    The longest suffix of the context (``max_ngram`` tokens down to ``min_ngram``) that also occurs
    earlier in the context is looked up; the ``k`` tokens that followed its most recent earlier
    occurrence are the draft. Deterministic, so ``q`` is one-hot.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.forwards = 0

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The up-to-``k`` tokens that followed the latest earlier match of the longest suffix."""
        longest = min(self.max_ngram, len(context) - 1)
        if longest < self.min_ngram:
            return []
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
        if best_len < self.min_ngram:
            return []
        return context[best_end + 1:best_end + 1 + k]

    def propose(self, context: list[int], k: int, sampling: SamplingParams | None = None,
                generator: torch.Generator | None = None) -> Draft:
        """Draft by copying from the context itself."""
        return Draft(torch.tensor(self.lookup(context, k), dtype=torch.long))
