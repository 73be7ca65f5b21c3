"""One request: its tokens, its limits, its stop rules, its random stream (vLLM's ``Sequence``).

A [`Sequence`][minispec.core.sequence.Sequence] is everything a decoding loop knows about one
request, and the same object is driven by both loops:
[`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate] makes one, the
[`Engine`][minispec.serving.engine.Engine] makes one per request. So the rules that belong to a
request are written here, once:

* **what a valid request is** ([`Sequence.new`][minispec.core.sequence.Sequence.new]): integral
  token ids inside the vocabulary, an integral ``max_new_tokens >= 0``, stop ids inside the
  vocabulary, non-empty stop strings, a prompt that fits ``max_seq_len`` -- a bad request is
  refused with a ``ValueError`` before it can run;
* **how long a round may be** ([`round_k`][minispec.core.sequence.round_k]): ``k`` shrinks near
  ``max_seq_len`` and ``max_new_tokens``;
* **when to stop** ([`Sequence.append`][minispec.core.sequence.Sequence.append]): at an EOS id, a
  stop id, a stop string, the token budget or the context limit -- even in the middle of an
  accepted block;
* **its own random stream**: one ``torch.Generator`` made once from ``sampling.seed`` and never
  reseeded (not even on preemption), so a request draws the same numbers in either loop.

A sequence also records where it lives while it runs (its KV cache slots and how many positions the
draft cache holds, ``draft_len``) and what happened (``generated``, ``rounds``, ``stats``, the
finish reason, and the error message of a request that failed alone). Bookkeeping only: pure Python,
plus the generator.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from minispec.core.sampling import SamplingParams, is_int
from minispec.core.stats import SpecStats

__all__ = ["FINISH_REASONS", "Round", "Sequence", "SequenceStatus", "round_k"]

#: Why a request ended: the token budget, an EOS id, a stop id or string, the context limit, an
#: error of its own (the message is in ``Sequence.error``),
#: [`Engine.abort`][minispec.serving.engine.Engine.abort], or its grammar accepting no more tokens.
FINISH_REASONS = ("length", "eos", "stop", "max_seq_len", "error", "abort", "grammar")


class SequenceStatus(enum.Enum):
    """Where a request is: queued, in the running batch, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class Round:
    """One draft-verify round, for traces: the drafts, how many were accepted, what was emitted."""

    drafts: list[int]
    num_accepted: int
    emitted: list[int]


def round_k(k: int, num_tokens: int, num_generated: int, max_new_tokens: int,
            max_seq_len: int) -> int:
    """Drafts one round may propose.

    A round feeds ``[last, d_1..d_k]`` at positions ``n-1..n-1+k`` and yields up to ``k + 1``
    tokens, so ``k`` shrinks to keep ``n + k + 1 <= max_seq_len`` and to not draft past
    ``max_new_tokens``.

    Args:
        k: the drafts asked for (0: plain decoding).
        num_tokens: ``n``, prompt plus generated.
        num_generated: tokens generated so far.
        max_new_tokens: the token budget.
        max_seq_len: the context limit.

    Returns:
        The round's ``k``, in ``0..k``.
    """
    return max(0, min(k, max_seq_len - num_tokens - 1, max_new_tokens - num_generated - 1))


def as_token_ids(ids: Iterable[Any], what: str, vocab_size: int) -> list[int]:
    """``ids`` as Python ints, each a true integer in ``[0, vocab_size)``; ``ValueError`` naming
    ``what`` otherwise (also when ``ids`` is not a sequence at all)."""
    if not isinstance(ids, Iterable):
        raise ValueError(f"{what} must be a sequence of integers, got {ids!r}")
    out = []
    for i in ids:
        if isinstance(i, bool) or isinstance(i, float):
            raise ValueError(f"{what} must be integers, got {i!r}")
        try:
            i = operator.index(i)
        except TypeError:
            raise ValueError(f"{what} must be integers, got {i!r}") from None
        if not 0 <= i < vocab_size:
            raise ValueError(f"{what} must lie in [0, {vocab_size}) (the vocabulary), got {i}")
        out.append(i)
    return out


