"""KV caches: the interface attention talks to, and a contiguous slotted cache.

A cache holds the keys and values of every sequence it serves, one *slot* per sequence. The
bookkeeping (which slots are in use, how long each sequence is, rollback) is pure Python in
``SequenceTable``; the tensors live in the concrete caches.

One forward pass talks to a cache in three steps, so per-token work is done once, not per layer:

1. ``plan = cache.prepare(slots, positions)`` checks the writes (no gaps, nothing past
   ``max_seq_len``), precomputes where every new token goes and the positions of the keys
   attention will see (``plan.key_positions``, (B, S), -1 = not a key);
2. every layer calls ``keys, values = cache.update(layer, plan, k, v)``, which stores the new keys
   and values and returns everything attention needs, (B, S, n_kv, hd);
3. ``cache.commit(plan)`` advances the lengths once, after all layers wrote.

Rollback (after the target rejected some draft tokens) is ``truncate_to(slot, n)``: positions >= n
are forgotten. The stale entries stay in memory until the next write overwrites them; attention
sees them as non-keys (key position -1): masked, and zeroed before the product, so whatever they
hold (even NaN) contributes nothing (see ``minispec.models.llama.non_keys``).

After a draft *tree* was scored (its nodes stored at positions ``n-1 .. n-1+N-1``, see
``minispec.models.llama.TreeAttention``), ``compact(slot, n, keep)`` keeps the accepted path only:
the positions in ``keep`` move to ``n, n+1, ...`` (one gather and one scatter per layer) and
everything after them is forgotten, so the cache equals one that only ever saw the accepted tokens.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from minispec.core.sampling import check_args, is_int
from minispec.models.block_manager import ceil_div

#: Bytes of Python bookkeeping per block of a paged pool (the block manager's free list and
#: reference counts), counted with the tensors when the engine checks its memory.
BLOCK_BOOKKEEPING = 48


def device_memory(device: torch.device) -> int:
    """Bytes of memory on ``device``: a GPU's total, else the machine's physical RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):       # no sysconf (Windows): no known limit
        return 2**63


# ---------------------------------------------------------------------------- bookkeeping


class SequenceTable:
    """Pure-Python bookkeeping of a cache's slots: which are in use and how long each sequence is.

    Args: num_slots — how many sequences fit at once; max_seq_len — positions per sequence.
    """

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        if num_slots < 1 or max_seq_len < 1:
            raise ValueError("num_slots and max_seq_len must be positive")
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        self._lengths: dict[int, int] = {}  # slot -> number of cached positions

    def allocate(self) -> int:
        """Claim the lowest free slot for a new, empty sequence; return its index."""
        for slot in range(self.num_slots):
            if slot not in self._lengths:
                self._lengths[slot] = 0
                return slot
        raise RuntimeError(f"all {self.num_slots} cache slots are in use; free one first")

    def free(self, slot: int) -> None:
        """Release ``slot``; its contents are forgotten."""
        self._check(slot)
        del self._lengths[slot]

    def length(self, slot: int) -> int:
        """Number of positions cached for ``slot`` (the next position to write)."""
        self._check(slot)
        return self._lengths[slot]

    @property
    def lengths(self) -> dict[int, int]:
        """A copy of ``{slot: length}`` for every allocated slot."""
        return dict(self._lengths)

    @property
    def num_free(self) -> int:
        """How many slots can still be allocated."""
        return self.num_slots - len(self._lengths)

    def truncate_to(self, slot: int, n: int) -> None:
        """Roll ``slot`` back to its first ``n`` positions (forget positions >= n).

        Raises ValueError if n < 0 or n > length(slot).
        """
        length = self.length(slot)
        if not 0 <= n <= length:
            raise ValueError(f"cannot truncate slot {slot} of length {length} to {n}")
        self._lengths[slot] = n

    def plan_write(self, slot: int, positions: list[int]) -> int:
        """Check that writing ``positions`` (padding -1 allowed) to ``slot`` is legal.

        The written positions must be consecutive and start at or before the current length (no
        gap), and stay below ``max_seq_len``. Returns the sequence length after the write: the last
        written position + 1 (unchanged if nothing is written). Writing over earlier positions
        therefore also forgets everything after them, as their keys depended on what was replaced.
        """
        length = self.length(slot)
        written = [p for p in positions if p >= 0]
        if not written:
            return length
        first, last = written[0], written[-1]
        if written != list(range(first, last + 1)):
            raise ValueError(f"slot {slot}: positions must be consecutive, got {written}")
        if first > length:
            raise ValueError(f"slot {slot}: writing position {first} would leave a gap "
                             f"(the sequence has {length} positions; the next one is {length})")
        if last >= self.max_seq_len:
            raise ValueError(f"slot {slot}: position {last} is past the cache's "
                             f"max_seq_len={self.max_seq_len}")
        return last + 1

    def set_length(self, slot: int, n: int) -> None:
        """Record that ``slot`` now holds ``n`` positions (used by ``commit``)."""
        self._check(slot)
        self._lengths[slot] = n

    def _check(self, slot: int) -> None:
        if slot not in self._lengths:
            raise ValueError(f"cache slot {slot} is not allocated")


