"""The continuous-batching scheduler: who runs this step, and who waits (vLLM's names).

Requests queue in ``waiting`` (FIFO) and move to ``running`` when admitted; every step the engine
runs one speculative round for every running sequence.
[`Scheduler.schedule`][minispec.serving.scheduler.Scheduler.schedule] does, in order:

1. **retire** finished sequences (their cache slots and blocks go back to the pool);
2. **reserve** the positions each running sequence's round will write (``n + k_round``: the
   ``n - 1`` cached ones plus ``[last, d_1..d_k]``), oldest first. When the pool runs out it
   **preempts by recompute**: the newest running sequence loses its slots and goes back to the
   *front* of ``waiting`` with its generated tokens kept; when readmitted it prefills
   ``prompt + generated`` again. A request is never lost;
3. **admit** waiting requests in arrival order while the batch has room (``max_batch_size``) and
   the pool can hold their prompt plus one round *and still keep a watermark of free blocks*
   (nothing is admitted in a step that preempted). The watermark is what stops preemption thrash:
   a request preempted for lack of blocks is not readmitted into the same shortage at once, only
   when the pool has some slack again.

The engine hands a finished (or aborted) request back at once with
[`Scheduler.release`][minispec.serving.scheduler.Scheduler.release]; one that could not fit even in
an empty pool is refused by [`Scheduler.add`][minispec.serving.scheduler.Scheduler.add]
(``ValueError``), so the loop above always makes progress. The scheduler is pure Python: it sees the
KV memory only through the six capacity queries of
[`KVCacheSpace`][minispec.serving.scheduler.KVCacheSpace], which answers them on the engine's target
(and draft) ``KVCache`` (a test's fake answers the same six).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minispec.core.sampling import is_int
from minispec.core.sequence import Sequence, SequenceStatus
from minispec.models.block_manager import ceil_div

__all__ = ["KVCacheSpace", "Scheduler", "SchedulerOutput"]


class KVCacheSpace:
    """The capacity queries the scheduler needs, over a target ``KVCache`` and, optionally, the
    draft model's; positions are counted per sequence.

    The two caches are reserved in lockstep (the same positions), so admission and preemption
    account for both pools. Slots are recorded on the sequence (``slot``, ``draft_slot``).
    """

    def __init__(self, target_cache, draft_cache=None) -> None:
        self.target_cache, self.draft_cache = target_cache, draft_cache
        self.caches = [c for c in (target_cache, draft_cache) if c is not None]

    def _pairs(self, seq: Sequence) -> list[tuple[object, int]]:
        pairs = ((self.target_cache, seq.slot), (self.draft_cache, seq.draft_slot))
        return [(cache, slot) for cache, slot in pairs if cache is not None]

    def can_fit(self, num_positions: int) -> bool:
        """Could one sequence of ``num_positions`` fit in the empty pool? (checked at add)"""
        return all(num_positions <= c.max_seq_len
                   and ceil_div(num_positions, c.block_size) <= c.num_blocks for c in self.caches)

    def can_allocate(self, num_positions: int, watermark_blocks: int = 0) -> bool:
        """Is there a free slot and room for a new sequence of ``num_positions`` right now, leaving
        at least ``watermark_blocks`` free blocks in each pool?"""
        return all(cache.can_allocate(num_positions)
                   and (cache.num_free_blocks - ceil_div(num_positions, cache.block_size)
                        >= watermark_blocks)
                   for cache in self.caches)

    def allocate(self, seq: Sequence, num_positions: int) -> None:
        """Give ``seq`` its slot(s) and reserve ``num_positions`` positions."""
        seq.slot = self.target_cache.allocate()
        if self.draft_cache is not None:
            seq.draft_slot = self.draft_cache.allocate()
        self.grow(seq, num_positions)

    def can_grow(self, seq: Sequence, num_positions: int) -> bool:
        """Could ``seq`` hold ``num_positions`` positions (its reservation grown)?"""
        return all(cache.can_grow(slot, num_positions) for cache, slot in self._pairs(seq))

    def grow(self, seq: Sequence, num_positions: int) -> None:
        """Reserve room so ``seq`` holds ``num_positions`` positions."""
        for cache, slot in self._pairs(seq):
            cache.grow(slot, num_positions)

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s slot(s) and memory."""
        for cache, slot in self._pairs(seq):
            cache.free(slot)
        seq.slot = seq.draft_slot = None


