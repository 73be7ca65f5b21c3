"""The continuous-batching scheduler on its own: no model, no tensors, a fake block pool."""

from __future__ import annotations

import random

import pytest

from minispec.core.sampling import SamplingParams
from minispec.core.sequence import Sequence, SequenceStatus, round_k
from minispec.serving.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0.0)


class FakeSpace:
    """A pool of ``num_blocks`` blocks of ``block_size`` positions and ``num_slots`` slots."""

    def __init__(self, num_blocks: int, block_size: int = 4, num_slots: int = 100) -> None:
        self.num_blocks, self.block_size, self.num_slots = num_blocks, block_size, num_slots
        self.held: dict[str, int] = {}       # request id -> blocks held
        self.next_slot = 0

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - sum(self.held.values())

    def _blocks(self, n: int) -> int:
        return -(-n // self.block_size)

    def can_fit(self, n: int) -> bool:
        return self._blocks(n) <= self.num_blocks

    def can_allocate(self, n: int, watermark_blocks: int = 0) -> bool:
        return (len(self.held) < self.num_slots
                and self._blocks(n) + watermark_blocks <= self.free_blocks)

    def allocate(self, seq: Sequence, n: int) -> None:
        assert seq.request_id not in self.held
        seq.slot, self.next_slot = self.next_slot, self.next_slot + 1
        self.held[seq.request_id] = 0
        self.grow(seq, n)

    def can_grow(self, seq: Sequence, n: int) -> bool:
        return self._blocks(n) - self.held[seq.request_id] <= self.free_blocks

    def grow(self, seq: Sequence, n: int) -> None:
        assert self.can_grow(seq, n)
        self.held[seq.request_id] = max(self.held[seq.request_id], self._blocks(n))

    def free(self, seq: Sequence) -> None:
        del self.held[seq.request_id]
        seq.slot = None


def make_seq(rid: str, prompt_len: int, max_new: int = 8, limit: int = 64) -> Sequence:
    return Sequence(rid, list(range(1, prompt_len + 1)), GREEDY, max_new_tokens=max_new,
                    max_seq_len=limit)


def fake_round(seq: Sequence, tokens: int, limit: int) -> None:
    """Pretend a round emitted ``tokens`` tokens; finish the sequence at its budget or the limit."""
    for _ in range(tokens):
        seq.generated.append(7)
        if len(seq.generated) >= seq.max_new_tokens or seq.num_tokens >= limit:
            seq.finish("length")
            return


def test_round_k_shrinks_like_the_single_sequence_loop():
    assert round_k(4, num_tokens=10, num_generated=0, max_new_tokens=64, max_seq_len=100) == 4
    assert round_k(4, num_tokens=97, num_generated=0, max_new_tokens=64, max_seq_len=100) == 2
    assert round_k(4, num_tokens=99, num_generated=0, max_new_tokens=64, max_seq_len=100) == 0
    assert round_k(4, num_tokens=10, num_generated=62, max_new_tokens=64, max_seq_len=100) == 1
    assert round_k(0, num_tokens=10, num_generated=0, max_new_tokens=64, max_seq_len=100) == 0


def test_admits_fifo_up_to_max_batch_size():
    sched = Scheduler(FakeSpace(num_blocks=100), max_batch_size=2, k=2)
    seqs = [make_seq(str(i), 3) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert out.admitted == seqs[:2] and out.running == seqs[:2]
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]
    assert list(sched.waiting) == seqs[2:]
    # Prompt (3) + one round of k=2 drafts is reserved: 5 positions = 2 blocks of 4.
    assert sched.space.held == {"0": 2, "1": 2}


def test_admission_waits_for_blocks_and_keeps_order():
    space = FakeSpace(num_blocks=4)
    sched = Scheduler(space, max_batch_size=8, k=1)
    big, small = make_seq("big", 10, max_new=2), make_seq("small", 1)
    running = make_seq("first", 6)
    for seq in (running, big, small):
        sched.add(seq)
    out = sched.schedule()
    # "first" takes 2 blocks (7 positions); "big" needs 3 and does not fit: "small" must not
    # jump the queue (FIFO), so nothing else is admitted.
    assert out.admitted == [running] and list(sched.waiting) == [big, small]
    running.finish("eos")
    out = sched.schedule()
    assert out.retired == [running] and out.admitted == [big, small]


def test_retire_frees_slots():
    space = FakeSpace(num_blocks=10)
    sched = Scheduler(space, max_batch_size=4, k=2)
    seq = make_seq("a", 5)
    sched.add(seq)
    sched.schedule()
    seq.finish("length")
    assert sched.retire() == [seq]
    assert space.held == {} and seq.slot is None and not sched.has_unfinished()


def test_preempts_the_newest_and_requeues_it_first():
    space = FakeSpace(num_blocks=6, block_size=4)
    sched = Scheduler(space, max_batch_size=4, k=3)
    a, b, c = (make_seq(name, 4, max_new=20) for name in "abc")
    for seq in (a, b, c):
        sched.add(seq)
    out = sched.schedule()                       # each reserves 4 + 3 = 7 positions: 2 blocks
    assert out.admitted == [a, b, c] and space.free_blocks == 0
    fake_round(a, 4, 64)                         # a now needs 8 + 3 = 11 positions: 3 blocks
    out = sched.schedule()
    assert out.preempted == [c] and out.admitted == [] and out.running == [a, b]
    assert c.status is SequenceStatus.WAITING and c.slot is None and list(sched.waiting) == [c]
    assert c.generated == [] and c.stats.preemptions == 1
    # The preempted request keeps its generated tokens and comes back when there is room.
    b.finish("eos")
    out = sched.schedule()
    assert out.admitted == [c] and c.status is SequenceStatus.RUNNING


def test_a_sequence_that_cannot_grow_preempts_itself_when_newest():
    space = FakeSpace(num_blocks=4, block_size=4)
    sched = Scheduler(space, max_batch_size=4, k=1)
    a, b = make_seq("a", 3, max_new=12), make_seq("b", 3, max_new=12)
    sched.add(a)
    sched.add(b)
    sched.schedule()                             # 4 positions each: 1 block each
    fake_round(b, 6, 64)                         # b (newest) now needs 10 positions: 3 blocks
    fake_round(a, 1, 64)
    out = sched.schedule()
    assert out.preempted == [b] and out.running == [a]
    assert b.generated == [7] * 6                # kept for the recompute


def test_request_that_can_never_fit_is_refused_at_add():
    sched = Scheduler(FakeSpace(num_blocks=2, block_size=4), max_batch_size=4, k=2)
    with pytest.raises(ValueError, match="can never fit"):
        sched.add(make_seq("huge", 6, max_new=10))     # up to 15 positions: 4 blocks > 2
    sched.add(make_seq("ok", 4, max_new=5))            # up to 8 positions: 2 blocks


def test_max_batch_size_is_validated():
    with pytest.raises(ValueError, match="max_batch_size"):
        Scheduler(FakeSpace(4), max_batch_size=0, k=1)


@pytest.mark.parametrize("seed", range(5))
def test_soak_every_request_finishes_and_no_block_leaks(seed):
    rng = random.Random(seed)
    limit, k = 40, rng.choice([0, 1, 3, 5])
    space = FakeSpace(num_blocks=rng.randint(10, 16), block_size=rng.choice([2, 4]))
    sched = Scheduler(space, max_batch_size=rng.randint(1, 6), k=k)
    incoming = [make_seq(str(i), rng.randint(1, 20), max_new=rng.randint(1, 25), limit=limit)
                for i in range(30)]
    admitted_order, steps = [], 0
    while incoming or sched.has_unfinished():
        for _ in range(rng.randint(0, 3)):             # requests arrive while others run
            if incoming:
                seq = incoming.pop(0)
                if space.can_fit(seq.max_len()):
                    sched.add(seq)
        out = sched.schedule()
        admitted_order += [s.request_id for s in out.admitted if s.stats.preemptions == 0]
        assert len(out.running) <= sched.max_batch_size and space.free_blocks >= 0
        for seq in out.running:                        # every running sequence got its round
            assert space.held[seq.request_id] * space.block_size >= seq.round_len(k)
            fake_round(seq, rng.randint(1, seq.round_k(k) + 1), limit)
        steps += 1
        assert steps < 2000
    sched.retire()
    assert space.held == {} and space.free_blocks == space.num_blocks
    assert admitted_order == sorted(admitted_order, key=int)   # first admissions are FIFO


def test_the_watermark_keeps_a_free_block_when_others_run():
    """Admission next to running requests must leave ``watermark_blocks`` free, so a request
    preempted for lack of blocks does not come straight back into the same shortage; a request
    that would run alone is admitted whatever the watermark (no deadlock)."""
    for watermark, admitted_together in ((0, True), (1, False)):
        space = FakeSpace(num_blocks=4, block_size=4)
        sched = Scheduler(space, max_batch_size=4, k=3, watermark_blocks=watermark)
        a, b = make_seq("a", 4, max_new=8), make_seq("b", 4, max_new=8)   # 7 positions: 2 blocks
        sched.add(a)
        sched.add(b)
        out = sched.schedule()
        assert (out.admitted == [a, b]) == admitted_together
        if not admitted_together:
            assert out.admitted == [a] and list(sched.waiting) == [b]
            a.finish("length")
            assert sched.schedule().admitted == [b]
