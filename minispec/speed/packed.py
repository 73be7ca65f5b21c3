"""A fast CPU forward: every projection runs from weights packed once for oneDNN's GEMM kernels.

Why: a decode step reads every weight once, so it should cost about ``weight bytes / bandwidth``
(the roofline), and scoring k+1 tokens about as much as scoring one (r close to 1, Theorem 3.8).
Eager ``F.linear`` misses both on CPU: for 1 to a few dozen rows the BLAS call re-lays out
(packs) the weight matrix on every call, so a 5-row verify pays for the packing again and again.

The fix is to pay the packing once. ``make_fast(model)`` replaces each ``nn.Linear`` of a
``minispec.models.llama.Llama`` (q|k|v merged, o, gate|up merged, down in every layer) and the LM
head by a ``PackedLinear`` that keeps the weight in oneDNN's blocked layout, reordered once, and
calls the same primitive torch's own compiler (inductor, ``freezing=True``, dynamic shapes) emits
for a linear layer on CPU: ``torch.ops.mkldnn._linear_pointwise``. Nothing is compiled, so there is
no start-up beyond the reorder, and every shape is served by the same packed weights; only the
narrowest products stay on the BLAS, where timing says it is faster (``choose_blas_rows``).
[`make_fast`][minispec.speed.packed.make_fast] says what packing changes about the model.

Exactness: the packed GEMM adds the same products in another order than eager's BLAS call, so
logits differ from eager by float32 rounding only, a few units in the last places of the logits'
scale (the tests bound it on the tiny models and the shipped pair). Nor is it bit-stable across
shapes (a k+1-token verify and k+1 one-token steps round differently), so greedy speculative
decoding equals greedy decoding unless two logits tie within that rounding.

Packing buys cheap verification (``r`` near 1), not a step below the roofline; the results page
measures both paths.
"""

from __future__ import annotations

import copy
import math
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from minispec.models.llama import MLP, Attention, Block, Llama

#: dtypes whose weights ``make_fast`` packs (bfloat16 only where the CPU has native bf16 support).
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def _packed_linear(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    """oneDNN's linear on a weight packed by ``_reorder_linear_weight``: (M, K) -> (M, N)."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


class _NoBackward(torch.autograd.Function):
    """The packed linear under autograd: the forward runs, a backward fails loudly (oneDNN's op
    has no derivative, and autograd would otherwise drop its gradient silently)."""

    @staticmethod
    def forward(ctx, rows, packed, bias):
        return _packed_linear(rows, packed, bias)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("the fast (packed) forward has no backward; call "
                           "minispec.speed.packed.make_eager(model) before training")


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` from a weight reordered once into oneDNN's blocked layout.

    Args:
        weight: (N, K) the original weight; kept as the module's ``weight`` (same tensor, so a
            ``state_dict`` reads as before), and packed into ``self.packed``.
        bias: (N,) or None.

    Attributes:
        blas_rows: a product of at most this many rows (a one-token step has one) runs on the
            unpacked ``weight`` with the BLAS instead of oneDNN's packed kernel; ``make_fast``
            times both on the model
            ([`choose_blas_rows`][minispec.speed.packed.choose_blas_rows]).
    """

    blas_rows = 0

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():  # packed once: an opaque oneDNN tensor, not a parameter
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self._bias = None if bias is None else bias.detach()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        """Pack an ``nn.Linear`` (its parameters are reused, not copied)."""
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., N), the same as ``F.linear(x, weight, bias)`` up to float rounding."""
        rows = x.reshape(-1, self.in_features)  # (M, K): every token of every row at once
        if rows.shape[0] == 0:  # oneDNN does not take an empty matrix
            return F.linear(x, self.weight, self.bias)
        if torch.is_grad_enabled() and rows.requires_grad:
            y = _NoBackward.apply(rows, self.packed, self._bias)
        elif rows.shape[0] <= self.blas_rows:
            y = F.linear(rows, self.weight, self.bias)
        else:
            y = _packed_linear(rows, self.packed, self._bias)
        return y.view(*x.shape[:-1], self.out_features)  # (..., N)

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        """A copy packs its own copy of the weight (oneDNN's packed tensor has no storage to
        copy)."""
        twin = PackedLinear(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo))
        twin.blas_rows = self.blas_rows                  # and keeps the kernels timed for it
        return twin

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` holding the same (unpacked) parameters."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        linear.weight, linear.bias = self.weight, self.bias
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


def unavailable_reason(model: Llama) -> str | None:
    """Why ``make_fast`` cannot pack ``model`` here, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn) support"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks torch.ops.mkldnn._linear_pointwise"
    if model.device.type != "cpu":
        return f"the fast path packs CPU weights; the model is on {model.device}"
    if model.dtype not in PACKED_DTYPES:
        return f"dtype {model.dtype} is not packed (packed: float32, bfloat16)"
    if model.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no native bfloat16 support for oneDNN"
    return None


