"""Tiny random Llama models the graders decode with: built in memory from a seed, no file read.

Random weights are enough to check rollback and greedy parity: what matters is that the logits
depend on every cached key (so a stale or missing entry shows) and that greedy decoding has no
near-ties (so parity never hinges on rounding); a large weight scale gives peaked logits.
"""

from __future__ import annotations

import torch

from minispec.models.llama import Llama, ModelConfig


def tiny_llama(vocab: int = 64, seed: int = 0, scale: float = 0.35, max_positions: int = 128,
               hidden: int = 32, eos: int | list[int] | None = None) -> Llama:
    """A random fp32 Llama (2 layers, GQA, tied embeddings) with ``vocab`` tokens, in eval mode.

    Args:
        vocab: vocabulary size.
        seed: seeds the weights (a private generator: the global one is untouched).
        scale: standard deviation of every weight matrix (0.35: peaked logits; smaller: flatter).
        max_positions: longest sequence.
        hidden: hidden size.
        eos: end-of-sequence id(s) (``None``: the model never stops by itself).
    """
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         eos_token_id=eos)
    with torch.random.fork_rng(devices=[]):   # nn.Linear's init draws from the global generator
        model = Llama(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=g) * scale)
    return model