@dataclass
class SchedulerOutput:
    """One step's decisions.

    Attributes: running — the batch of this step, oldest first (includes ``admitted``);
    admitted — newly admitted sequences (they need a target prefill); preempted — sequences sent
    back to ``waiting`` this step; retired — finished sequences whose memory was released.
    """

    running: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    retired: list[Sequence] = field(default_factory=list)


class Scheduler:
    """Waiting and running queues, admission, reservation and preemption (module docstring).

    Args:
        space: the KV memory, seen through its capacity queries
            ([`KVCacheSpace`][minispec.serving.scheduler.KVCacheSpace], or a fake with the same
            methods).
        max_batch_size: most sequences running at once.
        k: drafts per round (0 for plain decoding); a round of a sequence with ``n`` tokens
            reserves ``n + k_round`` positions (``k_round`` shrinks near the limits).
        watermark_blocks: free blocks that admission must leave in each pool (default 0; the
            engine keeps a hundredth of a paged pool, at least one block, as vLLM does).
        extra_positions: positions a round stores beyond a chain's ``k + 1`` (a draft tree's
            other nodes, kept until compaction; 0 for chains).
    """

    def __init__(self, space: KVCacheSpace, max_batch_size: int, k: int, watermark_blocks: int = 0,
                 extra_positions: int = 0) -> None:
        for name, value, low in (("max_batch_size", max_batch_size, 1), ("k", k, 0),
                                 ("watermark_blocks", watermark_blocks, 0),
                                 ("extra_positions", extra_positions, 0)):
            if not (is_int(value) and value >= low):
                raise ValueError(f"Scheduler: {name} must be an integer >= {low}, got {value!r}")
        self.space, self.max_batch_size, self.k = space, max_batch_size, k
        self.watermark_blocks, self.extra_positions = watermark_blocks, extra_positions
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; ValueError if it could never fit, even alone in an empty pool."""
        need = seq.max_len() + self.extra_positions
        if not self.space.can_fit(need):
            raise ValueError(
                f"request {seq.request_id!r} can never fit: it may need {need} cache positions "
                f"(prompt {len(seq.prompt)} + max_new_tokens {seq.max_new_tokens}), more than the "
                "whole KV pool holds; raise num_blocks or lower max_new_tokens"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running (finished ones are retired on schedule)."""
        return bool(self.waiting) or any(not s.is_finished for s in self.running)

    def release(self, seq: Sequence) -> None:
        """Take ``seq`` out of either queue now and free its memory: a finished (or aborted)
        request, or one being preempted.

        The engine calls it as soon as a request finishes, so its blocks are free at once;
        ``schedule`` still retires, once per step, anything that finished without being
        released."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self.space.free(seq)

    def retire(self) -> list[Sequence]:
        """Release the memory of finished running sequences; return them."""
        done = [s for s in self.running if s.is_finished]
        for seq in done:
            self.release(seq)
        return done

    def schedule(self) -> SchedulerOutput:
        """Retire, reserve this round for every running sequence (preempting), admit; see above."""
        out = SchedulerOutput(retired=self.retire())
        out.preempted = self._reserve_running()
        if not out.preempted:
            out.admitted = self._admit()
        if self.waiting and not self.running:
            raise RuntimeError("the scheduler is stuck: nothing runs and the next request "
                               "does not fit")
        out.running = list(self.running)
        return out

    def _round_len(self, seq: Sequence) -> int:
        return seq.round_len(self.k) + self.extra_positions

    def _reserve_running(self) -> list[Sequence]:
        """Grow every running sequence for its round, oldest first; preempt the newest if short
        (recompute preemption: its memory is freed, its tokens kept, and it is first in line)."""
        preempted: list[Sequence] = []
        i = 0
        while i < len(self.running):
            seq, need = self.running[i], self._round_len(self.running[i])
            while not self.space.can_grow(seq, need):
                victim = self.running[-1]
                self.release(victim)
                victim.preempt()
                self.waiting.appendleft(victim)
                self.num_preemptions += 1
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.space.grow(seq, need)
                i += 1
        return preempted

    def _admit(self) -> list[Sequence]:
        """Admit waiting sequences in order while the batch and the pool have room."""
        first = len(self.running)
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            need = self._round_len(seq)
            if not self.space.can_allocate(need, self.watermark_blocks if self.running else 0):
                break
            self.waiting.popleft()
            self.space.allocate(seq, need)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        return self.running[first:]