@dataclass(eq=False)
class Sequence:
    """One request's state (see the module docstring). Make one with
    [`Sequence.new`][minispec.core.sequence.Sequence.new].

    Attributes:
        request_id: unique name of the request.
        prompt: prompt token ids (at least one).
        sampling: the adjustments applied to both models' logits, and the seed of ``generator``.
        max_new_tokens: at most this many new tokens.
        max_seq_len: limit on prompt + new tokens.
        eos_token_ids: ids that end the request with ``finish_reason="eos"`` (may be empty).
        stop_token_ids: extra ids that end it with ``"stop"`` (kept in the output).
        stop: stop strings (need ``tokenizer``); the text is cut before the first one.
        tokenizer: decodes the output and matches stop strings (optional).
        tenant: who sent it (``None``: nobody in particular); a drafter that shares text between
            requests drafts it only from its own tenant's (see
            [`SuffixStore`][minispec.extra_drafters.suffix.SuffixStore]).
        constraint: its grammar ([`Constraint`][minispec.core.constraint.Constraint]), or
            ``None``: told every appended token, it ends the request with ``"grammar"`` when it
            accepts no more.
    """

    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    max_new_tokens: int = 64
    max_seq_len: int = 2048
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    tokenizer: Any = None
    device: torch.device | str = "cpu"
    generated: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    error: str | None = None
    slot: int | None = None          # target KV cache slot while running
    draft_slot: int | None = None    # draft KV cache slot while running (drafters with a model)
    draft_len: int = 0               # context positions held by the draft cache
    num_cached: int = 0              # context positions the target cache holds (prefill, rounds)
    stats: SpecStats = field(default_factory=SpecStats)
    rounds: list[Round] = field(default_factory=list)
    tenant: str | None = None
    constraint: Any = None

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
        self.generator = self.sampling.make_generator(self.device)   # made once, never reseeded

    @classmethod
    def new(cls, request_id: str, prompt: Iterable[Any], sampling: SamplingParams | None, *,
            max_new_tokens: Any, max_seq_len: int, vocab_size: int,
            eos_token_ids: int | Iterable[Any] = (), stop_token_ids: int | Iterable[Any] = (),
            stop: str | Iterable[str] = (), tokenizer: Any = None, k: int = 0,
            device: torch.device | str = "cpu") -> Sequence:
        """A validated request: every check a request gets, in both loops, is here.

        ``eos_token_ids`` and ``stop_token_ids`` take one id or several.

        Raises:
            ValueError: naming what is wrong (ids outside the vocabulary or not integers, a
                non-integral or negative ``max_new_tokens``, empty stop strings, stop strings
                without a tokenizer, a prompt longer than ``max_seq_len``, a bad
                ``SamplingParams``).
        """
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams or None, got {sampling!r}")
        if not is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if not isinstance(stop, (str, list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
        if tokenizer is not None and not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"tokenizer must have a decode method (a Hugging Face tokenizer), "
                            f"got {type(tokenizer).__name__}")
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        if stops and tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        # one id is accepted for eos_token_ids and stop_token_ids alike (as ``eos_token_id=5``)
        eos_token_ids, stop_token_ids = ((ids,) if is_int(ids) else ids
                                         for ids in (eos_token_ids, stop_token_ids))
        prompt = as_token_ids(prompt, "prompt token ids", vocab_size)
        if len(prompt) > max_seq_len:
            raise ValueError(f"the prompt has {len(prompt)} tokens but max_seq_len is "
                             f"{max_seq_len}")
        return cls(str(request_id), prompt, sampling or SamplingParams(temperature=0.0),
                   max_new_tokens, max_seq_len,
                   frozenset(as_token_ids(eos_token_ids, "eos_token_id", vocab_size)),
                   frozenset(as_token_ids(stop_token_ids, "stop_token_ids", vocab_size)),
                   stops, tokenizer, device, stats=SpecStats(k=k))

    # ------------------------------------------------------------------ state

    @property
    def context(self) -> list[int]:
        """Prompt plus generated tokens: everything accepted so far."""
        return self.prompt + self.generated

    @property
    def num_tokens(self) -> int:
        """``n = len(context)``."""
        return len(self.prompt) + len(self.generated)

    @property
    def prefill_left(self) -> int:
        """Context positions the target prefill has still to write before the next round (all but
        the last token is cached between rounds)."""
        return self.num_tokens - 1 - self.num_cached

    @property
    def tokens_left(self) -> int:
        """The most tokens it may still generate (its budget, and the context limit)."""
        return min(self.max_new_tokens - len(self.generated), self.max_seq_len - self.num_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def round_k(self, k: int) -> int:
        """Drafts this sequence may propose in its next round (see
        [`round_k`][minispec.core.sequence.Sequence.round_k])."""
        return round_k(k, self.num_tokens, len(self.generated), self.max_new_tokens,
                       self.max_seq_len)

    def round_len(self, k: int) -> int:
        """Cache positions its next round needs: ``n - 1`` cached plus ``k_round + 1`` fed."""
        return self.num_tokens + self.round_k(k)

    def max_len(self) -> int:
        """The most cache positions this request can ever hold (its worst-case ``round_len``)."""
        return max(len(self.prompt),
                   min(len(self.prompt) + self.max_new_tokens - 1, self.max_seq_len - 1))

    def done_before_start(self) -> str | None:
        """The finish reason of a request that ends before any round, else ``None``."""
        if self.max_new_tokens == 0:
            return "length"
        if self.constraint is not None and self.constraint.finished:
            return "grammar"
        return "max_seq_len" if self.num_tokens >= self.max_seq_len else None

    # ------------------------------------------------------------------ the stop rules

    def append(self, tokens: list[int], drafts: list[int], num_accepted: int) -> list[int]:
        """Append a verdict's tokens, stopping exactly at the first stop condition; returns the
        emitted.

        The conditions, checked token by token inside the accepted block: an EOS id (``"eos"``), a
        stop id or a completed stop string (``"stop"``), a grammar that accepts no more tokens
        (``"grammar"``; the constraint is committed each token), ``max_new_tokens``
        (``"length"``); after the block, a full context (``"max_seq_len"``). The round is
        recorded in ``rounds``.
        """
        emitted, finish = [], None
        for token in tokens:
            emitted.append(token)
            self.generated.append(token)
            if self.constraint is not None and token not in self.eos_token_ids:
                self.constraint.commit([token])
            if token in self.eos_token_ids:
                finish = "eos"
            elif token in self.stop_token_ids or (self.stop and self._hits_stop()):
                finish = "stop"
            elif self.constraint is not None and self.constraint.finished:
                finish = "grammar"
            elif len(self.generated) >= self.max_new_tokens:
                finish = "length"
            else:
                continue
            break
        if finish is None and self.num_tokens >= self.max_seq_len:
            finish = "max_seq_len"
        self.rounds.append(Round(list(drafts), num_accepted, emitted))
        if finish is not None:
            self.finish(finish)
        return emitted

    def _hits_stop(self) -> bool:
        """Did the last token complete a stop string? (Only the tail of the text is decoded.)"""
        window = self.generated[-(max(len(s) for s in self.stop) + 8):]
        tail, before = self.tokenizer.decode(window), self.tokenizer.decode(window[:-1])
        return any(s in tail and s not in before for s in self.stop)

    def text(self) -> str | None:
        """The generated text, cut before the first stop string (``None`` without a tokenizer)."""
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(self.generated)
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text

    # ------------------------------------------------------------------ lifecycle

    def finish(self, reason: str) -> None:
        """Mark the request done with one of `FINISH_REASONS`."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stats.new_tokens = len(self.generated)

    def fail(self, error: BaseException | str) -> None:
        """End this request alone with ``finish_reason="error"``; the message goes to ``error``."""
        self.error = (str(error) if isinstance(error, (str, ValueError))
                      else f"{type(error).__name__}: {error}")
        self.finish("error")

    def preempt(self) -> None:
        """Forget the cache state (preemption by recompute); generated tokens are kept.

        The request will prefill ``prompt + generated`` again when readmitted. Its generator and its
        drafter state are kept.
        """
        self.status = SequenceStatus.WAITING
        self.slot = self.draft_slot = None
        self.draft_len = self.num_cached = 0
        self.stats.preemptions += 1
