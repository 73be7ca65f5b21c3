"""An EAGLE-style draft head: one decoder layer that drafts from the target's own features.

A draft model (Leviathan et al.) reads only tokens, but the target's last hidden state ``f_t``
(final-normed, what the LM head reads) already holds what it "thinks" comes after token ``t``. EAGLE
(Li et al., 2024) drafts from those features: a head of about one decoder layer reads the pair

    (f_{t-1}, x_t)   -- the target's feature at t-1 and the token that followed it

and predicts the next feature ``f'_t``, which the target's own frozen LM head turns into the draft
distribution ``q`` for token ``t + 1``; the token resolves what the feature alone cannot (which of
the target's likely tokens was sampled). Later drafts read the head's own predicted features
(EAGLE-1): the target has not scored the drafts yet.

The head, layer by layer (D the target's hidden size)::

    e    = embed(x_t)                    # the target's frozen embedding       (B, T, D)
    h    = fc([e ; f_{t-1}])             # 2D -> D                              (B, T, D)
    h    = Block(h)                      # one Llama decoder layer, its own KV cache
    f'_t = norm(h)                       # the target's frozen final norm
    q    = softmax(f'_t @ W_V'^T)        # the target's LM head, rows of the draft vocabulary V'

The draft vocabulary ``V'`` (optional) keeps the LM head's rows of the most frequent tokens (the
FR-Spec lever: on SmolLM2-135M the full head is 28 M of 135 M parameters); ``q`` is zero outside
``V'``, so verification stays exact. Layouts, and EAGLE-3's fused target layers (``aux_layers``):
[`EagleHead`][minispec.extra_drafters.eagle_head.EagleHead].
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from minispec.models.kv_cache import KVCache
from minispec.models.llama import Block, Llama, ModelConfig, RMSNorm, TreeAttention
from minispec.speed import packed

__all__ = ["Eagle3Block", "EagleHead", "default_aux_layers", "load_head", "save_head"]

LAYOUTS = ("minispec", "eagle1", "eagle3")

#: The target's shape a head is made for: ``bind`` refuses a target that differs in one of them.
SHAPE = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's three target layers for a target of ``num_layers``: the streams entering layers
    ``2``, ``L // 2`` and ``L - 3`` (clamped into ``0..L`` for a tiny target, sorted)."""
    L = num_layers
    return tuple(sorted((min(2, L), L // 2, max(L - 3, 0))))


class Eagle3Block(Block):
    """EAGLE-3's decoder layer (vLLM's ``llama_eagle3.LlamaDecoderLayer`` at ``layer_idx`` 0):
    it reads ``[e ; g]`` (2D), normalises each half with its own norm (``input_layernorm`` the
    embedding, ``hidden_norm`` the fused feature), attends with q, k, v over the 2D concatenation,
    and adds the attention to ``g`` (the residual is ``g`` before its norm); the MLP half is
    Llama's."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, layer_idx=0)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        attn, d, bias = self.self_attn, 2 * config.hidden_size, config.attention_bias
        attn.q_proj, attn.k_proj, attn.v_proj = (nn.Linear(d, n * attn.hd, bias=bias)
                                                 for n in (attn.n_h, attn.n_kv, attn.n_kv))

    def forward(self, x, cos, sin, mask, cache, plan, drop=None) -> torch.Tensor:
        """``Block.forward``'s arguments, ``x`` (B, T, 2D) = ``[e ; g]``; returns (B, T, D)."""
        e, g = x.chunk(2, dim=-1)
        x = torch.cat([self.input_layernorm(e), self.hidden_norm(g)], dim=-1)       # (B, T, 2D)
        h = g + self.self_attn(x, cos, sin, mask, cache, plan, drop)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    """The head's own weights, plus references to the target's frozen embedding, norm and LM head.

    Pair ``j = t - 1`` sits at position ``j`` of the head's cache (positions and RoPE count pairs).
    Only the head's own weights (``fc``, the layer, the vocabulary ids; an ``"eagle3"`` head's
    norm and LM head) are saved; the embedding, norm, LM head and RoPE tables are the target's,
    bound with [`EagleHead.bind`][minispec.extra_drafters.eagle_head.EagleHead.bind].

    Three layouts. ``"minispec"`` (the module docstring's, the shipped head) normalises twice: the
    layer's input norm and the target's final norm on ``f'_t``. ``"eagle1"`` is the layout of
    EAGLE-1's checkpoints, which vLLM's and SGLang's EAGLE loaders read: ``fc`` has no bias, the
    layer reads ``fc``'s output without its input norm, and the layer's output goes to the full LM
    head as it is (no final norm: the head learns to output normed-looking features itself). A
    head trained in that layout can be served there
    ([`minispec.tools.export`][minispec.tools.export]).

    EAGLE-3 (Li et al., 2025) reads more of the target than its last layer: a head with
    ``aux_layers`` ``(i, j, k)`` gets, in place of the target's ``f_{t-1}``, its residual stream
    entering three layers (low, middle, high; by default EAGLE-3's ``2, L/2, L-3``:
    [`default_aux_layers`][minispec.extra_drafters.eagle_head.default_aux_layers]), concatenated,
    and fuses them first, ``g = fuse([s_i; s_j; s_k])`` (``3D -> D``, no bias), then goes on with
    ``g`` for ``f_{t-1}``. Later drafts read the head's own ``f'`` as before (only the pairs of
    real positions read the target's layers).

    ``"eagle3"`` is the layout of EAGLE-3's checkpoints in the speculators format, which vLLM
    loads (``llama_eagle3.py``; [`minispec.tools.export`][minispec.tools.export]): ``fc``
    (``3D -> D``, no bias) fuses the three layers into ``g``, one
    [`Eagle3Block`][minispec.extra_drafters.eagle_head.Eagle3Block] reads ``[e ; g]``, and the
    head's own final ``norm`` and ``lm_head`` (``V'`` rows, frozen; both start as the target's:
    [`init_from_target`][minispec.extra_drafters.eagle_head.EagleHead.init_from_target]) give the
    logits. The feature passed on to the next draft is the layer's output before that norm, as
    vLLM's drafting loop passes it. ``aux_layers`` defaults to EAGLE-3's there.

    Args:
        config: the target's [`ModelConfig`][minispec.models.llama.ModelConfig]; the head uses one
            layer of it (``self.config`` has ``num_hidden_layers = 1``, which is what shapes its KV
            cache).
        vocab: the draft vocabulary ``V'`` as sorted token ids, or ``None`` for the full one.
        layout: ``"minispec"``, ``"eagle1"`` or ``"eagle3"`` (above).
        aux_layers: EAGLE-3: the three target layers (ids in ``0..L``, as ``Llama.forward``'s
            ``return_hidden``) whose streams the head fuses with ``fuse`` (``3D -> D``; ``fc`` in
            the ``"eagle3"`` layout, where ``None`` means EAGLE-3's default layers); ``None``:
            the target's final-normed feature (EAGLE-1).
    """

    def __init__(self, config: ModelConfig, vocab: torch.Tensor | None = None,
                 layout: str = "minispec", aux_layers: tuple[int, ...] | None = None) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        L, D = config.num_hidden_layers, config.hidden_size
        eagle3 = layout == "eagle3"
        aux_layers = default_aux_layers(L) if eagle3 and aux_layers is None else aux_layers
        if aux_layers is not None and (len(aux_layers) != 3 or not all(
                0 <= int(i) <= L for i in aux_layers)):
            raise ValueError(f"aux_layers must be three layer ids in [0, {L}], not {aux_layers}")
        self.aux_layers = None if aux_layers is None else tuple(int(i) for i in aux_layers)
        self.config = dataclasses.replace(config, num_hidden_layers=1)
        self.layout = layout
        self.fuse = None if aux_layers is None or eagle3 else nn.Linear(3 * D, D, bias=False)
        self.fc = nn.Linear((3 if eagle3 else 2) * D, D, bias=layout == "minispec")
        self.layer = Eagle3Block(self.config) if eagle3 else Block(self.config, layer_idx=0)
        if layout == "eagle1":
            self.layer.input_layernorm = nn.Identity()     # the layer reads fc's output as it is
        vocab = torch.as_tensor(range(config.vocab_size) if vocab is None else vocab).long()
        if (vocab.ndim != 1 or vocab.numel() == 0 or vocab.min() < 0
                or vocab.max() >= config.vocab_size):
            raise ValueError(f"vocab must be 1-D token ids in [0, {config.vocab_size})")
        if not torch.equal(vocab, vocab.unique()):
            raise ValueError("vocab must be sorted and without repeats")
        self.register_buffer("vocab", vocab)                                   # (V',)
        # eagle3: the head's own final norm and frozen LM head over V' (None: the target's)
        self.norm = RMSNorm(D, config.rms_norm_eps) if eagle3 else None
        self.lm_head = (nn.Linear(D, len(vocab), bias=False).requires_grad_(False) if eagle3
                        else None)
        self._target: tuple[Llama, ...] = ()
        self.head_weight: torch.Tensor | None = None        # (V', D), the LM head's rows of V'
        self.packed_logits: nn.Module | None = None         # those rows packed (make_fast)

    # ------------------------------------------------------------------ the target's parts

    def bind(self, target: Llama) -> EagleHead:
        """Read out through ``target``'s embedding, final norm and LM head (kept frozen; not saved;
        an ``"eagle3"`` head reads only the embedding, its norm and ``lm_head`` being its own).

        Raises:
            ValueError: the target's shape differs from the one the head was made for.
        """
        c, t = self.config, target.config
        for field in SHAPE:
            if getattr(c, field) != getattr(t, field):
                raise ValueError(f"this head was made for a target with {field}="
                                 f"{getattr(c, field)}, the target given has {getattr(t, field)}")
        if self.aux_layers and max(self.aux_layers) > t.num_hidden_layers:
            raise ValueError(f"aux_layers {self.aux_layers}: the target has {t.num_hidden_layers}")
        self._target = (target,)
        weight = target.output_weight
        self.head_weight = weight.detach()[self.vocab.to(weight.device)]      # (V', D)
        self.packed_logits = None
        return self

    @torch.no_grad()
    def init_from_target(self, layer: bool = True) -> EagleHead:
        """Start from the bound target's last decoder layer, with ``fc`` passing the feature through
        (``fc([e; f]) = f``): at step 0 the head applies the target's last layer once more to the
        target's feature, a better start than random weights for a short training budget.

        An ``"eagle3"`` head's own ``norm`` and ``lm_head`` always start as the target's final
        norm and LM head rows of ``V'`` (``layer=False``: only those); its layer's q, k, v read
        the target's weights on the ``g`` half and zeros on the embedding half, ``hidden_norm``
        the target's input norm, and ``fc`` passes the highest of the three layers through."""
        target, d = self.target, self.config.hidden_size
        if self.lm_head is not None:
            self.norm.load_state_dict(target.norm.state_dict())
            self.lm_head.weight.copy_(self.head_weight)
        if not layer:
            return self
        last = target.layers[-1].state_dict()
        if self.layout == "eagle3":                  # q, k, v: zeros on e, the target's on g
            for name in (f"self_attn.{p}_proj.weight" for p in "qkv"):
                last[name] = torch.cat([torch.zeros_like(last[name]), last[name]], dim=1)
            last["hidden_norm.weight"] = last["input_layernorm.weight"]
        self.layer.load_state_dict(last, strict=False)
        for linear in (self.fc, self.fuse):   # pass the feature, or the highest of three layers
            if linear is not None:
                linear.weight.zero_()
                linear.weight[:, -d:] = torch.eye(d)
        if self.fc.bias is not None:
            self.fc.bias.zero_()
        return self

    @property
    def target(self) -> Llama:
        """The bound target (``ValueError`` before
        [`bind`][minispec.extra_drafters.eagle_head.EagleHead.bind])."""
        if not self._target:
            raise ValueError("the head is not bound to a target: call head.bind(target)")
        return self._target[0]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def draft_vocab_size(self) -> int:
        return int(self.vocab.numel())

    # ------------------------------------------------------------------ forward

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None, slots: list[int] | None = None,
                tree: TreeAttention | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Predict the next features and the draft logits for every pair.

        Args:
            input_ids: (B, T) the tokens ``x_t``.
            features: (B, T, D) the features ``f_{t-1}`` (the target's, or the head's own); for a
                head with ``aux_layers`` the target's are its three layers, (B, T, 3D), fused
                here.
            positions: (B, T) pair index ``t - 1`` of each row; -1 marks padding.
            cache: the head's KV cache, or None (causal over T; then ``slots`` is None too).
            slots: each row's slot in ``cache``, or None with no cache.
            tree: draft-tree pairs (needs ``cache``): stored at ``tree.storage`` and attending by
                ``tree.mask``, as in the target's tree forward
                ([`TreeAttention`][minispec.models.llama.TreeAttention]); None for causal pairs.

        Returns:
            (logits (B, T, V') over the draft vocabulary, predicted features f'_t (B, T, D)).
        """
        target, eagle3 = self.target, self.layout == "eagle3"
        if features.shape[-1] != self.config.hidden_size:   # the target's layers (B, T, 3D) -> D
            features = self.fc(features) if eagle3 else self.fuse(features)
        e = target.embed_tokens(input_ids).to(features.dtype)                  # (B, T, D)
        h = torch.cat([e, features], dim=-1)                                    # (B, T, 2D)
        # the layer runs with the target's RoPE tables (same config)
        h = target.run_layers([self.layer], h if eagle3 else self.fc(h), positions, cache, slots,
                              tree)[-1]                                         # (B, T, D)
        if eagle3:                   # the logits read the own norm; the pre-norm h is passed on
            return self.logits(self.norm(h)), h
        feature = target.norm(h) if self.layout == "minispec" else h            # (B, T, D)
        return self.logits(feature), feature

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Draft logits over ``V'``: the target's LM head rows of the draft vocabulary, or an
        ``"eagle3"`` head's own ``lm_head`` (the head must be bound; ``forward`` checks that
        first)."""
        if self.packed_logits is not None:
            return self.packed_logits(feature)
        weight = self.head_weight if self.lm_head is None else self.lm_head.weight
        return F.linear(feature, weight)                                        # (B, T, V')

    def make_fast(self) -> EagleHead:
        """Pack ``fc``, the layer and the ``V'`` rows for oneDNN
        ([`minispec.speed.packed`][minispec.speed.packed]), in place, for inference: the same
        drafts up to float rounding. Warns and stays eager where the fast path is unavailable;
        [`bind`][minispec.extra_drafters.eagle_head.EagleHead.bind] again after it to re-pack the LM
        head rows."""
        if (reason := packed.unavailable_reason(self.target)) is not None:
            warnings.warn(f"minispec.speed.packed: {reason}; the head runs eager", RuntimeWarning,
                          stacklevel=2)
            return self
        packed.pack_block(self.layer)
        for name in ("fc", "fuse"):                 # each an nn.Linear, None or already packed
            if isinstance(linear := getattr(self, name), nn.Linear):
                setattr(self, name, packed.PackedLinear.from_linear(linear))
        self.packed_logits = packed.PackedLinear(
            self.head_weight if self.lm_head is None else self.lm_head.weight)
        head = getattr(self.target, "packed_head", None)   # the fast target's choice of kernels
        packed.set_blas_rows(self, 0 if head is None else head.blas_rows)
        return self


# ---------------------------------------------------------------------------- files

WEIGHTS, CONFIG = "head.safetensors", "eagle_config.json"


def save_head(head: EagleHead, directory: str | Path, *, dtype: torch.dtype = torch.float16,
              extra: dict | None = None) -> Path:
    """Write the head's own weights (``fc``, the layer, the vocabulary) and its config.

    Args:
        head: the head.
        directory: created if needed.
        dtype: storage type of the float weights (float16 halves the size; loading casts back).
        extra: more JSON-able facts for ``eagle_config.json`` (data, steps, measured alpha).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.to(dtype) if t.is_floating_point() else t).contiguous().cpu()
               for name, t in head.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS))
    config = {"target_config": dataclasses.asdict(head.config) | {"num_hidden_layers": None},
              "draft_vocab_size": head.draft_vocab_size, "layout": head.layout,
              "aux_layers": head.aux_layers, **(extra or {})}
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_head(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The saved configuration and tensors of a head written by
    [`save_head`][minispec.extra_drafters.eagle_head.save_head], as stored (no model is built).

    Raises:
        FileNotFoundError: the directory lacks ``head.safetensors`` or ``eagle_config.json``.
    """
    directory = Path(directory)
    if missing := [f for f in (WEIGHTS, CONFIG) if not (directory / f).is_file()]:
        raise FileNotFoundError(f"{directory} holds no EAGLE head: {', '.join(missing)} missing")
    return json.loads((directory / CONFIG).read_text()), load_file(str(directory / WEIGHTS))


def load_head(directory: str | Path, target: Llama) -> EagleHead:
    """A head saved by [`save_head`][minispec.extra_drafters.eagle_head.save_head], bound to
    ``target`` on its device and dtype.

    Raises:
        FileNotFoundError: the directory lacks ``head.safetensors`` or ``eagle_config.json``.
        ValueError: the head was made for a target of another shape (hidden size, vocabulary...).
    """
    saved, tensors = read_head(directory)
    shape = {k: saved["target_config"][k] for k in (*SHAPE, "intermediate_size")}
    config = dataclasses.replace(target.config, **shape)
    head = EagleHead(config, vocab=tensors["vocab"], layout=saved.get("layout", "minispec"),
                     aux_layers=saved.get("aux_layers"))
    head.to(device=target.device, dtype=target.dtype).load_state_dict(tensors)  # cast as copied
    return head.eval().requires_grad_(False).bind(target)  # raises on a target of another shape