def _merged(*linears: nn.Linear) -> PackedLinear:
    """One packed matrix for several projections of the same input (rows stacked in order; all or
    none of them have a bias)."""
    weight = torch.cat([linear.weight.detach() for linear in linears])  # (sum N_i, K)
    biases = [linear.bias.detach() for linear in linears if linear.bias is not None]
    return PackedLinear(weight, torch.cat(biases) if biases else None)  # bias (sum N_i,) or None


class PackedAttention(Attention):
    """Attention whose q|k|v projections are one packed matrix (``qkv_proj``)."""

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One GEMM reads the three weights: (B, T, (n_h + 2 n_kv) * hd), split as views."""
        return self.qkv_proj(x).split([self.n_h * self.hd, self.n_kv * self.hd,
                                       self.n_kv * self.hd], dim=-1)


class PackedMLP(MLP):
    """SwiGLU whose gate|up projections are one packed matrix (``gate_up_proj``)."""

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One GEMM reads both weights: (B, T, 2F), split as views."""
        return self.gate_up_proj(x).chunk(2, dim=-1)


class PackedLlama(Llama):
    """A Llama whose LM head runs from a packed copy (``packed_head``)."""

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, V) through the packed head."""
        return self.packed_head(x)


def is_fast(model: Llama) -> bool:
    """Whether ``model`` runs packed (``make_fast`` succeeded on it)."""
    return isinstance(model, PackedLlama)


def make_fast(model: Llama, blas_rows: int | None = None) -> Llama:
    """Pack every projection and the LM head of ``model`` once, in place; returns ``model``.

    Every layer is packed by [`pack_block`][minispec.speed.packed.pack_block]; the LM head gets a
    packed copy. Logits equal eager's up to float rounding, for any batch size and number of tokens.
    Calling it twice is harmless: on a model that is already fast it does nothing, ``blas_rows``
    included (``set_blas_rows`` changes the kernels of a fast model). Where the fast path is
    unavailable (see ``unavailable_reason``) it warns once and returns the model unchanged
    (eager): a torch built without oneDNN, a non-CPU device, a dtype it does not pack.

    The packing is in place and undoable (``make_eager``). The original ``weight`` parameters stay
    in place, so ``state_dict()`` and ``parameters()`` are unchanged; the packed copies are extra
    memory (about the size of the projection weights); ``copy.deepcopy`` repacks. The fast path is
    for inference: a forward under autograd runs, a backward raises. Pack after moving the model
    (``.to(...)`` does not move the packed copies) and after editing weights (packing is a
    snapshot), and pickle the ``state_dict``, not the module.

    Args:
        model: a ``minispec.models.llama.Llama`` on CPU, float32 (or bfloat16 where the CPU
            supports it).
        blas_rows: products of at most this many rows run on the BLAS
            (``PackedLinear.blas_rows``); ``None``: as many as are faster there on this machine,
            timed once ([`choose_blas_rows`][minispec.speed.packed.choose_blas_rows]).

    Returns:
        The same model object, now fast (or still eager, with a warning).
    """
    if is_fast(model):
        return model
    if (reason := unavailable_reason(model)) is not None:
        warnings.warn(f"minispec.speed.packed: {reason}; running the eager forward",
                      RuntimeWarning, stacklevel=2)
        return model
    for layer in model.layers:
        pack_block(layer)
    # a plain tensor, not a parameter: the head adds no entry to state_dict() or parameters()
    model.packed_head = PackedLinear(model.output_weight.detach())     # tied: the embedding
    model.__class__ = PackedLlama       # the same object, its LM head's seam overridden
    set_blas_rows(model, choose_blas_rows(model) if blas_rows is None else blas_rows)
    return model


def set_blas_rows(model: nn.Module, rows: int) -> None:
    """Every ``PackedLinear`` of ``model`` runs products of at most ``rows`` rows on the BLAS."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.blas_rows = rows


