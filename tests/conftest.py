"""Shared fixtures: tiny random Llama checkpoints saved in Hugging Face format.

Each tiny config is built with ``transformers.LlamaForCausalLM`` (the reference implementation),
saved with ``save_pretrained(safe_serialization=True)`` into a session temp dir, and loaded back
with ``minispec.load``. Weights use a large init scale so that logits are peaked: greedy parity
then does not hinge on float rounding between near-tied tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# The test models are tiny: one thread is faster than two (no synchronisation per op), and it keeps
# a loaded CI machine from oversubscribing its cores. Benchmarks set their own thread count.
torch.set_num_threads(1)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,  # small, so the test positions cross every band
}

#: name -> LlamaConfig kwargs. Together they cover GQA and MHA, Llama-3 RoPE scaling and plain RoPE,
#: tied and untied embeddings, an explicit head_dim != hidden / heads, biases, a list of EOS ids.
TINY_CONFIGS: dict[str, dict] = {
    "gqa-llama3-tied": dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling=LLAMA3_ROPE,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
    "mha-untied": dict(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        rope_theta=500.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
    "mqa-headdim-bias": dict(
        vocab_size=112,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=24,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling=LLAMA3_ROPE,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=[2, 3],
    ),
}


@dataclass
class TinyCheckpoint:
    """A tiny random checkpoint: its directory, the transformers reference model, and minispec's."""

    name: str
    path: Path
    hf: torch.nn.Module
    model: torch.nn.Module


def make_hf_model(name: str, seed: int = 0):
    """A random ``transformers.LlamaForCausalLM`` (fp32, eval mode) for ``TINY_CONFIGS[name]``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(initializer_range=0.25, **TINY_CONFIGS[name])
    return LlamaForCausalLM(config).eval()


def save_hf_model(hf, directory: Path, **kwargs) -> Path:
    """``save_pretrained`` in safetensors format into ``directory``; returns it."""
    hf.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory


@pytest.fixture(scope="session")
def hf_model_factory():
    """``make_hf_model(name, seed=0)``, for tests that need a fresh reference model."""
    return make_hf_model


@pytest.fixture(scope="session", params=list(TINY_CONFIGS))
def tiny(request, tmp_path_factory) -> TinyCheckpoint:
    """Each tiny config in turn: saved to disk and loaded by ``minispec.load`` (fp32, CPU)."""
    from minispec.loading.loader import load

    name = request.param
    hf = make_hf_model(name)
    path = save_hf_model(hf, tmp_path_factory.mktemp(name))
    model, _ = load(path)
    return TinyCheckpoint(name, path, hf, model)


@pytest.fixture(scope="session")
def tiny_gqa(tmp_path_factory) -> TinyCheckpoint:
    """The GQA / Llama-3 RoPE / tied-embedding checkpoint alone (for tests that need one model)."""
    from minispec.loading.loader import load

    hf = make_hf_model("gqa-llama3-tied")
    path = save_hf_model(hf, tmp_path_factory.mktemp("gqa-single"))
    model, _ = load(path)
    return TinyCheckpoint("gqa-llama3-tied", path, hf, model)


@pytest.fixture(scope="module")
def model():
    """A small random minispec Llama (GQA, Llama-3 RoPE, tied embeddings, vocab 64), fp32: the
    model of the cache tests."""
    from minispec.models.llama import Llama, ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    return Llama(config).eval()


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """``once_per_run(name, make) -> folder``: ``make(folder)`` run once per test run, whichever
    xdist workers ask (a file lock in a folder the run's workers share; see ``tests/once.py``)."""
    from once import once_per_run as once

    return lambda name, make: once(tmp_path_factory, name, make)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and the CPU is shared: don't spin a second one.
    A module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
