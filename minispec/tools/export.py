"""Export an EAGLE head to the checkpoint layout that vLLM and SGLang load.

Both engines read EAGLE-1 heads as a Llama checkpoint of one decoder layer plus ``fc``:

* ``config.json``: a transformers ``LlamaConfig`` with ``architectures = ["LlamaForCausalLM"]``
  and ``num_hidden_layers = 1``; every other field is the target's (vLLM renames the architecture
  to ``EagleLlamaForCausalLM`` itself, SGLang to ``LlamaForCausalLMEagle``);
* ``model.safetensors``: ``fc.weight`` (D, 2D) applied to ``[embed(x_t) ; f_{t-1}]`` (embedding
  first), ``fc.bias`` (vLLM's ``fc`` has no bias and skips it; SGLang's has one and loads it, so
  it is written as zeros), and ``layers.0.*`` with the usual Llama names, **without**
  ``layers.0.input_layernorm`` (both drop that norm in the first layer, as EAGLE-1 did);
* nothing else: the embedding and the LM head are the target's, shared at load time, and the
  layer's output goes to the LM head without a final norm.

Positions: vLLM gives the pair ``(f_{t-1}, x_t)`` the position of ``x_t``, minispec the pair index
``t - 1``. RoPE sees only differences of positions, so the head computes the same either way
(tests/test_export.py checks it).

That is minispec's ``layout="eagle1"``
([`EagleHead`][minispec.models.eagle_head.EagleHead]); the shipped head uses the ``"minispec"``
layout (a bias, the input norm, a final norm and a reduced draft vocabulary), which neither engine
computes, so it is refused here rather than exported into a head that drafts something else.
Train one for serving with ``python -m minispec.tools.train_eagle --layout eagle1``.

Command line: ``python -m minispec.tools.export HEAD_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from minispec.models.eagle_head import read_head

__all__ = ["LLAMA_FIELDS", "export_head", "main"]

#: The target's config fields a Llama ``config.json`` carries over unchanged.
LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
                "bos_token_id", "eos_token_id")


def llama_config(target_config: dict, dtype: torch.dtype) -> dict:
    """The head's ``config.json``: the target's fields, one hidden layer."""
    config = {field: target_config[field] for field in LLAMA_FIELDS}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config,
            "num_hidden_layers": 1, "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch.")}


def exported_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """minispec's names (``fc.*``, ``layer.*``, ``vocab``) renamed to EAGLE-1's."""
    out = {"fc.weight": tensors["fc.weight"],
           "fc.bias": tensors["fc.weight"].new_zeros(tensors["fc.weight"].shape[0])}
    for name, tensor in tensors.items():
        if name.startswith("layer."):
            out["layers.0." + name.removeprefix("layer.")] = tensor
    return {name: tensor.contiguous() for name, tensor in out.items()}


def export_head(head_dir: str | Path, out_dir: str | Path, *,
                dtype: torch.dtype = torch.float16) -> Path:
    """Write the head saved in ``head_dir`` as an EAGLE-1 checkpoint in ``out_dir``.

    Args:
        head_dir: a directory written by
            [`save_head`][minispec.models.eagle_head.save_head] (``head.safetensors`` and
            ``eagle_config.json``).
        out_dir: created if needed; receives ``config.json`` and ``model.safetensors``.
        dtype: storage type of the weights.

    Raises:
        FileNotFoundError: ``head_dir`` holds no head.
        ValueError: the head is not in the ``"eagle1"`` layout, or drafts over a reduced
            vocabulary (both engines draft over the target's full LM head).
    """
    from safetensors.torch import save_file

    saved, tensors = read_head(head_dir)
    out_dir = Path(out_dir)
    target_config = saved["target_config"]
    layout = saved.get("layout", "minispec")
    if layout != "eagle1":
        raise ValueError(f"this head has the {layout!r} layout (fc bias, input norm, final norm), "
                         "which vLLM and SGLang do not compute; train one with --layout eagle1")
    if saved["draft_vocab_size"] != target_config["vocab_size"]:
        raise ValueError(f"this head drafts over {saved['draft_vocab_size']} of "
                         f"{target_config['vocab_size']} tokens; vLLM's and SGLang's EAGLE-1 "
                         "heads draft over the target's full LM head")
    tensors = exported_tensors(tensors)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({name: t.to(dtype) for name, t in tensors.items()},
              str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = llama_config(target_config, dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> Path:
    """``python -m minispec.tools.export HEAD_DIR OUT_DIR [--dtype bfloat16]``."""
    p = argparse.ArgumentParser(prog="python -m minispec.tools.export",
                                description="Export an EAGLE head (layout 'eagle1') to the "
                                            "checkpoint layout vLLM and SGLang load.")
    p.add_argument("head_dir", type=Path, help="a head written by save_head / train_eagle")
    p.add_argument("out_dir", type=Path, help="where config.json and model.safetensors go")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    args = p.parse_args(argv)
    out = export_head(args.head_dir, args.out_dir, dtype=getattr(torch, args.dtype))
    print(f"exported to {out}: config.json, model.safetensors")
    return out


if __name__ == "__main__":
    main()
