"""One request inside the continuous-batching engine: its tokens, its state, its random stream.

A :class:`Sequence` is everything the engine and the scheduler know about one request:

* what was asked: the prompt ids, the :class:`~minispec.sampling.SamplingParams`, the token budget
  (``max_new_tokens``) and extra stop token ids;
* what happened: the generated tokens, the status (``WAITING`` -> ``RUNNING`` -> ``FINISHED``,
  and back to ``WAITING`` when preempted), the finish reason, per-request
  :class:`~minispec.stats.SpecStats` and the rounds' trace;
* where it lives: its slot in the target's KV cache and in the draft's KV cache (``None`` while
  waiting), and how many of its context positions the draft cache holds (``draft_len``: the draft
  model is prefilled lazily and lags one token behind after a fully accepted round);
* its own random stream: one ``torch.Generator`` made once from ``sampling.seed`` and never
  reseeded (not even on preemption), so sampled requests keep independent, exact streams;
* the state of a per-request n-gram drafter (``NGramDrafter`` / ``PromptLookupDrafter``), if any.

The bookkeeping is pure Python; the only torch object is the generator.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from minispec.sampling import SamplingParams
from minispec.stats import SpecStats

__all__ = ["Sequence", "SequenceStatus", "round_k"]


class SequenceStatus(enum.Enum):
    """Where a request is: queued, in the running batch, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def round_k(k: int, num_tokens: int, num_generated: int, max_new_tokens: int, max_seq_len: int) -> int:
    """Drafts one round may propose, exactly as :func:`minispec.speculative_generate` shrinks ``k``.

    A round feeds ``[last, d_1..d_k]`` at positions ``n-1..n-1+k`` and yields up to ``k + 1`` tokens,
    so ``k`` shrinks to keep ``n + k + 1 <= max_seq_len`` and to not draft past ``max_new_tokens``.

    Args: k — the engine's drafts per round (0: plain decoding); num_tokens — ``n``, prompt plus
    generated; num_generated / max_new_tokens — the token budget; max_seq_len — the context limit.
    """
    if k == 0:
        return 0
    return max(0, min(k, max_seq_len - num_tokens - 1, max_new_tokens - num_generated - 1))


@dataclass(eq=False)
class Sequence:
    """One request's state (see the module docstring).

    Args:
        request_id: unique name of the request.
        prompt: ``[n]`` prompt token ids (at least one).
        sampling: the adjustments applied to both models' logits, and the seed of ``generator``.
        max_new_tokens: at most this many new tokens.
        stop_token_ids: extra token ids that end the request (kept in the output).
        device: where the generator lives (the target model's device).
        drafter: a per-request deterministic drafter (n-gram, prompt lookup) or ``None``.
    """

    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    max_new_tokens: int = 64
    stop_token_ids: frozenset[int] = frozenset()
    device: torch.device | str = "cpu"
    drafter: Any = None
    generated: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    slot: int | None = None          # target KV cache slot while running
    draft_slot: int | None = None    # draft KV cache slot while running (draft model only)
    draft_len: int = 0               # context positions held by the draft cache
    num_preemptions: int = 0
    stats: SpecStats = field(default_factory=SpecStats)
    rounds: list[Any] = field(default_factory=list)   # minispec.decoding.Round per round
    arrival_time: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
        self.prompt = [int(t) for t in self.prompt]
        self.generator = self.sampling.make_generator(self.device)   # made once, never reseeded

    @property
    def context(self) -> list[int]:
        """Prompt plus generated tokens: everything accepted so far."""
        return self.prompt + self.generated

    @property
    def num_tokens(self) -> int:
        """``n = len(context)``."""
        return len(self.prompt) + len(self.generated)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def round_k(self, k: int, max_seq_len: int) -> int:
        """Drafts this sequence may propose in its next round (see :func:`round_k`)."""
        return round_k(k, self.num_tokens, len(self.generated), self.max_new_tokens, max_seq_len)

    def round_len(self, k: int, max_seq_len: int) -> int:
        """Cache positions its next round needs: ``n - 1`` cached plus ``k_round + 1`` fed."""
        return self.num_tokens + self.round_k(k, max_seq_len)

    def max_len(self, max_seq_len: int) -> int:
        """The most cache positions this request can ever hold (its worst-case ``round_len``)."""
        return max(len(self.prompt), min(len(self.prompt) + self.max_new_tokens - 1, max_seq_len - 1))

    def finish(self, reason: str) -> None:
        """Mark the request done with ``reason`` ("length", "eos", "stop", "max_seq_len")."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stats.new_tokens = len(self.generated)
        self.stats.total_time = time.perf_counter() - self.arrival_time

    def preempt(self) -> None:
        """Forget the cache state (preemption by recompute); generated tokens are kept.

        The request will prefill ``prompt + generated`` again when readmitted. Its generator and
        its n-gram drafter are kept: the drafter sees a continuation of what it ingested.
        """
        self.status = SequenceStatus.WAITING
        self.slot = self.draft_slot = None
        self.draft_len = 0
        self.num_preemptions += 1
