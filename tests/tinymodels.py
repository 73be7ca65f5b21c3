"""Tiny random Llama models for the decoding, drafter, engine and adaptive-k tests.

Weights are drawn with a large scale so logits are peaked: greedy parity between batched and
unbatched runs then never hinges on float near-ties (see DESIGN.md, pitfalls).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

import minispec as ms
from minispec.models.llama import Llama, ModelConfig

VOCAB = 48


def tiny_llama(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, seed=0, scale=0.35,
               max_pos=96, eos=None) -> Llama:
    """A random fp32 Llama (GQA, Llama-3 RoPE, tied embeddings) with peaked logits."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                         tie_word_embeddings=True, eos_token_id=eos, rope_scaling={
                             "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    model = Llama(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1:
                param.normal_(0, scale)
    return model


def noisy_copy(model: Llama, noise: float, seed: int | None = 1) -> Llama:
    """A draft: ``model`` with Gaussian noise of scale ``noise`` added to every parameter (many
    drafts accepted). ``seed=None`` draws from torch's global generator as it stands."""
    if seed is not None:
        torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn_like(param) * noise)
    return draft


def exact_two_token_law(target, prompt, params):
    """p(x1) p(x2 | x1) of the adjusted target, by direct forwards without any cache: ``(V*V,)``."""
    def next_probs(ids):
        logits = target(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1]
        return ms.probs_from_logits(logits, params)

    with torch.inference_mode():
        first = next_probs(prompt)
        second = torch.stack([next_probs(prompt + [x]) for x in range(target.config.vocab_size)])
    return (first[:, None] * second).reshape(-1)


def hf_checkpoint(model: Llama) -> tuple[dict, dict]:
    """(config.json dict, Hugging Face-named weights) of ``model``: a checkpoint that loads."""
    config = {k: v for k, v in dataclasses.asdict(model.config).items() if v is not None}
    config |= {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    weights = {f"model.{name}": t.detach().clone() for name, t in model.state_dict().items()}
    return config, weights


def write_checkpoint(directory, config: dict, weights: dict, text: str | None = None):
    """Save ``config`` (or the raw ``text`` of config.json) and ``weights`` as a one-file Hugging
    Face checkpoint in ``directory``; returns the folder."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(text if text is not None else json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def load_refused(path, *words, **kwargs) -> str:
    """``minispec``'s loader refuses ``path`` with a ValueError whose message holds each of
    ``words``; returns the message."""
    from minispec.loading.loader import load

    with pytest.raises(ValueError) as info:
        load(path, **kwargs)
    message = str(info.value)
    assert all(word in message for word in words), message
    return message
