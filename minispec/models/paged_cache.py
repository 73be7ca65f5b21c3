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
   order, so attention sees exactly what a contiguous cache would show it;
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
from minispec.models.kv_cache import ForwardPlan, KVCache, SequenceTable, cache_args_for_model

__all__ = ["PagedKVCache", "PagedPlan"]


@dataclass
class PagedPlan(ForwardPlan):
    """``ForwardPlan`` of a ``PagedKVCache``.

    Attributes: dst — (N,) flat pool index ``block_id * block_size + offset`` of every written
    token (the slot mapping); src — (N,) index of those tokens among the B*T new ones, or None when
    no row is padded; block_tables — (B, max_blocks) the blocks each row reads, in position order
    (rows with fewer blocks are padded with block 0, maybe another sequence's: those columns have
    key position -1, so attention masks them and zeroes them in its gathered copy).
    """

    dst: torch.Tensor | None = None
    src: torch.Tensor | None = None
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

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = 16,
        num_blocks: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.table = SequenceTable(num_slots, max_seq_len)
        if num_blocks is None:  # enough for every slot to be full at once
            num_blocks = num_slots * -(-max_seq_len // max(block_size, 1))
        self.blocks = BlockManager(num_blocks, block_size)  # keyed by slot
        self.num_layers = num_layers
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.device = self.k[0].device

    @classmethod
    def for_model(
        cls,
        model,
        num_slots: int = 1,
        max_seq_len: int | None = None,
        block_size: int = 16,
        num_blocks: int | None = None,
        extra: int = 0,
    ) -> PagedKVCache:
        """A paged cache shaped for ``model`` (a ``minispec.models.llama.Llama``), on its device
        and dtype.

        ``max_seq_len`` defaults to, and may not exceed, the model's max_position_embeddings;
        ``num_blocks`` defaults to enough blocks for ``num_slots`` full sequences.
        """
        return cls(num_slots=num_slots, block_size=block_size, num_blocks=num_blocks,
                   **cache_args_for_model(model, max_seq_len, extra))

    # ------------------------------------------------------------------ bookkeeping

    @property
    def block_size(self) -> int:
        """Positions per block."""
        return self.blocks.block_size

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self.blocks.num_blocks

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
        return (
            super().can_allocate(num_tokens)
            and self.blocks.blocks_needed(num_tokens) <= self.num_free_blocks
        )

    def can_grow(self, slot: int, new_len: int) -> bool:
        """Whether ``slot`` can hold ``new_len`` positions: within max_seq_len and enough blocks."""
        return super().can_grow(slot, new_len) and self.blocks.can_grow(slot, new_len)

    def grow(self, slot: int, new_len: int) -> None:
        """Take blocks now so that ``slot`` can hold ``new_len`` positions (reserve k+1 before a
        verify). ValueError past max_seq_len; RuntimeError "out of KV blocks" if the pool is short.
        """
        super().grow(slot, new_len)  # the max_seq_len check
        self.blocks.grow(slot, new_len)

    def copy_positions(self, slot: int, src: list[int], dst: list[int]) -> None:
        """See ``KVCache.copy_positions``: positions go through the slot mapping to pool indices."""
        src_t = torch.tensor(self.blocks.slot_mapping(slot, src), dtype=torch.long,
                             device=self.device)
        dst_t = torch.tensor(self.blocks.slot_mapping(slot, dst), dtype=torch.long,
                             device=self.device)
        for pool in self.k + self.v:
            flat = pool.view(-1, *pool.shape[2:])  # (num_blocks*block_size, n_kv, hd)
            flat.index_copy_(0, dst_t, flat[src_t])  # flat[src_t] is a copy: no aliasing

    # ------------------------------------------------------------------ tensors

    def prepare(self, slots: list[int], positions: torch.Tensor) -> PagedPlan:
        """See ``KVCache.prepare``; also grows block tables and computes the slot mapping.

        Raises RuntimeError ("out of KV blocks") when the pool cannot hold the writes; the cache
        is left unchanged then, as for every ValueError.
        """
        slots = list(slots)
        B, T = positions.shape
        if len(slots) != B:
            raise ValueError(f"{len(slots)} slots for a batch of {B} rows")
        if len(set(slots)) != B:
            raise ValueError(f"a slot appears twice in one batch: {slots}")
        rows = positions.tolist()
        new_lengths = [self.table.plan_write(s, row) for s, row in zip(slots, rows, strict=True)]

        # All or nothing: count the missing blocks of every row before taking any.
        missing = sum(
            max(0, self.blocks.blocks_needed(n) - len(self.blocks.block_table(s)))
            for s, n in zip(slots, new_lengths, strict=True)
        )
        if missing > self.num_free_blocks:
            raise RuntimeError(
                f"out of KV blocks: this forward needs {missing} more block(s), "
                f"{self.num_free_blocks} of {self.num_blocks} are free"
            )
        for s, n in zip(slots, new_lengths, strict=True):
            self.blocks.grow(s, n)

        dst, src = [], []
        for b, (slot, row) in enumerate(zip(slots, rows, strict=True)):
            written = [(t, p) for t, p in enumerate(row) if p >= 0]
            # where each written token (b, t) goes in the flat pool
            dst += self.blocks.slot_mapping(slot, [p for _, p in written])
            src += [b * T + t for t, _ in written]
        all_written = len(src) == B * T

        S = max(1, max(new_lengths))  # attend over the longest sequence only
        max_blocks = self.blocks.blocks_needed(S)
        tables = [self.blocks.block_table(s)[:max_blocks] for s in slots]
        tables = [t + [0] * (max_blocks - len(t)) for t in tables]  # pad short rows with block 0
        key_positions = torch.arange(S, device=self.device).expand(B, S)  # (B, S)
        lengths = torch.tensor(new_lengths, device=self.device)[:, None]  # (B, 1)
        key_positions = key_positions.masked_fill(key_positions >= lengths, -1)  # (B, S)

        return PagedPlan(
            slots=slots,
            new_lengths=new_lengths,
            key_positions=key_positions,
            dst=torch.tensor(dst, dtype=torch.long, device=self.device),
            src=None if all_written else torch.tensor(src, dtype=torch.long, device=self.device),
            block_tables=torch.tensor(tables, dtype=torch.long, device=self.device),
        )

    def update(
        self, layer: int, plan: PagedPlan, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See ``KVCache.update``: scatter k, v into their blocks; gather (B, S, n_kv, hd) back."""
        B, S = plan.key_positions.shape
        out = []
        for pool, new in ((self.k[layer], k), (self.v[layer], v)):
            flat_new = new.reshape(-1, *pool.shape[2:])  # (B*T, n_kv, hd)
            if plan.src is not None:
                flat_new = flat_new[plan.src]  # (N, n_kv, hd), padding dropped
            flat_pool = pool.view(-1, *pool.shape[2:])  # (num_blocks*block_size, n_kv, hd)
            flat_pool.index_copy_(0, plan.dst, flat_new)  # the writes go through the pool view
            gathered = pool[plan.block_tables]  # (B, max_blocks, block_size, n_kv, hd)
            # (B, max_blocks*block_size, n_kv, hd): each row's blocks laid end to end
            gathered = gathered.reshape(B, -1, *pool.shape[2:])
            out.append(gathered[:, :S])  # (B, S, n_kv, hd), in position order
        return out[0], out[1]
