"""Export an EAGLE head to the checkpoint layouts that vLLM (and, for EAGLE-1, SGLang) load.

The head's layout ([`EagleHead`][minispec.extra_drafters.eagle_head.EagleHead]) picks the
checkpoint:

* ``"eagle1"``: EAGLE-1's Llama checkpoint of one decoder layer plus ``fc``, which both engines
  read (``llama_config``, ``exported_tensors``); the embedding and the LM head are the target's,
  shared at load time, and both engines draft over the target's full vocabulary, so a head with
  a reduced one is refused;
* ``"eagle3"``: EAGLE-3 in the format of vLLM's ``speculators`` library, which vLLM loads
  directly (``speculators_config``, ``speculators_tensors``): ``fc`` on the target's three
  layers, a first layer whose attention reads ``[embedding ; fused feature]``, the head's own
  final norm and LM head over the draft vocabulary, and ``d2t``/``t2d`` mapping its ids to the
  target's. The embedding is the verifier's, named in ``config.json``.

Positions: the engines number the pair ``(f_{t-1}, x_t)`` their way, minispec by the pair index
``t - 1``. RoPE sees only differences of positions, so the head computes the same either way
(the export tests rebuild the engines' forward from the files and check it).

The shipped head's ``"minispec"`` layout (a bias, the input norm, the target's final norm and a
reduced vocabulary) is computed by neither engine, so it is refused rather than exported into a
head that drafts something else. Train one for serving with ``python -m
minispec.tools.train_eagle --layout eagle1`` (or ``eagle3``) and export it with ``python -m
minispec.tools.export HEAD_DIR OUT_DIR [--overwrite] [--verifier ID]`` (an ``OUT_DIR`` that holds
files needs ``--overwrite``: ``check_out_dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from minispec.extra_drafters.eagle_head import read_head

__all__ = ["LLAMA_FIELDS", "OUTPUT_FILES", "VERIFIER", "check_out_dir", "export_head", "main",
           "speculators_config", "speculators_tensors"]

#: The target's config fields a Llama ``config.json`` carries over unchanged.
LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
                "bos_token_id", "eos_token_id")

#: The files an export writes into its output folder.
OUTPUT_FILES = ("config.json", "model.safetensors")


def llama_config(target_config: dict, dtype: torch.dtype) -> dict:
    """An ``"eagle1"`` head's ``config.json``: a transformers ``LlamaConfig`` with
    ``architectures = ["LlamaForCausalLM"]`` and ``num_hidden_layers = 1``, every other field the
    target's (vLLM renames the architecture to ``EagleLlamaForCausalLM`` itself, SGLang to
    ``LlamaForCausalLMEagle``). Also the ``transformer_layer_config`` of an ``"eagle3"`` export."""
    config = {field: target_config[field] for field in LLAMA_FIELDS}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config,
            "num_hidden_layers": 1, "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch.")}


def exported_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """minispec's names (``fc.*``, ``layer.*``, ``vocab``) renamed to EAGLE-1's: ``fc.weight``
    (D, 2D) applied to ``[embed(x_t) ; f_{t-1}]`` (embedding first), ``fc.bias`` (vLLM's ``fc``
    has no bias and skips it; SGLang's has one and loads it, so it is written as zeros), and
    ``layers.0.*`` with the usual Llama names, **without** ``layers.0.input_layernorm`` (both
    engines drop that norm in the first layer, as EAGLE-1 did). Nothing else: the layer's output
    goes to the target's LM head without a final norm."""
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


#: The verifier an EAGLE-3 export names by default (``--verifier``): the shipped target.
VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"

#: Drafts per round an EAGLE-3 export proposes by default (vLLM's ``num_speculative_tokens``).
SPECULATIVE_TOKENS = 3


def speculators_config(saved: dict, dtype: torch.dtype, verifier: str = VERIFIER) -> dict:
    """The ``config.json`` of an ``"eagle3"`` head in the speculators format, as speculators'
    ``Eagle3SpeculatorConfig`` writes it and vLLM's ``SpeculatorsConfig`` reads it.

    No ``model_type``: vLLM recognises the format by ``speculators_config``.
    ``speculators_model_type = "eagle3"``, ``architectures = ["Eagle3Speculator"]``;
    ``transformer_layer_config``: the one layer's Llama config (``llama_config``, untied);
    ``draft_vocab_size``: ``V'``; ``eagle_aux_hidden_state_layer_ids``: the head's
    ``aux_layers``, where id ``i`` is the residual stream entering the target's layer ``i``
    (Hugging Face's ``hidden_states[i]``), as vLLM's Llama captures it for id ``i``;
    ``norm_before_residual = false``, written out because vLLM reads a missing one as true
    (minispec's residual is the fused feature before ``hidden_norm``); ``norm_before_fc``,
    ``fc_norm``, ``norm_output`` false; ``speculators_config``: the algorithm, a greedy proposal
    of ``SPECULATIVE_TOKENS`` drafts (vLLM's default ``num_speculative_tokens``) and the
    verifier's ``name_or_path``, the model whose embedding the head reads and that vLLM serves
    with it (``vllm serve OUT_DIR`` reads it from here)."""
    layer = llama_config(saved["target_config"], dtype) | {"tie_word_embeddings": False}
    proposal = {"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS,
                "verifier_accept_k": 1, "accept_tolerance": 0.0}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": saved["draft_vocab_size"],
            "eagle_aux_hidden_state_layer_ids": list(saved["aux_layers"]),
            "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False, "embed_requires_grad": False,
            "torch_dtype": layer["torch_dtype"],
            "speculators_config": {
                "algorithm": "eagle3", "proposal_methods": [proposal],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}


def speculators_tensors(tensors: dict[str, torch.Tensor], vocab_size: int
                        ) -> dict[str, torch.Tensor]:
    """An ``"eagle3"`` head's tensors (minispec's names) under speculators' names.

    ``fc.weight`` (D, 3D) on the three layers concatenated, no bias; ``layers.0.*`` with Llama's
    names, where ``self_attn.{q,k,v}_proj`` read 2D (``[input_layernorm(embed) ;
    hidden_norm(g)]``) and ``layers.0.hidden_norm.weight`` is the extra norm; ``norm.weight``
    (the head's own final norm); ``lm_head.weight`` (V', D); and, when ``V'`` is smaller than the
    target's ``vocab_size``, ``d2t`` (int64, (V',): draft id ``i`` is target id ``i + d2t[i]``)
    and ``t2d`` (bool, (V,): the target ids in ``V'``). No embedding: vLLM shares the verifier's
    when the file has none."""
    out = {name: tensors[name] for name in ("fc.weight", "norm.weight", "lm_head.weight")}
    out |= {"layers.0." + name.removeprefix("layer."): t for name, t in tensors.items()
            if name.startswith("layer.")}
    vocab = tensors["vocab"].long()                                                  # (V',)
    if len(vocab) < vocab_size:
        out["d2t"] = vocab - torch.arange(len(vocab))                # target id = i + d2t[i]
        out["t2d"] = torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, vocab, True)
    return out


