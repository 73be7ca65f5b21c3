"""Load a Llama checkpoint in Hugging Face format into ``minispec.model.Llama``.

Three ways to name a model, tried in this order:

1. a shipped name (``"shakespeare-target"``, ``"shakespeare-draft"``), found by ``minispec.zoo.path``;
2. a local directory holding ``config.json`` and ``model.safetensors`` (or the shards listed in
   ``model.safetensors.index.json``), plus tokenizer files if any;
3. a Hugging Face hub id (``"meta-llama/Llama-3.2-1B"``) already in the local hub cache: nothing
   is downloaded.

Only safetensors are read; pickle checkpoints (``pytorch_model.bin``) can run code when loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from minispec.model import Llama, ModelConfig, rope_tables
from minispec.zoo import NAMES
from minispec.zoo import path as zoo_path

SUPPORTED = "Llama-architecture checkpoints (model_type 'llama', architectures ['LlamaForCausalLM'])"


def load(
    name_or_path: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[Llama, Any]:
    """Load a model and its tokenizer.

    Args:
        name_or_path: a shipped name, a checkpoint directory, or a hub id in the local cache.
        device: where to put the weights (default CPU).
        dtype: e.g. ``torch.bfloat16`` or ``"bfloat16"``. Default: float32 on CPU (fast and exact
            there), the checkpoint's own ``dtype``/``torch_dtype`` on other devices.
    Returns: (model in eval mode, ``transformers`` tokenizer or None when the checkpoint has none).
    """
    directory = resolve(name_or_path)
    config_dict = json.loads((directory / "config.json").read_text())
    check_architecture(config_dict, directory)
    config = ModelConfig.from_hf_config(config_dict)
    device = torch.device(device if device is not None else "cpu")
    dtype = _pick_dtype(dtype, config_dict, device)

    weights = read_safetensors(directory)
    state = hf_to_minispec(weights, config)
    with torch.device("meta"):  # build without allocating or initialising weights
        model = Llama(config)
    state = {name: t.to(device=device, dtype=dtype) for name, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    # the RoPE tables are not in the checkpoint: compute them for real on the target device
    cos, sin = rope_tables(config)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval(), load_tokenizer(directory)


def resolve(name_or_path: str | Path) -> Path:
    """Turn a shipped name, a directory or a cached hub id into a checkpoint directory."""
    name = str(name_or_path)
    if name in NAMES:
        return Path(zoo_path(name))  # raises FileNotFoundError, naming the missing files
    local = Path(name).expanduser()
    if local.exists():
        if local.is_file():
            raise ValueError(f"{local} is a file; pass the checkpoint directory instead")
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local} has no config.json: not a Hugging Face checkpoint")
        return local
    return _from_hub_cache(name)


def check_architecture(config: dict[str, Any], where: Path | str = "config.json") -> None:
    """Raise ValueError unless ``config`` describes a Llama causal LM."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    if model_type != "llama" or "LlamaForCausalLM" not in architectures:
        raise ValueError(
            f"{where}: model_type={model_type!r}, architectures={architectures} is not supported; "
            f"minispec loads {SUPPORTED}"
        )


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Read all weights of ``directory``: ``model.safetensors`` or the shards of its index."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            weights.update(load_file(directory / shard))
        return weights
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise ValueError(
            f"{directory} only has pickle weights (pytorch_model.bin); minispec reads safetensors "
            f"only, since unpickling can run arbitrary code. Convert once with transformers: "
            f"AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out, safe_serialization=True)"
        )
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor its index file")


def hf_to_minispec(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename Hugging Face weight names to ``Llama``'s: ``model.layers.0.mlp.up_proj.weight`` ->
    ``layers.0.mlp.up_proj.weight``; ``lm_head.weight`` is dropped for tied embeddings."""
    state = {}
    for name, tensor in weights.items():
        if name.endswith("rotary_emb.inv_freq"):  # older checkpoints store RoPE frequencies
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        state[name.removeprefix("model.")] = tensor
    return state


def load_tokenizer(directory: Path) -> Any:
    """``transformers.AutoTokenizer`` for ``directory``, or None when it has no tokenizer files."""
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((directory / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def _pick_dtype(
    dtype: torch.dtype | str | None, config: dict[str, Any], device: torch.device
) -> torch.dtype:
    if dtype is None:
        if device.type == "cpu":
            return torch.float32
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"not a floating-point torch dtype: {dtype!r}")
    return dtype


def _from_hub_cache(name: str) -> Path:
    """Find hub id ``name`` in the local Hugging Face cache, without touching the network."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception as error:  # not cached, or not a valid hub id at all
        raise FileNotFoundError(
            f"cannot find model {name!r}: it is not a shipped name "
            f"({', '.join(NAMES)}), not a local directory, and not in the "
            f"local Hugging Face cache (minispec never downloads). Download the checkpoint on a "
            f"machine with network access, e.g. `hf download {name} --local-dir DIR`, and pass "
            f"the local path DIR instead."
        ) from error
