"""BlockManager: pure-Python paged-KV bookkeeping (block pool, block tables, rollback)."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minispec.models.block_manager import BlockManager


def test_bad_sizes():
    for num_blocks, block_size in ((0, 4), (4, 0), (-1, 4)):
        with pytest.raises(ValueError, match="positive"):
            BlockManager(num_blocks, block_size)


def test_unknown_and_duplicate_sequences():
    bm = BlockManager(4, 2)
    for call in (
        lambda: bm.grow("x", 1),
        lambda: bm.can_grow("x", 1),
        lambda: bm.truncate_to("x", 0),
        lambda: bm.free("x"),
        lambda: bm.block_table("x"),
        lambda: bm.length("x"),
        lambda: bm.slot_mapping("x", [0]),
    ):
        with pytest.raises(ValueError, match="no block table"):
            call()
    bm.allocate("a")
    with pytest.raises(ValueError, match="already"):
        bm.allocate("a")


def test_grow_maps_positions_through_the_block_table():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a")
    bm.allocate("b")
    assert bm.block_table("a") == [] and bm.num_free_blocks == 8  # allocate takes no block
    bm.grow("a", 6)  # positions 0..5: two blocks
    bm.grow("b", 3)
    bm.grow("a", 9)  # a third block for position 8
    assert bm.block_table("a") == [0, 1, 3] and bm.block_table("b") == [2]
    assert bm.length("a") == 9 and bm.num_used_blocks == 4 and bm.num_free_blocks == 4
    # position p -> block_table[p // 4] * 4 + p % 4
    assert bm.slot_mapping("a", [0, 5, 8, 11]) == [0, 5, 12, 15]
    assert bm.slot_mapping("b", [1]) == [9]
    with pytest.raises(ValueError, match="grow it first"):
        bm.slot_mapping("a", [12])
    with pytest.raises(ValueError, match="grow it first"):
        bm.slot_mapping("a", [-1])
    bm.grow("a", 2)  # never shrinks
    assert bm.block_table("a") == [0, 1, 3] and bm.length("a") == 9
    assert [bm.ref_count[b] for b in range(8)] == [1, 1, 1, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="grow"):
        bm.grow("a", -1)


def test_truncate_frees_blocks_starting_at_or_after_n():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a")
    bm.grow("a", 12)  # blocks 0, 1, 2 hold positions 0-3, 4-7, 8-11
    assert bm.truncate_to("a", 5) == [2]  # block 1 starts at 4 < 5: kept, partly used
    assert bm.block_table("a") == [0, 1] and bm.length("a") == 5
    assert bm.truncate_to("a", 4) == [1]  # block 1 starts at 4 >= 4: freed
    assert bm.truncate_to("a", 4) == []  # no-op
    with pytest.raises(ValueError, match="truncate"):
        bm.truncate_to("a", 5)  # past the length
    with pytest.raises(ValueError, match="truncate"):
        bm.truncate_to("a", -1)
    assert bm.truncate_to("a", 0) == [0]
    assert bm.num_free_blocks == 8 and bm.ref_count == [0] * 8


def test_out_of_blocks_takes_nothing_and_freed_blocks_are_reused():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate("a")
    bm.allocate("b")
    bm.grow("a", 4)
    assert bm.can_grow("b", 2) and not bm.can_grow("b", 3)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.grow("b", 3)
    assert bm.block_table("b") == [] and bm.length("b") == 0 and bm.num_free_blocks == 1
    bm.free("a")
    assert bm.seq_ids == ["b"] and bm.num_free_blocks == 3
    bm.grow("b", 5)
    assert bm.block_table("b") == [0, 1, 2]  # the lowest free ids first
    assert bm.blocks_needed(0) == 0 and bm.blocks_needed(5) == 3


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / grow / truncate_to / free sequences against the pool's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self.next_id = 0

    @precondition(lambda self: self.bm is None)
    @rule(num_blocks=st.integers(1, 12), block_size=st.integers(1, 5))
    def start(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size)

    @precondition(lambda self: self.bm is not None)
    @rule()
    def allocate(self):
        self.bm.allocate(self.next_id)
        self.next_id += 1

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data(), new_len=st.integers(0, 40))
    def grow(self, data, new_len):
        seq = data.draw(st.sampled_from(self.bm.seq_ids))
        before, length = self.bm.block_table(seq), self.bm.length(seq)
        if self.bm.can_grow(seq, new_len):
            self.bm.grow(seq, new_len)
            assert self.bm.block_table(seq)[: len(before)] == before  # only appends
            assert self.bm.length(seq) == max(length, new_len)
        else:
            free = self.bm.num_free_blocks
            with pytest.raises(RuntimeError, match="out of KV blocks"):
                self.bm.grow(seq, new_len)
            assert self.bm.block_table(seq) == before and self.bm.num_free_blocks == free

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def truncate(self, data):
        seq = data.draw(st.sampled_from(self.bm.seq_ids))
        length, before = self.bm.length(seq), self.bm.block_table(seq)
        n = data.draw(st.integers(0, length + 2))
        if n > length:
            with pytest.raises(ValueError, match="truncate"):
                self.bm.truncate_to(seq, n)
            assert self.bm.block_table(seq) == before
            return
        free = self.bm.num_free_blocks
        released = self.bm.truncate_to(seq, n)
        bs = self.bm.block_size
        # exactly the blocks whose first position i * bs is >= n are freed, in order
        assert released == [b for i, b in enumerate(before) if i * bs >= n]
        assert self.bm.block_table(seq) == [b for i, b in enumerate(before) if i * bs < n]
        assert len(self.bm.block_table(seq)) == math.ceil(n / bs)
        assert self.bm.num_free_blocks == free + len(released)

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def free(self, data):
        self.bm.free(data.draw(st.sampled_from(self.bm.seq_ids)))

    @invariant()
    def accounting(self):
        if self.bm is None:
            return
        bm = self.bm
        tables = {s: bm.block_table(s) for s in bm.seq_ids}
        held = [b for t in tables.values() for b in t]
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert len(held) == len(set(held)) == bm.num_used_blocks  # no block in two tables
        for block in range(bm.num_blocks):
            assert bm.ref_count[block] == held.count(block)
        for s, t in tables.items():
            assert len(t) == math.ceil(bm.length(s) / bm.block_size)

    def teardown(self):
        if self.bm is None:
            return
        for s in self.bm.seq_ids:
            self.bm.free(s)
        assert self.bm.num_free_blocks == self.bm.num_blocks  # nothing leaked
        assert self.bm.ref_count == [0] * self.bm.num_blocks


BlockManagerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_block_manager_state_machine = BlockManagerMachine.TestCase
