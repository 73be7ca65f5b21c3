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

That is minispec's ``layout="eagle1"`` ([`EagleHead`][minispec.models.eagle_head.EagleHead]); the
shipped head uses the ``"minispec"`` layout (a bias, the input norm, a final norm and a reduced
draft vocabulary), which neither engine computes, so it is refused here rather than exported into a
head that drafts something else. Train one for serving with
``python -m minispec.tools.train_eagle --layout eagle1`` and export it with
``python -m minispec.tools.export HEAD_DIR OUT_DIR [--overwrite]`` (an ``OUT_DIR`` that holds files
needs ``--overwrite``: ``check_out_dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from minispec.models.eagle_head import read_head

__all__ = ["LLAMA_FIELDS", "OUTPUT_FILES", "check_out_dir", "export_head", "main"]

#: The target's config fields a Llama ``config.json`` carries over unchanged.
LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
                "bos_token_id", "eos_token_id")

#: The files an export writes into its output folder.
OUTPUT_FILES = ("config.json", "model.safetensors")


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


def _nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else its closest ancestor that does."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(out_dir: str | Path, overwrite: bool = False) -> Path:
    """``out_dir`` as a ``Path`` if an export may write there; nothing is created.

    The export writes ``config.json`` and ``model.safetensors``, the names of any Hugging Face
    model's files, so an export into a model's folder would replace that model's: ``out_dir``
    must be new or empty unless ``overwrite`` (``--overwrite`` on the command line). A bad path is
    refused before anything is written: one line and exit status 2 on the command line, a
    ``ValueError`` in Python.

    Args:
        out_dir: a new folder (created by the export, with its parents) or an existing one.
        overwrite: allow a folder that already holds files (``config.json`` and
            ``model.safetensors`` in it are replaced; other files stay).

    Raises:
        ValueError: ``out_dir`` is empty, is or lies under a file, is not empty (without
            ``overwrite``), or lies in a folder this process cannot write.
    """
    if not str(out_dir).strip():
        raise ValueError(f"out_dir must name a folder, got {str(out_dir)!r} (an empty path would "
                         "write into the current directory)")
    path = Path(out_dir)
    existing = _nearest_existing(path)
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise ValueError(f"out_dir {path} {where}; give a folder")
    if existing == path and any(path.iterdir()) and not overwrite:
        held = sorted(p.name for p in path.iterdir())
        raise ValueError(f"out_dir {path} is not empty (it holds {', '.join(held[:4])}"
                         f"{', ...' if len(held) > 4 else ''}); give a new or empty folder, or "
                         f"--overwrite (overwrite=True) to replace {' and '.join(OUTPUT_FILES)}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir {path}: {existing} is not writable by this process")
    return path


def _write(out_dir: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Write ``model.safetensors`` and ``config.json``; a failure of the file system is a
    ``ValueError`` that names the folder."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    except (OSError, SafetensorError) as err:
        raise ValueError(f"out_dir {out_dir}: cannot write the export: "
                         f"{getattr(err, 'strerror', None) or err}") from err


def _read_eagle1(head_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The target's config and the exported tensors of the ``"eagle1"`` head in ``head_dir``.

    Raises:
        FileNotFoundError: ``head_dir`` holds no head.
        ValueError: its files are unreadable, or the head is one neither engine computes.
    """
    from safetensors import SafetensorError

    try:
        saved, tensors = read_head(head_dir)
        target_config, layout = saved["target_config"], saved.get("layout", "minispec")
        vocab, draft_vocab = target_config["vocab_size"], saved["draft_vocab_size"]
        tensors = exported_tensors(tensors)
    except (SafetensorError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as err:
        raise ValueError(f"head_dir {head_dir}: not a readable EAGLE head "
                         f"({type(err).__name__}: {err})") from err
    if layout != "eagle1":
        raise ValueError(f"the head in {head_dir} has the {layout!r} layout (fc bias, input norm, "
                         "final norm), which vLLM and SGLang do not compute; train one with "
                         "--layout eagle1")
    if draft_vocab != vocab:
        raise ValueError(f"the head in {head_dir} drafts over {draft_vocab} of {vocab} tokens; "
                         "vLLM's and SGLang's EAGLE-1 heads draft over the target's full LM head")
    return target_config, tensors


def export_head(head_dir: str | Path, out_dir: str | Path, *, dtype: torch.dtype = torch.float16,
                overwrite: bool = False) -> Path:
    """Write the head saved in ``head_dir`` as an EAGLE-1 checkpoint in ``out_dir``.

    Args:
        head_dir: a directory written by
            [`save_head`][minispec.models.eagle_head.save_head] (``head.safetensors`` and
            ``eagle_config.json``).
        out_dir: a new or empty folder (created if needed, with its parents); receives
            ``config.json`` and ``model.safetensors``.
        dtype: storage type of the weights.
        overwrite: allow an ``out_dir`` that already holds files, replacing the two above.

    Raises:
        FileNotFoundError: ``head_dir`` holds no head.
        ValueError: ``out_dir`` is refused (see
            [`check_out_dir`][minispec.tools.export.check_out_dir]) or cannot be written; the
            head's files are unreadable, or it is not in the ``"eagle1"`` layout, or it drafts
            over a reduced vocabulary (both engines draft over the target's full LM head).
    """
    out_dir = check_out_dir(out_dir, overwrite)
    target_config, tensors = _read_eagle1(head_dir)
    tensors = {name: t.to(dtype) for name, t in tensors.items()}
    _write(out_dir, tensors, llama_config(target_config, dtype))
    return out_dir


PROG = "python -m minispec.tools.export"


def main(argv: list[str] | None = None) -> Path:
    """``python -m minispec.tools.export HEAD_DIR OUT_DIR [--dtype bfloat16] [--overwrite]``.

    Returns the output folder; a refused path or head ends the process with one line on stderr
    and exit status 2.
    """
    p = argparse.ArgumentParser(prog=PROG,
                                description="Export an EAGLE head (layout 'eagle1') to the "
                                            "checkpoint layout vLLM and SGLang load.")
    p.add_argument("head_dir", help="a head written by save_head / train_eagle")
    p.add_argument("out_dir", help="a new or empty folder (created if needed), where config.json "
                                   "and model.safetensors go")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="storage type of the weights (default float16)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow an OUT_DIR that already holds files: config.json and "
                        "model.safetensors in it are replaced, other files stay")
    args = p.parse_args(argv)
    try:
        out = export_head(args.head_dir, args.out_dir, dtype=getattr(torch, args.dtype),
                          overwrite=args.overwrite)
    except (ValueError, OSError) as err:      # OSError: FileNotFoundError for a missing head
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"exported to {out}: {', '.join(OUTPUT_FILES)}")
    return out


if __name__ == "__main__":
    main()
