"""Every config.json value is checked where it enters (issue "Every input checked", item 2).

A tiny random Llama (``tinymodels``) is written into ``tmp_path`` as a Hugging Face checkpoint, its
``config.json`` damaged one value at a time: each load fails with one ValueError naming the field,
the value and what is allowed, before any table is computed or weight read.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tinymodels import VOCAB, hf_checkpoint, tiny_llama
from tinymodels import load_refused as refused
from tinymodels import write_checkpoint as write

from minispec.loading.loader import MAX_SIZE, build_config, load


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def good(model):
    """(config.json dict, Hugging Face-named weights) of a checkpoint that loads."""
    return hf_checkpoint(model)


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if the loader computes RoPE tables, builds the model or reads a weight."""
    def forbidden(*args, **kwargs):
        raise AssertionError("allocated or read before the config was checked")

    for step in ("rope_tables", "read_headers", "checked_meta_model", "read_weights_file"):
        monkeypatch.setattr(f"minispec.loading.loader.{step}", forbidden)


# ------------------------------------------------------------------- bounds that follow from memory


def test_rope_tables_too_large_are_refused_with_their_size(tmp_path, nothing_built):
    # a consistent 2 MB checkpoint (fp16) whose RoPE tables would take 2 TiB
    config = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=1, num_key_value_heads=1, head_dim=65536,
                  max_position_embeddings=2**22, tie_word_embeddings=True, model_type="llama")
    shapes = {"embed_tokens": (8, 8), "layers.0.self_attn.q_proj": (65536, 8),
              "layers.0.self_attn.k_proj": (65536, 8), "layers.0.self_attn.v_proj": (65536, 8),
              "layers.0.self_attn.o_proj": (8, 65536), "layers.0.mlp.gate_proj": (8, 8),
              "layers.0.mlp.up_proj": (8, 8), "layers.0.mlp.down_proj": (8, 8),
              "layers.0.input_layernorm": (8,), "layers.0.post_attention_layernorm": (8,),
              "norm": (8,)}
    weights = {f"model.{name}.weight": torch.zeros(shape, dtype=torch.float16)
               for name, shape in shapes.items()}
    refused(write(tmp_path, config, weights), "max_position_embeddings=4194304",
            "head_dim=65536", "2048 GiB", "at most 1 GiB")


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 10**30), ("hidden_size", 2**40), ("intermediate_size", 2**62),
    ("num_attention_heads", MAX_SIZE + 1), ("head_dim", 2**21), ("num_hidden_layers", 2**31),
])
def test_sizes_beyond_any_llama_are_refused(good, tmp_path, nothing_built, field, value):
    config, weights = good
    refused(write(tmp_path, config | {field: value}, weights), field, str(value),
            f"integer >= 1 and <= {MAX_SIZE}")


# ----------------------------------------------------------------------------- types and ranges


@pytest.mark.parametrize("field", ["tie_word_embeddings", "attention_bias", "mlp_bias"])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_booleans_must_be_json_booleans(good, tmp_path, field, value):
    config, weights = good
    refused(write(tmp_path, config | {field: value}, weights), field, repr(value),
            "true or false (a JSON boolean)")


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, 0, 1, "x", "1e-5", None, True])
def test_rms_norm_eps_must_be_a_small_positive_number(good, tmp_path, value):
    config, weights = good
    refused(write(tmp_path, config | {"rms_norm_eps": value}, weights), "config.json",
            "rms_norm_eps", repr(value), "a finite number > 0 and < 1")


@pytest.mark.parametrize("value", [math.nan, -math.inf, -1, 0, "x", 10**400])
def test_rope_theta_must_be_a_finite_positive_number(good, tmp_path, value):
    config, weights = good
    refused(write(tmp_path / "top", config | {"rope_theta": value}, weights), "rope_theta",
            repr(value), "a finite number > 0")
    inside = {"rope_type": "default", "rope_theta": value}          # transformers 5 spelling
    refused(write(tmp_path / "params", config | {"rope_parameters": inside}, weights),
            "rope_parameters", "rope_theta", repr(value))


@pytest.mark.parametrize("field", ["eos_token_id", "bos_token_id"])
@pytest.mark.parametrize("value", ["abc", 10**9, VOCAB, -1, 1.0, True, [1, VOCAB], ["1"]])
def test_token_ids_must_lie_in_the_vocabulary(good, tmp_path, field, value):
    config, weights = good
    refused(write(tmp_path, config | {field: value}, weights), field, repr(value),
            f"< vocab_size ({VOCAB})")


