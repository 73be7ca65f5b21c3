"""Paged KV memory bookkeeping: a pool of fixed-size blocks and one block table per sequence.

A paged cache (vLLM's PagedAttention) does not reserve ``max_seq_len`` positions per sequence up
front. Memory is cut into ``num_blocks`` blocks of ``block_size`` token positions each, and every
sequence owns a *block table*: the list of block ids that hold its positions in order. Position
``p`` of a sequence lives in block ``block_table[p // block_size]`` at offset ``p % block_size``,
so its flat index in the pool is ``block_id * block_size + offset`` (``slot_mapping``).

Blocks are taken from the pool only when a sequence grows into them (``grow``), and given back when
a speculative round is rolled back (``truncate_to``) or the sequence ends (``free``). Rollback to
``n`` positions keeps the first ``ceil(n / block_size)`` blocks and frees every block whose first
position is ``>= n``; a partly used last block is kept (its stale tail is overwritten later).

This module is pure Python: it knows nothing of tensors. ``minispec.models.paged_cache`` builds on
it.
"""

from __future__ import annotations

import heapq

__all__ = ["BlockManager", "ceil_div"]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (no float rounding for large ``a``): the blocks ``a`` positions
    occupy in blocks of ``b``."""
    return -(-a // b)


class BlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` positions, shared by many sequences.

    Args:
        num_blocks: blocks in the pool (the whole KV memory is num_blocks * block_size positions).
        block_size: token positions per block.

    Each sequence (any hashable ``seq_id``, e.g. a cache slot) has a block table and a *reserved
    length*: the positions it may write, set by ``grow`` and lowered by ``truncate_to``. Every
    block carries a reference count (how many block tables hold it); without prefix sharing it is
    1 for a used block and 0 for a free one. A block returns to the pool when its count hits 0.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"BlockManager: {name} must be a positive integer, got {v!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: list[int] = list(range(num_blocks))  # a min-heap: the lowest free id first
        self.ref_count: list[int] = [0] * num_blocks  # block id -> number of tables holding it
        self._tables: dict[object, list[int]] = {}  # seq_id -> block ids, in position order
        self._lengths: dict[object, int] = {}  # seq_id -> reserved positions

    # ------------------------------------------------------------------ queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the pool that no sequence holds."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence
        (``num_free_blocks + num_used_blocks == num_blocks``)."""
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_positions: int) -> int:
        """Blocks a sequence of ``num_positions`` positions occupies: ceil(n / block_size)."""
        return ceil_div(num_positions, self.block_size)

    def block_table(self, seq_id) -> list[int]:
        """A copy of ``seq_id``'s block table (block ids in position order)."""
        return list(self._table(seq_id))

    def length(self, seq_id) -> int:
        """Positions reserved for ``seq_id`` (by ``grow``, lowered by ``truncate_to``)."""
        self._table(seq_id)
        return self._lengths[seq_id]

    @property
    def seq_ids(self) -> list:
        """Every sequence that currently has a block table."""
        return list(self._tables)

    def slot_mapping(self, seq_id, positions) -> list[int]:
        """Flat pool index ``block_id * block_size + offset`` of each position of ``seq_id``.

        Args: positions — list (or range) of ints, each in [0, capacity) where capacity is
        ``len(block_table) * block_size``. Raises ValueError for a position outside it.
        """
        table, bs = self._table(seq_id), self.block_size
        if outside := [p for p in positions if not 0 <= p < len(table) * bs]:
            raise ValueError(f"sequence {seq_id!r}: position {outside[0]} is outside its "
                             f"{len(table)} blocks ({len(table) * bs} positions); grow it first")
        return [table[p // bs] * bs + p % bs for p in positions]  # which block, then where in it

    # ------------------------------------------------------------------ lifecycle

    def allocate(self, seq_id) -> None:
        """Start ``seq_id`` with an empty block table (no block is taken yet)."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has a block table")
        self._tables[seq_id] = []
        self._lengths[seq_id] = 0

    def can_grow(self, seq_id, new_len: int) -> bool:
        """Whether ``grow(seq_id, new_len)`` would succeed (enough free blocks)."""
        return self.blocks_needed(new_len) - len(self._table(seq_id)) <= self.num_free_blocks

    def grow(self, seq_id, new_len: int) -> None:
        """Append blocks so that ``seq_id`` can hold ``new_len`` positions (reserve before a write).

        Never shrinks: a ``new_len`` below the reserved length changes nothing. Raises
        RuntimeError ("out of KV blocks") and takes nothing if the pool is too small.
        """
        table = self._table(seq_id)
        if new_len < 0:
            raise ValueError(f"sequence {seq_id!r}: cannot grow to {new_len} positions")
        missing = self.blocks_needed(new_len) - len(table)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: sequence {seq_id!r} needs {missing} more "
                               f"block(s) for {new_len} positions, {self.num_free_blocks} of "
                               f"{self.num_blocks} are free")
        for _ in range(missing):
            block = heapq.heappop(self._free)
            self.ref_count[block] += 1
            table.append(block)
        self._lengths[seq_id] = max(self._lengths[seq_id], new_len)

    def truncate_to(self, seq_id, n: int) -> list[int]:
        """Rollback: keep ``seq_id``'s first ``n`` positions, free every block starting at >= n.

        The first ``ceil(n / block_size)`` blocks are kept (the last one may be partly used);
        the rest return to the pool. Raises ValueError if n < 0 or n > the reserved length.
        Returns the ids of the blocks released.
        """
        table = self._table(seq_id)
        if not 0 <= n <= self._lengths[seq_id]:
            raise ValueError(f"cannot truncate sequence {seq_id!r} of length "
                             f"{self._lengths[seq_id]} to {n}")
        keep = self.blocks_needed(n)
        released = table[keep:]
        del table[keep:]
        for block in released:  # one reference fewer: back to the pool when no table holds it
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                heapq.heappush(self._free, block)
        self._lengths[seq_id] = n
        return released

    def free(self, seq_id) -> None:
        """End ``seq_id``: release all its blocks and forget its table."""
        self.truncate_to(seq_id, 0)  # every block goes back
        del self._tables[seq_id], self._lengths[seq_id]

    # ------------------------------------------------------------------ internals

    def _table(self, seq_id) -> list[int]:
        if seq_id not in self._tables:
            raise ValueError(f"sequence {seq_id!r} has no block table (allocate it first)")
        return self._tables[seq_id]