@torch.inference_mode()
def choose_blas_rows(model: Llama, most: int = 8, repeats: int = 3) -> int:
    """Up to how many rows (at most ``most``) the BLAS multiplies faster than oneDNN's packed
    kernel, timed on ``model``: forwards of 1, 2, ... tokens with each, until the packed one wins.

    Which is faster depends on the CPU and the width (the results page: the BLAS up to 3 rows on
    an Intel Xeon; on an AMD EPYC, packing alone gave the faster one-token step). Both give the same
    logits up to float rounding. Each forward is timed on the wall clock, the two kernels
    alternating, and the least of ``repeats`` counts (the least is what load disturbs least).
    """
    for rows in range(most):
        ids = torch.zeros(1, rows + 1, dtype=torch.long, device=model.device)    # (1, rows + 1)
        positions = torch.arange(rows + 1, device=model.device)[None]           # (1, rows + 1)
        best = {rows: math.inf, rows + 1: math.inf}      # rows + 1: this width on the BLAS
        for blas in (rows, rows + 1) * repeats:
            set_blas_rows(model, blas)
            start = time.perf_counter()
            model(ids, positions)
            best[blas] = min(best[blas], time.perf_counter() - start)
        if best[rows + 1] >= best[rows]:
            return rows
    return most


def pack_block(layer: Block) -> Block:
    """Pack one decoder layer in place: q|k|v and gate|up merged, o and down as they are.

    Per layer, q|k|v become one packed matrix and gate|up another (as nano-vllm and vLLM merge
    them): fewer, larger GEMMs stream the weights faster at 1-16 rows.
    """
    attn, mlp = layer.self_attn, layer.mlp
    attn.qkv_proj = _merged(attn.q_proj, attn.k_proj, attn.v_proj)
    attn.o_proj = PackedLinear.from_linear(attn.o_proj)
    mlp.gate_up_proj = _merged(mlp.gate_proj, mlp.up_proj)
    mlp.down_proj = PackedLinear.from_linear(mlp.down_proj)
    attn.__class__, mlp.__class__ = PackedAttention, PackedMLP     # their seams overridden
    return layer


def make_eager(model: Llama) -> Llama:
    """Undo ``make_fast`` in place (drop the packed copies); returns ``model``."""
    for layer in model.layers:  # undo pack_block
        attn, mlp = layer.self_attn, layer.mlp
        if isinstance(attn, PackedAttention):
            del attn.qkv_proj
            attn.__class__, attn.o_proj = Attention, attn.o_proj.to_linear()
        if isinstance(mlp, PackedMLP):
            del mlp.gate_up_proj
            mlp.__class__, mlp.down_proj = MLP, mlp.down_proj.to_linear()
    if isinstance(model, PackedLlama):
        del model.packed_head
        model.__class__ = Llama
    return model


def packed_bytes(model: Llama) -> int:
    """Bytes of packed weights one fast forward reads (0 for an eager model: it has none)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if isinstance(m, PackedLinear))
