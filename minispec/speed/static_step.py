"""A static-shape forward: the target's step over a padded batch, read from preallocated buffers.

A GPU runs a small model's decode step faster than the host can launch its kernels (hundreds of
small kernels a step), so serving engines record the step once as a CUDA graph and replay it
(nano-vllm, vLLM, SGLang; gpt-fast through ``torch.compile``). A graph replays fixed shapes and
fixed memory addresses, so the step it records must

* take its inputs from **buffers allocated once** (token ids, RoPE positions, where each new token
  is written, each row's block table, lengths, the tree mask) and copied into before each replay;
* have **one shape per bucket**: the batch is padded to ``B`` rows (1, 2, 4, ..., 64), each row to
  ``T`` new tokens (1, ``k + 1`` or a tree's nodes), the keys to ``M`` blocks of the paged pool;
* **never sync with the host**: no ``.item()``, ``.tolist()``, ``nonzero`` or shape that depends
  on data. The mask is computed inside the step from the buffers, once, for all layers.

Padding is harmless: a padding token writes its key and value to the cache's scratch row
(``KVCache.scratch``), which no sequence owns, and every key column not the row's own (past its
length, a block-table pad) is zeroed before attention, so one request's NaN never reaches another.

[`StaticStep`][minispec.speed.static_step.StaticStep] holds one bucket's buffers and runs the step
eagerly (on the CPU, all it does: the dynamic path's tokens);
[`minispec.speed.graphs`][minispec.speed.graphs] captures it on CUDA;
[`StaticForward`][minispec.speed.static_step.StaticForward] picks the bucket for a batch, fills it,
and falls back to the dynamic forward where no bucket fits. Shapes: B rows (the bucket), T new
tokens a row, M blocks a row, S = M x block positions, n_h query heads, n_kv key/value heads, hd
head dim, V vocabulary, D hidden size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minispec.models.block_manager import ceil_div
from minispec.models.kv_cache import ForwardPlan, KVCache
from minispec.models.llama import Llama, TreeAttention, tree_attention_mask
from minispec.models.paged_cache import PagedKVCache
from minispec.speed.goodput import bucket
from minispec.speed.graphs import CudaGraphs

__all__ = ["BATCH_BUCKETS", "StaticForward", "StaticForwards", "StaticStep"]

#: Batch sizes a step is padded to: the powers of two ``bucket`` gives, up to 64 (nano-vllm and
#: vLLM capture the same kind of ladder).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class StaticStep:
    """One bucket's buffers and its forward: ``B`` rows of ``T`` new tokens over ``M`` blocks.

    Args:
        model: the target [`Llama`][minispec.models.llama.Llama].
        cache: its KV cache (paged: blocks of ``block_size``; contiguous: one block per slot).
        B: rows (the bucket).
        T: new tokens per row.
        S: key positions per row (a multiple of the paged cache's block size: ``S /
            block_size`` blocks).

    On CUDA the step repeats each key/value head for its query heads before attention
    (``expand_kv``), so that the fused kernels (which take an arbitrary mask but not grouped
    heads) run.
    """

    def __init__(self, model: Llama, cache: KVCache, B: int, T: int, S: int) -> None:
        self.model, self.cache, self.S = model, cache, S
        M = ceil_div(S, cache.block_size)   # blocks a row reads (contiguous: 1, its slot's prefix)
        self.expand_kv = model.device.type == "cuda"
        device, long = model.device, torch.long
        self.input_ids = torch.zeros(B, T, dtype=long, device=device)
        self.positions = torch.zeros(B, T, dtype=long, device=device)      # RoPE positions
        self.slot_mapping = torch.full((B, T), cache.scratch, dtype=long, device=device)
        self.block_tables = torch.zeros(B, M, dtype=long, device=device)
        self.lengths = torch.zeros(B, dtype=long, device=device)      # after this step's writes
        self.start = torch.zeros(B, dtype=long, device=device)        # first new cache position
        self.eye = torch.eye(T, dtype=torch.bool, device=device).expand(B, T, T)  # padding rows
        self.tree_mask = self.eye.clone()
        self.columns = torch.arange(self.S, device=device)             # (S,) key positions

    def load(self, input_ids: Tensor, positions: Tensor, plan: ForwardPlan, start: list[int],
             tree_mask: Tensor, block_tables: Tensor) -> None:
        """Copy one batch (b <= B rows, t <= T tokens) into the buffers; the rest is padding.

        Args: input_ids, positions (b, t); plan -- the cache's plan for this forward (where each
        token is written, the lengths after it); start -- (b,) each row's first new cache
        position; tree_mask (b, t, t) -- which new tokens each new token sees (causal for a
        chain); block_tables (b, <= M) the blocks each row reads (contiguous: its slot).
        """
        b, t = input_ids.shape
        slot_mapping = torch.full((b * t,), self.cache.scratch, dtype=torch.long,
                                  device=input_ids.device)
        slot_mapping[plan.src if plan.src is not None else slice(None)] = plan.dst
        batch = ((self.slot_mapping, slot_mapping.view(b, t), self.cache.scratch),
                 (self.input_ids, input_ids, 0), (self.positions, positions.clamp(min=0), 0),
                 (self.block_tables, block_tables, 0),
                 (self.lengths, torch.tensor(plan.new_lengths), 0),
                 (self.start, torch.tensor(start), 0))
        for buffer, value, padding in batch:  # the padding first, then the batch in its corner
            buffer.fill_(padding)
            buffer[tuple(slice(0, n) for n in value.shape)].copy_(value)
        self.tree_mask.copy_(self.eye)                     # a padding token sees only itself
        self.tree_mask[:b, :t, :t].copy_(tree_mask)

    # ------------------------------------------------------------------ the step (no host sync)

    def run(self) -> tuple[Tensor, Tensor]:
        """The forward over the buffers: logits (B, T, V) and final hidden states (B, T, D)."""
        model = self.model
        x = model.embed_tokens(self.input_ids)                                    # (B, T, D)
        cos = model.rope_cos[self.positions].to(x.dtype).unsqueeze(2)            # (B, T, 1, hd)
        sin = model.rope_sin[self.positions].to(x.dtype).unsqueeze(2)            # (B, T, 1, hd)
        mask = self._mask(x.dtype)                                                # (B, 1, T, S)
        for layer in model.layers:             # the cache argument is this step (``update``)
            x = layer(x, cos, sin, mask, self, None)
        x = model.norm(x)                                                         # (B, T, D)
        return model.logits(x), x                                                 # (B, T, V)

    def _mask(self, dtype: torch.dtype) -> Tensor:
        """The additive mask (B, 1, T, S), built once a step: 0 where a query sees a key, -inf
        elsewhere. A key is seen if it is the row's (column < its length) and either committed
        (before ``start``) or a new token the tree mask allows (causal for a chain)."""
        key_positions = torch.where(self.columns < self.lengths[:, None], self.columns, -1)
        # the chain or tree mask of the dynamic path; no storage index is -1 here, so a padding
        # query, which sees no key, is let see every column instead (zeroed if not keys): finite
        tree = TreeAttention(self.positions, self.start, self.tree_mask)
        visible = tree_attention_mask(tree, key_positions)                        # (B, 1, T, S)
        visible = visible | ~visible.any(dim=-1, keepdim=True)
        self.valid = (key_positions >= 0)[:, :, None, None]                       # (B, S, 1, 1)
        zero = torch.zeros((), dtype=dtype, device=visible.device)
        return torch.where(visible, zero, float("-inf"))                          # (B, 1, T, S)

    def update(self, layer: int, plan: None, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this layer's new k, v (B, T, n_kv, hd) through the slot mapping, then gather
        each row's keys and values (B, S, n_kv or n_h, hd), zeroed where they are not its own."""
        B = k.shape[0]
        out = []
        for pool, new in ((self.cache.k[layer], k), (self.cache.v[layer], v)):
            flat = pool.view(-1, *pool.shape[2:])                        # (entries, n_kv, hd)
            flat.index_copy_(0, self.slot_mapping.flatten(), new.reshape(-1, *pool.shape[2:]))
            # whole blocks of S or fewer positions (contiguous: a slot's first S), row by row
            rows = pool[:, :self.S].index_select(0, self.block_tables.flatten())
            rows = rows.view(B, self.S, *pool.shape[2:])                      # (B, S, n_kv, hd)
            rows = torch.where(self.valid, rows, 0.0)              # masked is not enough: NaN
            if self.expand_kv:                     # (B, S, n_h, hd): one copy per query head
                rows = rows.repeat_interleave(self.model.config.num_attention_heads
                                              // pool.shape[2], dim=2)
            out.append(rows)
        return out[0], out[1]


class StaticForward:
    """A model's forward (the target's, or a draft model's chain steps) through static-shape
    buckets, replayed as CUDA graphs on a GPU.

    Called as the model is (``ids``, ``positions``, ``slots``, ``tree``), it plans the cache
    writes on the host as the dynamic path does, picks the bucket ``(B, T, S)`` -- the batch
    padded to ``BATCH_BUCKETS``, the keys to a power of two -- fills that bucket's buffers and
    runs its step. A batch no bucket holds (more than 64 rows, a tree level that also sees earlier
    levels) runs the model itself.

    Args:
        model: the target or a draft model; cache: its KV cache.
        graphs: capture each bucket as a CUDA graph on first use and replay it (CUDA only; on
            the CPU the same step runs eagerly); or the
            [`CudaGraphs`][minispec.speed.graphs.CudaGraphs] of another forward to capture into
            (a draft model's beside the target's: one memory pool); ``False`` or ``None``: the
            step runs eagerly everywhere.
    """

    def __init__(self, model: Llama, cache: KVCache, graphs: bool | CudaGraphs | None = True
                 ) -> None:
        self.model, self.cache = model, cache
        self.paged = isinstance(cache, PagedKVCache)
        self.steps: dict[tuple[int, int, int], StaticStep] = {}
        if graphs is True:
            graphs = CudaGraphs()
        self.graphs = graphs if graphs and model.device.type == "cuda" else None

    def __call__(self, input_ids: Tensor, positions: Tensor, slots: list[int],
                 tree: TreeAttention | None = None, hidden: bool | tuple[int, ...] = False
                 ) -> Tensor | tuple[Tensor, Tensor]:
        """The model's step over the batch, as ``Llama.forward`` returns it (logits (b, t, V), and
        the hidden states (b, t, D) with ``hidden``): from a static bucket, or from the model
        itself where none holds the batch or other layers' features are asked for."""
        out = (None if isinstance(hidden, tuple)          # other layers' features: not static
               else self.in_bucket(input_ids, positions, slots, tree))
        if out is None:
            return self.model(input_ids, positions, self.cache, slots, return_hidden=hidden,
                              tree=tree)
        return out if hidden else out[0]

    def in_bucket(self, input_ids: Tensor, positions: Tensor, slots: list[int],
                  tree: TreeAttention | None = None) -> tuple[Tensor, Tensor] | None:
        """Logits (b, t, V) and hidden states (b, t, D) of the batch, or None (no bucket)."""
        b, t = input_ids.shape
        rows = bucket(b) if b <= BATCH_BUCKETS[-1] else None
        if rows is None or (tree is not None and tree.mask.shape[2] != t):
            return None
        if tree is None:            # a chain: stored at its positions, each token sees those before
            causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, t, t)
            tree = TreeAttention(positions, positions[:, 0], causal)
        plan = self.cache.prepare(slots, tree.storage)               # host bookkeeping
        step = self._step(rows, t, max(plan.new_lengths))
        tables = (plan.block_tables if self.paged
                  else torch.tensor(slots, device=self.model.device)[:, None])
        step.load(input_ids, positions, plan, tree.start.tolist(), tree.mask, tables)
        logits, hidden = self.graphs.run(step) if self.graphs is not None else step.run()
        self.cache.commit(plan)
        return logits[:b, :t].clone(), hidden[:b, :t].clone()  # the buffers are reused

    def _step(self, rows: int, t: int, length: int) -> StaticStep:
        """The bucket's step (made on first use): the keys padded to a power of two of units, a
        paged cache's blocks (whole blocks) or 64 positions of a contiguous slot (at most its
        ``max_seq_len``)."""
        unit = self.cache.block_size if self.paged else 64
        units = min(ceil_div(self.cache.max_seq_len, unit),            # a whole slot at most
                    bucket(ceil_div(length, unit)))
        key = (rows, t, units * unit if self.paged else min(units * unit, self.cache.max_seq_len))
        if key not in self.steps:
            self.steps[key] = StaticStep(self.model, self.cache, *key)
        return self.steps[key]


class StaticForwards:
    """The ``forward`` collaborator of ``graphs=True``: ``forward(model, cache)`` gives that
    model's [`StaticForward`][minispec.speed.static_step.StaticForward], every one capturing into
    this object's one pool of CUDA graphs (the target's and a draft model's steps run one at a
    time, their outputs copied out).

    Args:
        graphs: capture on CUDA (``True``); ``False``: the static steps run eagerly everywhere.

    Attributes:
        forwards: the forwards made so far, in order (the target's first).
    """

    def __init__(self, graphs: bool = True) -> None:
        self.graphs = CudaGraphs() if graphs else None
        self.forwards: list[StaticForward] = []

    def __call__(self, model: Llama, cache: KVCache) -> StaticForward:
        self.forwards.append(StaticForward(model, cache, self.graphs or False))
        return self.forwards[-1]