@pytest.mark.parametrize("eos", [None, 0, VOCAB - 1, [1, 2], []])
def test_valid_token_ids_load(good, tmp_path, eos):
    config, weights = good
    loaded, _ = load(write(tmp_path, config | {"eos_token_id": eos, "bos_token_id": 0}, weights))
    assert loaded.config.eos_token_id == eos


@pytest.mark.parametrize("field", ["max_position_embeddings", "rms_norm_eps", "hidden_act"])
def test_null_is_refused_where_it_means_nothing(good, tmp_path, field):
    config, weights = good
    refused(write(tmp_path, config | {field: None}, weights), field, "got None")


# ------------------------------------------------------------------------------------------ RoPE


@pytest.mark.parametrize("rope_type", ["linear", "llama3"])
@pytest.mark.parametrize("key, value", [
    ("factor", -1), ("factor", 0), ("factor", math.nan), ("factor", "2"),
    ("low_freq_factor", -1), ("high_freq_factor", math.inf),
    ("original_max_position_embeddings", 0), ("original_max_position_embeddings", 2.5),
])
def test_rope_scaling_values_are_checked(good, tmp_path, rope_type, key, value):
    config, weights = good
    scaling = config["rope_scaling"] | {"rope_type": rope_type, key: value}
    refused(write(tmp_path, config | {"rope_scaling": scaling}, weights), "rope_scaling", key,
            repr(value))


def test_an_unsupported_rope_type_is_named_with_the_supported_ones(good, tmp_path):
    config, weights = good
    for scaling in ({"rope_type": "yarn", "factor": 4.0}, {"type": "yarn", "factor": 4.0}):
        refused(write(tmp_path, config | {"rope_scaling": scaling}, weights), "rope_scaling",
                "rope_type", "'yarn'", "'default', 'linear', 'llama3'")
    refused(write(tmp_path, config | {"rope_scaling": {"rope_type": ["llama3"]}}, weights),
            "rope_type", "['llama3']")
    refused(write(tmp_path, config | {"rope_scaling": "linear"}, weights), "rope_scaling",
            "JSON object or null", "'linear'")
    refused(write(tmp_path, config | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                  weights), "rope_type 'llama3' needs", "no low_freq_factor")


def test_a_linear_rope_factor_still_loads(good, model, tmp_path):
    config, weights = good
    loaded, _ = load(write(tmp_path, config | {"rope_scaling": {"type": "linear", "factor": 2}},
                           weights))
    assert loaded.config.rope_scaling == {"rope_type": "linear", "factor": 2}


# --------------------------------------------------------------------- files, and trust of code


def test_a_deeply_nested_config_names_the_file(good, tmp_path):
    config, weights = good
    deep = "[" * 100_000 + "]" * 100_000
    path = write(tmp_path / "config", config, weights, text=deep)
    refused(path, str(path / "config.json"), "not valid JSON")
    path = write(tmp_path / "index", config, {"x": torch.zeros(1)})
    (path / "model.safetensors").rename(path / "w.safetensors")
    (path / "model.safetensors.index.json").write_text('{"weight_map": ' + deep + "}")
    refused(path, "model.safetensors.index.json")


def test_the_tokenizer_never_runs_remote_code(good, tmp_path, monkeypatch):
    import transformers

    calls = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *args, **kwargs: calls.append(kwargs) or "tokenizer")
    path = write(tmp_path, *good)
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    assert load(path)[1] == "tokenizer"
    assert calls == [{"trust_remote_code": False}]


@pytest.mark.parametrize("value", ["x", -1, 0, math.nan, math.inf, 10**400, None, True, [], {},
                                   [1], {"a": 1}, 2**70])
def test_no_value_anywhere_escapes_as_another_exception(good, tmp_path, value):
    """Any value in any key: the checkpoint loads, or one ValueError names the key (or the tensor
    that a valid but different value no longer matches)."""
    config, weights = good
    keys = [*config, "num_key_value_heads", "head_dim", "bos_token_id", "rope_parameters"]
    for i, key in enumerate(dict.fromkeys(keys)):
        try:
            load(write(tmp_path / str(i), config | {key: value}, weights))
        except ValueError as error:
            assert key in str(error) or "tensor" in str(error), (key, value, error)


def test_build_config_refuses_a_config_without_a_required_key():
    """Called on its own (``load`` reads the file first), ``build_config`` still names the missing
    field in a ValueError, never a KeyError."""
    with pytest.raises(ValueError, match="vocab_size must be an integer"):
        build_config({"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                      "num_attention_heads": 2})
