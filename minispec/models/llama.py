"""A minimal Llama: RMSNorm, RoPE (with Llama-3 frequency scaling), grouped-query attention, SwiGLU.

The module tree mirrors Hugging Face's ``LlamaForCausalLM`` names (``embed_tokens``,
``layers.N.self_attn.q_proj``, ``layers.N.mlp.gate_proj``, ``norm``, ``lm_head``), so a checkpoint
loads by dropping the ``model.`` prefix (see ``minispec.loading.loader``).

Positions are explicit: ``forward(input_ids, positions)`` gets the absolute position of every token,
and position -1 marks padding. That is what speculative decoding needs: a verify step feeds
``[last, d1..dk]`` at positions ``n..n+k``, a batch mixes rows with different numbers of new tokens,
and the KV cache is rolled back by simply forgetting positions.

A draft *tree* is scored in one forward too (SpecInfer's tree attention): pass a
[`TreeAttention`][minispec.models.llama.TreeAttention]. Siblings share a RoPE position (committed
length + depth), so the cache cannot store tree nodes by position: each new token also gets a
*storage* index (its cache position), and attention sees every committed cache position plus exactly
the tree nodes the mask allows. After verification the cache keeps the accepted path only
(``KVCache.compact``).

Requests are isolated by construction. A batch row's key columns that are not its own sequence's
keys (past its length, padding) hold whatever was written there last, maybe another request's NaN;
the mask gives them zero weight, but ``0 * NaN = NaN``, so attention also zeroes their keys and
values first ([`non_keys`][minispec.models.llama.non_keys]): one request's NaN cannot reach another.

Shapes: B batch, T new tokens, S keys attended to, D hidden size, V vocabulary, n_h query heads,
n_kv key/value heads, hd head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from minispec.models.kv_cache import ForwardPlan, KVCache


@dataclass
class ModelConfig:
    """Shape and hyper-parameters of a Llama model (the fields of a Hugging Face ``config.json``).

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (plain multi-head attention) and
    ``head_dim`` to ``hidden_size // num_attention_heads``. ``rope_scaling`` is ``None`` for plain
    RoPE, or a dict with ``rope_type`` ``"linear"`` (``factor``) or ``"llama3"`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``).
    ``eos_token_id`` may be one id or a list of ids (see ``eos_token_ids``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a "
                             f"multiple of num_key_value_heads ({self.num_key_value_heads})")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """All end-of-sequence ids as a tuple (empty when the config names none)."""
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id or ())


# ---------------------------------------------------------------------------------------- RoPE


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotation frequency of each dimension pair, ``theta ** (-2i / hd)``, after any RoPE scaling.

    Llama-3 scaling (``rope_type="llama3"``) stretches the context the model was trained on by
    ``factor``: pairs whose wavelength is long compared with the original context (low frequencies)
    are slowed down by ``factor``, short wavelengths (high frequencies) are kept, and the band in
    between is interpolated linearly in ``original_context / wavelength``.

    Returns: float32 tensor (hd // 2,).
    """
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        original_context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        # 0 for long wavelengths (fully slowed down), 1 for short ones (kept), linear in between
        keep = ((original_context / wavelength - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - keep) * inv_freq / factor + keep * inv_freq
    raise NotImplementedError(f"rope_type {kind!r} is not supported (supported: 'default', "
                              f"'linear', 'llama3')")


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Precompute cos and sin for every position, in the "rotate half" layout of HF checkpoints.

    Dimension i is paired with i + hd/2. Rotating a pair (a, b) by angle t gives
    (a cos t - b sin t, b cos t + a sin t), so with x rolled by hd/2 (which swaps the halves) the
    rotation is ``x * cos + roll(x) * sin`` where the first half of ``sin`` carries the minus sign.

    Returns: (cos, sin), float32, each (max_position_embeddings, hd).
    """
    inv_freq = rope_inv_freq(config)  # (hd/2,)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # (P, hd/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (P, hd)
    sin = torch.cat([-angles.sin(), angles.sin()], dim=-1)  # (P, hd), sign folded in
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys ``x`` (B, T, heads, hd) by cos/sin (B, T, 1, hd) of their
    positions."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


# -------------------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    """Root-mean-square layer norm: ``weight * x / sqrt(mean(x^2) + eps)``, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x`` (..., D); returns the same shape and dtype."""
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE: n_h query heads share n_kv key/value heads."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # which layer of the KV cache this attention reads and writes
        self.n_h, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.hd = config.head_dim
        d, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(d, self.n_h * self.hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.n_h * self.hd, d, bias=bias)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three projections of x (B, T, D): q (B, T, n_h * hd), k and v (B, T, n_kv * hd)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache: KVCache | None, plan: ForwardPlan | None,
                drop: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Attend from the T new tokens to themselves or to the cache.

        Args: x (B, T, D); cos, sin (B, T, 1, hd); mask (B, 1, T, S) bool, True = may attend;
        cache and its plan for this forward, or both None; drop — the (row, column) indices of
        the key columns to zero before the product, or None (see ``non_keys``). Returns (B, T, D).
        """
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        # split the heads: q (B, T, n_h, hd), k and v (B, T, n_kv, hd)
        q, k, v = (t.view(B, T, -1, self.hd) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, plan, k, v)  # (B, S, n_kv, hd) each
        if drop is not None:  # masked is not enough: 0 * NaN = NaN
            zero = k.new_zeros(())
            if cache is None:  # this forward's own (maybe split) tensors: zero copies
                k, v = k.index_put(drop, zero), v.index_put(drop, zero)
            else:  # in place: copies or forgotten positions (see ``KVCache.update``)
                k.index_put_(drop, zero), v.index_put_(drop, zero)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # (B, n_h, T, hd)
            k.transpose(1, 2),  # (B, n_kv, S, hd)
            v.transpose(1, 2),  # (B, n_kv, S, hd)
            attn_mask=mask,
            enable_gqa=k.shape[2] != self.n_h,  # each kv head serves n_h / n_kv query heads
        )  # (B, n_h, T, hd)
        out = out.transpose(1, 2).reshape(B, T, self.n_h * self.hd)  # (B, T, n_h * hd)
        return self.o_proj(out)  # (B, T, D)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate and up projections of x (B, T, D): (B, T, F) each."""
        return self.gate_proj(x), self.up_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm transformer layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache, plan, drop=None) -> torch.Tensor:
        """Same arguments as ``Attention.forward``; (B, T, D) -> (B, T, D)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, plan, drop)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class TreeAttention:
    """Where the new tokens of a tree forward are stored, and which tree nodes each may see.

    The cache positions before ``start`` are the committed context: every new token sees them.
    The positions ``start .. start + W - 1`` hold tree nodes (written in this forward or an earlier
    one); new token ``t`` sees position ``start + w`` iff ``mask[b, t, w]``. Positions past
    ``start + W`` are never seen. Without a cache, keys are the new tokens themselves, at columns
    ``storage`` (default ``0..T-1``).

    Attributes:
        storage: (B, T) cache position of each new token's keys/values; -1 marks padding.
        start: (B,) first cache position of the tree region.
        mask: (B, T, W) bool, True = new token t may see tree position ``start + w``. A token must
            see itself (an ancestor mask has a True diagonal).
    """

    storage: torch.Tensor
    start: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def for_nodes(cls, ancestor_mask: torch.Tensor, start: int) -> TreeAttention:
        """One row feeding all N tree nodes at cache positions ``start .. start + N - 1``.

        Args: ancestor_mask (N, N) bool (``DraftTree.ancestor_mask()``); start — cache position
        of node 0 (for a verify, ``n - 1``: the root is the last context token).
        """
        n, device = ancestor_mask.shape[0], ancestor_mask.device
        storage = torch.arange(start, start + n, device=device)[None]  # (1, N)
        return cls(storage, torch.tensor([start], device=device), ancestor_mask[None])


def tree_attention_mask(tree: TreeAttention, key_positions: torch.Tensor) -> torch.Tensor:
    """Boolean mask (B, 1, T, S) of a tree forward: committed keys, plus the tree nodes allowed.

    Args: tree — see [`TreeAttention`][minispec.models.llama.TreeAttention]; key_positions (B, S)
    cache position of each key column, -1 where there is none. Padding queries see every key (their
    output is ignored).
    """
    B, T, W = tree.mask.shape
    start = tree.start.view(B, 1)  # (B, 1)
    exists = key_positions >= 0  # (B, S)
    committed = exists & (key_positions < start)  # (B, S): the context every token sees
    offset = key_positions - start  # (B, S): tree node of each key column
    in_tree = exists & (offset >= 0) & (offset < W)  # (B, S)
    column = offset.clamp(0, W - 1)[:, None, :].expand(B, T, -1)  # (B, T, S)
    allowed = torch.gather(tree.mask, 2, column) & in_tree[:, None, :]  # (B, T, S)
    visible = committed[:, None, :] | allowed | (tree.storage < 0)[:, :, None]  # (B, T, S)
    return visible[:, None]  # (B, 1, T, S)


def attention_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """Boolean mask (B, 1, T, S): query t may see key s iff ``0 <= key_pos[s] <= query_pos[t]``.

    Args: query_positions (B, T), key_positions (B, S); -1 marks padding (or an empty cache entry).
    A padding query would see no key at all, and an all-masked row makes attention NaN; it is
    allowed to see every key instead (the columns that are not keys are zeroed, see ``non_keys``),
    so its (ignored) output stays finite.
    """
    q = query_positions[:, :, None]  # (B, T, 1)
    k = key_positions[:, None, :]  # (B, 1, S)
    visible = ((k >= 0) & (k <= q)) | (q < 0)  # (B, T, S)
    return visible[:, None]  # (B, 1, T, S)


def attention_plan(positions: torch.Tensor, cache: KVCache | None, slots: list[int] | None,
                   tree: TreeAttention | None) -> tuple[ForwardPlan | None, torch.Tensor, Any]:
    """What every layer of one forward shares: the cache's plan (None without a cache), the mask
    (B, 1, T, S) and the key columns to zero (``non_keys``).

    Args: as for ``Llama.forward``: positions (B, T), -1 marks padding; cache and slots, or
    neither; tree, or None for the chain path (causal by position).
    """
    if (cache is None) != (slots is None):
        raise ValueError("pass a cache and slots (the cache slot of each batch row) together, "
                         "or neither")
    storage = positions if tree is None else tree.storage  # (B, T) where k, v are stored
    plan = None if cache is None else cache.prepare(slots, storage)
    key_positions = storage if plan is None else plan.key_positions  # (B, S); S = T without cache
    if tree is None:
        mask = attention_mask(positions, key_positions)  # (B, 1, T, S), shared by all layers
    else:
        if tree.storage.shape != positions.shape or tree.mask.shape[:2] != positions.shape:
            raise ValueError(f"tree storage {tuple(tree.storage.shape)} and mask "
                             f"{tuple(tree.mask.shape)} must match positions "
                             f"{tuple(positions.shape)}")
        mask = tree_attention_mask(tree, key_positions)  # (B, 1, T, S)
    return plan, mask, non_keys(key_positions)  # the columns every layer zeroes, or None


def non_keys(key_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The key columns attention zeroes: (rows, columns) index tensors (N,), or None if there are
    none.

    A column with key position -1 is not a key of the row's sequence (past its length, a padding
    token, a padded block of the paged cache): it holds whatever was written there last, another
    request's keys and values or the row's own rolled-back ones, possibly NaN or inf. The mask
    hides it, yet ``0 * NaN = NaN`` in the product, so attention zeroes its key and value first:
    such a column contributes exactly zero whatever it holds. The other columns are the row's own.
    With nothing to zero (one unpadded row, the common decode step) attention pays nothing; else
    two small writes per layer, a small share of a batched step (the results page).

    Args: key_positions (B, S), -1 where there is no key.
    """
    rows, columns = (key_positions < 0).nonzero(as_tuple=True)  # (N,) each
    return None if rows.numel() == 0 else (rows, columns)


class Llama(nn.Module):
    """A Llama decoder-only language model that takes explicit positions and an optional KV
    cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # tied: the output projection reuses the embedding matrix, and there is no lm_head
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)  # (P, hd)
        self.register_buffer("rope_sin", sin, persistent=False)  # (P, hd)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, slots: list[int] | None = None,
                return_hidden: bool | tuple[int, ...] = False, tree: TreeAttention | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits for every input token (and, on request, the last hidden states).

        Args:
            input_ids: (B, T) token ids (any valid id at padding positions).
            positions: (B, T) absolute position of each token; -1 marks padding, which is neither
                written to the cache nor attended to (its logits are garbage).
            cache: a ``KVCache``; the new keys/values are written at their positions in
                ``slots`` and every token attends to its slot's cached prefix. Without a cache,
                attention is causal (by position) over the T tokens only.
            slots: (B,) cache slot of each row; required with a cache.
            return_hidden: also return the final-normed hidden states (B, T, D) that the LM head
                reads (the features an EAGLE-style drafter drafts from); they are computed
                anyway, so asking costs nothing. A tuple of layer ids ``(i, j, k)`` returns
                instead the residual stream entering each of those layers, concatenated
                (B, T, 3D): EAGLE-3's fused features (id ``i`` is Hugging Face's
                ``hidden_states[i]``, the output of layer ``i - 1``; ``num_hidden_layers`` is
                the last layer's output, before the final norm).
            tree: score a draft tree (tree attention). ``positions`` are then the RoPE positions
                (committed length + depth: siblings share one), the keys/values are stored at
                ``tree.storage`` and attention follows ``tree.mask`` (see
                [`TreeAttention`][minispec.models.llama.TreeAttention]). ``None``: the chain path,
                storage = positions, causal by position.

        Returns:
            logits (B, T, V) in the model dtype, or ``(logits, hidden)`` with ``return_hidden``.
        """
        x = self.embed_tokens(input_ids)  # (B, T, D)
        streams = self.run_layers(self.layers, x, positions, cache, slots, tree)  # [x, ..., out]
        x = self.norm(streams[-1])  # (B, T, D)
        logits = self.logits(x)  # (B, T, V)
        if return_hidden and isinstance(return_hidden, tuple):  # layer ids: (B, T, 3D) for three
            x = torch.cat([streams[i] for i in return_hidden], dim=-1)
        return (logits, x) if return_hidden else logits

    def run_layers(self, layers, x: torch.Tensor, positions: torch.Tensor,
                   cache: KVCache | None = None, slots: list[int] | None = None,
                   tree: TreeAttention | None = None) -> list[torch.Tensor]:
        """Run decoder ``layers`` on hidden states ``x`` (B, T, D) with this model's RoPE tables.

        ``layers`` are this model's own, or an EAGLE head's one layer (same config). Arguments
        as for ``forward``; every layer shares one attention plan, and the cache's lengths advance
        once, after the last layer wrote. Returns the residual streams, each (B, T, D): the one
        entering each layer (item ``i``: layer ``i``'s input, as ``forward``'s ``return_hidden``
        numbers them), then the last layer's output, before the final norm.
        """
        index = positions.clamp(min=0)  # (B, T); padding reads row 0, harmlessly
        cos = self.rope_cos[index].to(x.dtype).unsqueeze(2)  # (B, T, 1, hd)
        sin = self.rope_sin[index].to(x.dtype).unsqueeze(2)  # (B, T, 1, hd)
        plan, mask, drop = attention_plan(positions, cache, slots, tree)  # mask (B, 1, T, S)
        streams = [x]
        for layer in layers:
            streams.append(layer(streams[-1], cos, sin, mask, cache, plan, drop))  # (B, T, D)
        if cache is not None:
            cache.commit(plan)  # lengths advance once per forward, after every layer wrote
        return streams

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head: final-normed states x (B, T, D) -> logits (B, T, V)."""
        return F.linear(x, self.output_weight)

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head's matrix (V, D): the embedding when tied, else ``lm_head.weight``."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point dtype of the parameters."""
        return self.embed_tokens.weight.dtype


#: How a model runs one step, passed in by whoever drives it: ``forward(model, cache)`` returns
#: ``step(input_ids, positions, slots, tree=None, hidden=False)``, which is ``model.forward`` over
#: ``cache`` with those arguments (``hidden`` is its ``return_hidden``) or gives the same logits
#: another way (a static-shape step replayed as a CUDA graph: ``minispec.speed``).
Forward = Callable[[Llama, "KVCache"], Callable[..., Any]]


def eager_forward(model: Llama, cache: KVCache) -> Callable[..., Any]:
    """The core's ``forward``: ``model.forward`` itself, over ``cache`` (see ``Forward``)."""

    def step(input_ids: torch.Tensor, positions: torch.Tensor, slots: list[int],
             tree: TreeAttention | None = None, hidden: bool | tuple[int, ...] = False) -> Any:
        return model(input_ids, positions, cache, slots, return_hidden=hidden, tree=tree)

    return step
