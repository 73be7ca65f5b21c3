"""A paged KV cache: keys and values live in a shared pool of blocks, not in per-slot rows.

Per layer there is one K pool and one V pool of shape (num_blocks, block_size, n_kv, hd). A
``BlockManager`` (pure Python) hands blocks to sequences as they grow, so memory follows the
tokens actually cached instead of ``num_slots * max_seq_len``. The slot bookkeeping (lengths,
rollback checks) is the same ``SequenceTable`` the contiguous cache uses; the block manager is
keyed by slot.

One forward, as in ``minispec.models.kv_cache``:

1. ``prepare`` checks the writes, grows each sequence's block table to cover them (all or
   nothing: RuntimeError "out of KV blocks" and no change if the pool is too small), and turns
   positions into flat pool indices (the *slot mapping*) and block tables into a gather index;
2. ``update`` scatters the new k, v through the slot mapping, then gathers each row's blocks in
   order (``_read``), so attention sees exactly what a contiguous cache would show it;
3. ``commit`` advances the lengths.

Rollback ``truncate_to(slot, n)`` also returns every block whose first position is >= n to the
pool; the partly used last block is kept and its stale tail is masked out and later overwritten.
Compaction after a draft tree (``KVCache.compact``) moves the accepted nodes through the slot
mapping, then truncates: the blocks past the accepted path go back to the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.models.block_manager import BlockManager
from minispec.models.kv_cache import ForwardPlan, KVCache

__all__ = ["PagedKVCache", "PagedPlan"]


@dataclass
class PagedPlan(ForwardPlan):
    """``ForwardPlan`` of a ``PagedKVCache``; its flat index is the pool index ``block_id *
    block_size + offset`` (the slot mapping).

    Attributes: block_tables — (B, max_blocks) the blocks each row reads, in position order
    (rows with fewer blocks are padded with block 0, maybe another sequence's: those columns have
    key position -1, so attention masks them and zeroes them in its gathered copy).
    """

    block_tables: torch.Tensor | None = None


class PagedKVCache(KVCache):
    """A KV cache whose memory is a pool of fixed-size blocks shared by all slots (PagedAttention).

    Args:
        num_layers: transformer layers of the model.
        num_kv_heads: key/value heads per layer.
        head_dim: size of one head.
        num_slots: sequences served at once.
        max_seq_len: most positions one sequence can hold.
        block_size: positions per block.
        num_blocks: blocks in the pool, per layer. Can be fewer than
            ``num_slots * ceil(max_seq_len / block_size)``: then sequences share the memory, and
            a write that finds no free block fails with RuntimeError "out of KV blocks".
        device: where the pools are stored.
        dtype: the pools' element type.
    """

    def __init__(self, num_layers: int, num_slots: int, max_seq_len: int, num_kv_heads: int,
                 head_dim: int, block_size: int = 16, num_blocks: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
                 ) -> None:
        self._setup(num_layers, num_slots, max_seq_len, num_kv_heads, head_dim, device, dtype,
                    block_size, num_blocks)                # sizes and memory checked first
        self.blocks = BlockManager(self.num_blocks, block_size)  # keyed by slot

    # ------------------------------------------------------------------ bookkeeping

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return self.blocks.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by some sequence."""
        return self.blocks.num_used_blocks

    def block_table(self, slot: int) -> list[int]:
        """The block ids holding ``slot``'s positions, in order (a copy)."""
        return self.blocks.block_table(slot)

    def allocate(self) -> int:
        """Start an empty sequence (no block is taken until it is written); returns its slot."""
        slot = self.table.allocate()
        self.blocks.allocate(slot)
        return slot

    def free(self, slot: int) -> None:
        """End ``slot``'s sequence and return all its blocks to the pool."""
        super().free(slot)
        self.blocks.free(slot)

    def truncate_to(self, slot: int, n: int) -> None:
        """Rollback to ``n`` positions, freeing every block whose first position is >= n.

        Also releases blocks reserved by ``grow`` beyond ``n``. ValueError if n < 0 or
        n > length(slot); nothing changes then.
        """
        super().truncate_to(slot, n)  # validates against the cached length
        self.blocks.truncate_to(slot, n)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of ``num_tokens`` positions fits now (a free slot and blocks)."""
        return (super().can_allocate(num_tokens)
                and self.blocks.blocks_needed(num_tokens) <= self.num_free_blocks)

    def can_grow(self, slot: int, new_len: int) -> bool:
        """Whether ``slot`` can hold ``new_len`` positions: within max_seq_len and enough blocks."""
        return super().can_grow(slot, new_len) and self.blocks.can_grow(slot, new_len)

    def grow(self, slot: int, new_len: int) -> None:
        """Take blocks now so that ``slot`` can hold ``new_len`` positions (reserve k+1 before a
        verify). ValueError past max_seq_len; RuntimeError "out of KV blocks" if the pool is short.
        """
        super().grow(slot, new_len)  # the max_seq_len check
        self.blocks.grow(slot, new_len)

    def flat_index(self, slot: int, positions: list[int]) -> list[int]:
        """The pool index of each position: the slot mapping of ``BlockManager``."""
        return self.blocks.slot_mapping(slot, positions)

    # ------------------------------------------------------------------ tensors

    def prepare(self, slots: list[int], positions: torch.Tensor) -> PagedPlan:
        """See ``KVCache.prepare``; also grows block tables and computes the slot mapping.

        Raises RuntimeError ("out of KV blocks") when the pool cannot hold the writes; the cache
        is left unchanged then, as for every ValueError.
        """
        slots, rows = list(slots), positions.tolist()
        new_lengths = self._new_lengths(slots, rows)

        # All or nothing: count the missing blocks of every row before taking any.
        missing = sum(max(0, self.blocks.blocks_needed(n) - len(self.blocks.block_table(s)))
                      for s, n in zip(slots, new_lengths, strict=True))
        if missing > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: this forward needs {missing} more block(s), "
                               f"{self.num_free_blocks} of {self.num_blocks} are free")
        for s, n in zip(slots, new_lengths, strict=True):
            self.blocks.grow(s, n)

        dst, src = self._writes(slots, rows)  # through the slot mapping of the grown tables
        key_positions = self._key_positions(new_lengths)  # (B, S)
        max_blocks = self.blocks.blocks_needed(key_positions.shape[1])
        tables = [self.blocks.block_table(s)[:max_blocks] for s in slots]
        tables = [t + [0] * (max_blocks - len(t)) for t in tables]  # pad short rows with block 0
        block_tables = torch.tensor(tables, dtype=torch.long, device=self.device)
        return PagedPlan(slots, new_lengths, key_positions, dst, src, block_tables)

    def _read(self, pool: torch.Tensor, plan: PagedPlan) -> torch.Tensor:
        """Each row's blocks gathered in order: (B, S, n_kv, hd), as a contiguous cache shows it.

        ``index_select`` copies whole blocks: faster than ``pool[block_tables]`` on CPU.
        """
        B, S = plan.key_positions.shape
        gathered = pool.index_select(0, plan.block_tables.flatten())  # (B * max_blocks, bs, ...)
        return gathered.view(B, -1, *pool.shape[2:])[:, :S]            # (B, S, n_kv, hd)