def _read(head_dir: str | Path, dtype: torch.dtype, verifier: str
          ) -> tuple[dict, dict[str, torch.Tensor]]:
    """The ``config.json`` and the tensors to write for the head in ``head_dir``, refusing a head
    that neither engine computes.

    Raises:
        FileNotFoundError: ``head_dir`` holds no head.
        ValueError: its files are unreadable, or the head is one neither engine computes.
    """
    from safetensors import SafetensorError

    try:
        saved, tensors = read_head(head_dir)
        layout, draft_vocab = saved.get("layout", "minispec"), saved["draft_vocab_size"]
        vocab = saved["target_config"]["vocab_size"]
        if layout == "eagle3":
            config = speculators_config(saved, dtype, verifier)
            tensors = speculators_tensors(tensors, vocab)
        else:
            config, tensors = llama_config(saved["target_config"], dtype), exported_tensors(tensors)
    except (SafetensorError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as err:
        raise ValueError(f"head_dir {head_dir}: not a readable EAGLE head "
                         f"({type(err).__name__}: {err})") from err
    if layout not in ("eagle1", "eagle3"):
        raise ValueError(f"the head in {head_dir} has the {layout!r} layout (fc bias, input norm, "
                         "final norm), which vLLM and SGLang do not compute; train one with "
                         "--layout eagle1 or --layout eagle3")
    if layout == "eagle3" and len(set(saved["aux_layers"])) != 3:
        raise ValueError(f"the head in {head_dir} fuses the target's layers "
                         f"{tuple(saved['aux_layers'])}; vLLM captures each layer once, so it "
                         "serves three distinct ones (train with --aux-layers I J K)")
    if layout == "eagle1" and draft_vocab != vocab:
        raise ValueError(f"the head in {head_dir} drafts over {draft_vocab} of {vocab} tokens; "
                         "vLLM's and SGLang's EAGLE-1 heads draft over the target's full LM head")
    return config, tensors


def export_head(head_dir: str | Path, out_dir: str | Path, *, dtype: torch.dtype = torch.float16,
                overwrite: bool = False, verifier: str = VERIFIER) -> Path:
    """Write the head saved in ``head_dir`` as a checkpoint vLLM loads, in ``out_dir``: an
    ``"eagle1"`` head as EAGLE-1's Llama checkpoint (SGLang loads it too), an ``"eagle3"`` head
    in the speculators format.

    Args:
        head_dir: a directory written by
            [`save_head`][minispec.extra_drafters.eagle_head.save_head] (``head.safetensors`` and
            ``eagle_config.json``).
        out_dir: a new or empty folder (created if needed, with its parents); receives
            ``config.json`` and ``model.safetensors``.
        dtype: storage type of the float weights.
        overwrite: allow an ``out_dir`` that already holds files, replacing the two above.
        verifier: an ``"eagle3"`` head's verifier, as ``speculators_config`` names it (the
            target's Hugging Face id or path).

    Raises:
        FileNotFoundError: ``head_dir`` holds no head.
        ValueError: ``out_dir`` is refused (see
            [`check_out_dir`][minispec.tools.export.check_out_dir]) or cannot be written; the
            head's files are unreadable, or it is in the ``"minispec"`` layout, or it is an
            ``"eagle1"`` head that drafts over a reduced vocabulary (both engines draft EAGLE-1
            heads over the target's full LM head), or an ``"eagle3"`` head that names one
            target layer twice (vLLM captures each layer once).
    """
    out_dir = check_out_dir(out_dir, overwrite)
    config, tensors = _read(head_dir, dtype, verifier)
    tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    _write(out_dir, {name: t.contiguous() for name, t in tensors.items()}, config)
    return out_dir


PROG = "python -m minispec.tools.export"


def main(argv: list[str] | None = None) -> Path:
    """``python -m minispec.tools.export HEAD_DIR OUT_DIR [--dtype bfloat16] [--overwrite]
    [--verifier ID]``: the head's layout picks the checkpoint (``"eagle1"``: EAGLE-1's Llama
    checkpoint; ``"eagle3"``: the speculators format).

    Returns the output folder; a refused path or head ends the process with one line on stderr
    and exit status 2.
    """
    p = argparse.ArgumentParser(prog=PROG,
                                description="Export an EAGLE head to the checkpoint vLLM "
                                            "loads: layout 'eagle1' as EAGLE-1's Llama "
                                            "checkpoint (SGLang loads it too), layout 'eagle3' "
                                            "in the speculators format.")
    p.add_argument("head_dir", help="a head written by save_head / train_eagle")
    p.add_argument("out_dir", help="a new or empty folder (created if needed), where config.json "
                                   "and model.safetensors go")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="storage type of the weights (default float16)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow an OUT_DIR that already holds files: config.json and "
                        "model.safetensors in it are replaced, other files stay")
    p.add_argument("--verifier", default=VERIFIER,
                   help="an eagle3 head's verifier (the target's Hugging Face id or path), "
                        "named in config.json's speculators_config")
    args = p.parse_args(argv)
    try:
        out = export_head(args.head_dir, args.out_dir, dtype=getattr(torch, args.dtype),
                          overwrite=args.overwrite, verifier=args.verifier)
    except (ValueError, OSError) as err:      # OSError: FileNotFoundError for a missing head
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"exported to {out}: {', '.join(OUTPUT_FILES)}")
    return out


if __name__ == "__main__":
    main()