# ---------------------------------------------------------------------------- interface


@dataclass
class ForwardPlan:
    """What one forward pass does to a cache, computed once by ``prepare`` for all layers.

    Attributes: slots — the cache slot of each batch row; new_lengths — each slot's length after
    the forward; key_positions — (B, S) position of each key attention sees, -1 where there is none;
    dst — (N,) flat index (``flat_index``) of every written token; src — (N,) index of those
    tokens among the B*T new ones, or None when no row is padded. Concrete caches subclass it to
    add their own index tensors.
    """

    slots: list[int]
    new_lengths: list[int]
    key_positions: torch.Tensor
    dst: torch.Tensor | None = None
    src: torch.Tensor | None = None


class KVCache(ABC):
    """Interface shared by every KV cache (contiguous slots now, paged blocks later).

    Sequence bookkeeping (``allocate``, ``free``, ``length``, ``lengths``, ``truncate_to``) is
    delegated to a pure-Python ``SequenceTable`` in ``self.table``; a cache that must do more on
    rollback (a paged cache frees whole blocks) overrides ``truncate_to`` / ``free`` and calls
    ``super()``. The tensor side is ``prepare`` / ``update`` / ``commit``, see the module docstring.
    """

    table: SequenceTable
    num_layers: int
    block_size: int  # positions per block of KV memory (a scheduler counts memory in blocks)
    num_blocks: int  # blocks in the pool

    @classmethod
    def for_model(cls, model, num_slots: int = 1, max_seq_len: int | None = None, extra: int = 0,
                  **settings):
        """A cache of this kind shaped for ``model`` (a ``minispec.models.llama.Llama``), on its
        device and dtype.

        ``max_seq_len`` defaults to, and may not exceed, the model's max_position_embeddings;
        ``extra`` positions are added on top (a draft tree is stored past the context until it is
        compacted; its RoPE positions stay within the limit). ``settings`` are the kind's own (a
        paged cache's ``block_size`` and ``num_blocks``, which defaults to enough blocks for
        ``num_slots`` full sequences).
        """
        config = model.config
        max_seq_len = max_seq_len or config.max_position_embeddings
        if max_seq_len > config.max_position_embeddings:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's "
                             f"max_position_embeddings={config.max_position_embeddings}")
        return cls(num_layers=config.num_hidden_layers, num_slots=num_slots,
                   max_seq_len=max_seq_len + extra, num_kv_heads=config.num_key_value_heads,
                   head_dim=config.head_dim, device=model.device, dtype=model.dtype, **settings)

    @property
    def max_seq_len(self) -> int:
        """Most positions one sequence can hold."""
        return self.table.max_seq_len

    def allocate(self) -> int:
        """Start an empty sequence; returns its slot."""
        return self.table.allocate()

    def free(self, slot: int) -> None:
        """End the sequence in ``slot`` and release its memory for reuse."""
        self.table.free(slot)

    def length(self, slot: int) -> int:
        """Number of cached positions of ``slot``."""
        return self.table.length(slot)

    @property
    def lengths(self) -> dict[int, int]:
        """``{slot: length}`` for every allocated slot (a copy)."""
        return self.table.lengths

    def truncate_to(self, slot: int, n: int) -> None:
        """Rollback: keep positions < n of ``slot``. ValueError if n < 0 or n > length."""
        self.table.truncate_to(slot, n)

    def compact(self, slot: int, n: int, keep: list[int]) -> None:
        """Keep positions ``< n``, move positions ``keep`` to ``n, n+1, ...``, forget the rest.

        The accepted path of a draft tree becomes consecutive: node ``i`` of the tree, stored at
        ``n - 1 + i``, lands at ``n - 1 + depth``, where its RoPE position already is.

        Args:
            slot: the sequence.
            n: positions kept in place (for a tree: the context length, the root included).
            keep: cache positions to move, strictly increasing, each in ``[n, length)``.

        Raises:
            ValueError: for ``n`` outside ``[0, length]`` or a bad ``keep``; nothing changes then.
        """
        length = self.length(slot)
        keep = [int(p) for p in keep]
        if not 0 <= n <= length:
            raise ValueError(f"cannot compact slot {slot} of length {length} to keep {n} positions")
        if any(not n <= p < length for p in keep) or keep != sorted(set(keep)):
            raise ValueError(f"slot {slot}: positions to keep must be strictly increasing in "
                             f"[{n}, {length}), got {keep}")
        moves = [(src, dst) for dst, src in enumerate(keep, start=n) if src != dst]
        if moves:  # copy the keys/values at the sources to the destinations, every layer
            src = torch.tensor(self.flat_index(slot, [m[0] for m in moves]), device=self.device)
            dst = torch.tensor(self.flat_index(slot, [m[1] for m in moves]), device=self.device)
            for store in self.k + self.v:
                flat = store.view(-1, *store.shape[2:])  # (N, n_kv, hd)
                flat.index_copy_(0, dst, flat[src])  # flat[src] is a copy: read before written
        self.truncate_to(slot, n + len(keep))

    # The caches below keep each layer's keys and values in one tensor each, ``self.k[layer]`` and
    # ``self.v[layer]`` (rows of positions: slots, or blocks), and share these steps. ``flat_index``
    # says where a position lives in such a tensor viewed flat, (rows * positions, n_kv, hd).

    def flat_index(self, slot: int, positions: list[int]) -> list[int]:
        """Flat storage index of each of ``positions`` of ``slot``; a concrete cache implements
        it."""
        raise NotImplementedError(f"{type(self).__name__} cannot move positions")

    def _setup(self, num_layers: int, num_slots: int, max_seq_len: int, num_kv_heads: int,
               head_dim: int, device: torch.device | str | None, dtype: torch.dtype,
               block_size: int | None = None, num_blocks: int | None = None) -> None:
        """Check every size, then build ``self.table`` and the stores ``self.k``, ``self.v``: per
        layer, (rows + 1, positions, n_kv, hd), left uninitialised. Rows are slots of
        ``max_seq_len`` positions, or, with a ``block_size`` (a paged pool), ``num_blocks`` blocks
        (by default enough for every slot to be full).

        A ``ValueError`` names the first size that is not a positive integer, a ``dtype`` that is
        not a float one, or, before anything is allocated, the memory the stores (and a pool's
        bookkeeping) would need when it is more than the device's
        ([`device_memory`][minispec.models.kv_cache.device_memory]).

        The last row is scratch, owned by nobody: a static-shape step
        ([`minispec.speed.static_step`][minispec.speed.static_step]) writes its padding tokens
        there (flat index ``self.scratch``), so a padded row never touches a sequence's memory.

        Nothing is read before it is written: attention masks every column that holds no key and
        zeroes it first (``non_keys``), so whatever the memory holds, NaN included, cannot leak.
        Not zeroing also means the operating system commits the memory only as positions are
        written: a default ``Engine`` on SmolLM2-135M reserves 3 GB (8 slots x 8,192 positions)
        but holds only what its requests use.
        """
        paged = block_size is not None
        sizes = dict(num_layers=num_layers, num_slots=num_slots, max_seq_len=max_seq_len,
                     num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size if paged
                     else 1, num_blocks=1 if num_blocks is None else num_blocks)
        checks = [(k, v, is_int(v) and v >= 1, "a positive integer") for k, v in sizes.items()]
        check_args(type(self).__name__, [*checks, ("dtype", dtype, isinstance(dtype, torch.dtype)
                                                   and dtype.is_floating_point, "a float dtype")])
        self.table, self.num_layers = SequenceTable(num_slots, max_seq_len), num_layers
        # a block of KV memory: a whole slot in a contiguous cache
        self.block_size = positions = block_size if paged else max_seq_len
        self.num_blocks = rows = num_blocks or num_slots * ceil_div(max_seq_len, positions)
        shape = (rows + 1, positions, num_kv_heads, head_dim)
        each = 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize    # bytes per position
        need = shape[0] * positions * each + rows * BLOCK_BOOKKEEPING * paged
        if need > (have := device_memory(where := torch.device(device or "cpu"))):
            raise ValueError(f"{type(self).__name__}: the cache would need {need / 2**30:,.1f} GiB "
                             f"({shape[0] * positions:,} positions x {each:,} bytes of keys and "
                             f"values{f', and {BLOCK_BOOKKEEPING} bytes per block' * paged}), more "
                             f"than the {have / 2**30:,.1f} GiB of memory on {where}")
        self.scratch = rows * positions                   # flat index of the scratch row
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.device = self.k[0].device

    def _new_lengths(self, slots: list[int], rows: list[list[int]]) -> list[int]:
        """Each slot's length after writing its row of positions (``SequenceTable.plan_write``
        checks every row before anything is written)."""
        if len(slots) != len(rows):
            raise ValueError(f"{len(slots)} slots for a batch of {len(rows)} rows")
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears twice in one batch: {slots}")
        return [self.table.plan_write(slot, row) for slot, row in zip(slots, rows, strict=True)]

    def _writes(self, slots: list[int], rows: list[list[int]]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A plan's ``dst`` and ``src``: where each written token (b, t) goes, and which it is."""
        dst, src = [], []
        for b, (slot, row) in enumerate(zip(slots, rows, strict=True)):
            written = [(t, p) for t, p in enumerate(row) if p >= 0]
            dst += self.flat_index(slot, [p for _, p in written])
            src += [b * len(row) + t for t, _ in written]
        all_written = len(src) == sum(len(row) for row in rows)
        return (torch.tensor(dst, dtype=torch.long, device=self.device),
                None if all_written else torch.tensor(src, dtype=torch.long, device=self.device))

    def _key_positions(self, new_lengths: list[int]) -> torch.Tensor:
        """(B, S) the key positions ``0..S-1`` of each row, -1 past its length; S is the longest
        length, so attention reads only that far, not max_seq_len."""
        S = max(1, max(new_lengths))
        key_positions = torch.arange(S, device=self.device).expand(len(new_lengths), S)  # (B, S)
        lengths = torch.tensor(new_lengths, device=self.device)[:, None]  # (B, 1)
        return key_positions.masked_fill(key_positions >= lengths, -1)  # (B, S)

    def _write(self, store: torch.Tensor, plan: ForwardPlan, new: torch.Tensor) -> None:
        """Scatter a layer's new keys or values (B, T, n_kv, hd) into ``store`` at ``plan.dst``."""
        flat_new = new.reshape(-1, *store.shape[2:])  # (B*T, n_kv, hd)
        if plan.src is not None:
            flat_new = flat_new[plan.src]  # (N, n_kv, hd), padding dropped
        store.view(-1, *store.shape[2:]).index_copy_(0, plan.dst, flat_new)

    # Capacity, asked by a scheduler before it writes. Memory is counted in blocks of
    # ``self.block_size`` positions; a contiguous cache is the special case where every slot is
    # one block of ``max_seq_len`` positions, taken by ``allocate``. A paged cache overrides these.

    @property
    def num_free_blocks(self) -> int:
        """Blocks of KV memory no sequence holds (here: the free slots)."""
        return self.table.num_free

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of ``num_tokens`` positions fits now (a free slot and memory)."""
        return self.table.num_free > 0 and num_tokens <= self.max_seq_len

    def can_grow(self, slot: int, new_len: int) -> bool:
        """Whether ``slot`` can hold ``new_len`` positions (``grow`` would succeed)."""
        self.table.length(slot)  # ValueError for an unallocated slot
        return new_len <= self.max_seq_len

    def grow(self, slot: int, new_len: int) -> None:
        """Reserve room for ``new_len`` positions of ``slot`` before writing them (e.g. the k+1
        of a verify). Here the room is always there: this only checks. ValueError past max_seq_len.
        """
        self.table.length(slot)  # ValueError for an unallocated slot
        if new_len > self.max_seq_len:
            raise ValueError(f"slot {slot}: {new_len} positions exceed the cache's "
                             f"max_seq_len={self.max_seq_len}")

    @abstractmethod
    def prepare(self, slots: list[int], positions: torch.Tensor) -> ForwardPlan:
        """Plan one forward that writes tokens at ``positions`` (B, T) (-1 = padding) of ``slots``.

        Raises ValueError for a gap, a write at >= max_seq_len, an unallocated or repeated slot.
        """

    def update(self, layer: int, plan: ForwardPlan, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new k, v (B, T, n_kv, hd); return the keys, values (B, S, n_kv, hd)
        to attend to, aligned with ``plan.key_positions``.

        Attention zeroes the returned entries at key position -1 in place, so there they must be
        a copy or the row's own forgotten positions, never another sequence's live entries.
        """
        self._write(self.k[layer], plan, k)
        self._write(self.v[layer], plan, v)
        return self._read(self.k[layer], plan), self._read(self.v[layer], plan)

    def _read(self, store: torch.Tensor, plan: ForwardPlan) -> torch.Tensor:
        """A layer's keys or values (B, S, n_kv, hd) for ``plan``'s rows; a concrete cache
        implements it."""
        raise NotImplementedError(f"{type(self).__name__} cannot read its store")

    def commit(self, plan: ForwardPlan) -> None:
        """Advance each slot's length once every layer has written (end of the forward)."""
        for slot, n in zip(plan.slots, plan.new_lengths, strict=True):
            self.table.set_length(slot, n)


# ---------------------------------------------------------------------------- contiguous


@dataclass
class ContiguousPlan(ForwardPlan):
    """``ForwardPlan`` of a ``ContiguousKVCache``; its flat index is ``slot * max_seq_len +
    position``.

    Attributes: rows — the batch's slots as a slice when they are consecutive (reading is then a
    view), else as a (B,) index tensor.
    """

    rows: slice | torch.Tensor | None = None


class ContiguousKVCache(KVCache):
    """A preallocated cache: per layer, K and V of shape (num_slots, max_seq_len, n_kv, hd).

    Simple and fast, but every slot reserves ``max_seq_len`` positions whether used or not (the
    waste a paged cache avoids). Attention reads only the first S = max length in the batch.
    """

    def __init__(self, num_layers: int, num_slots: int, max_seq_len: int, num_kv_heads: int,
                 head_dim: int, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self._setup(num_layers, num_slots, max_seq_len, num_kv_heads, head_dim, device, dtype)

    def flat_index(self, slot: int, positions: list[int]) -> list[int]:
        """``slot * max_seq_len + position``: slots are rows of ``max_seq_len`` positions."""
        return [slot * self.max_seq_len + p for p in positions]

    def prepare(self, slots: list[int], positions: torch.Tensor) -> ContiguousPlan:
        """See ``KVCache.prepare``; also computes the flat write indices and the read rows."""
        slots, rows = list(slots), positions.tolist()
        new_lengths = self._new_lengths(slots, rows)  # validates before any write
        dst, src = self._writes(slots, rows)
        first, B = slots[0], len(slots)
        consecutive = slots == list(range(first, first + B))
        read = slice(first, first + B) if consecutive else torch.tensor(slots, device=self.device)
        return ContiguousPlan(slots, new_lengths, self._key_positions(new_lengths), dst, src, read)

    def _read(self, store: torch.Tensor, plan: ContiguousPlan) -> torch.Tensor:
        """The first S positions of the batch's slots (B, S, n_kv, hd): a view when they are
        consecutive."""
        return store[plan.rows, :plan.key_positions.shape[1]]  # (B, S, n_kv, hd)
