"""minispec.models.llama against transformers.LlamaForCausalLM: same logits, same greedy tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from minispec.loading.loader import config_from_hf
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama, ModelConfig, attention_mask, rope_inv_freq

ATOL = 1e-4


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """Reference logits (T, V) of one unpadded sequence."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def random_ids(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def pad_batch(rows: list[list[int]], starts: list[int], left: bool = False):
    """Pad rows of ids to one (B, T) batch; positions count from ``starts``, -1 on padding."""
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    pos = torch.full((len(rows), T), -1, dtype=torch.long)
    for b, (row, start) in enumerate(zip(rows, starts, strict=True)):
        cols = slice(T - len(row), T) if left else slice(0, len(row))
        ids[b, cols] = torch.tensor(row, dtype=torch.long)
        pos[b, cols] = torch.arange(start, start + len(row))
    return ids, pos


# ------------------------------------------------------------------------------------- config


def test_from_hf_config_reads_llama3_fields(tiny):
    config, hf_config = tiny.model.config, tiny.hf.config
    assert config.num_key_value_heads == hf_config.num_key_value_heads
    assert config.head_dim == hf_config.head_dim
    assert config.tie_word_embeddings == hf_config.tie_word_embeddings
    if tiny.name == "mqa-headdim-bias":
        assert config.eos_token_ids == (2, 3)
        assert config.head_dim == 24 and config.attention_bias and config.mlp_bias


def test_from_hf_config_transformers4_spelling():
    config = config_from_hf(
        {
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "eos_token_id": 7,
        }
    )
    assert config.rope_theta == 500000.0 and config.rope_scaling["rope_type"] == "llama3"
    assert config.num_key_value_heads == 2 and config.head_dim == 4
    assert config.eos_token_ids == (7,)


def test_unsupported_rope_type_and_activation():
    config = ModelConfig(8, 8, 16, 1, 2, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(NotImplementedError, match="llama3"):
        rope_inv_freq(config)
    with pytest.raises(ValueError, match="silu"):
        config_from_hf(
            dict(
                vocab_size=8,
                hidden_size=8,
                intermediate_size=8,
                num_hidden_layers=1,
                num_attention_heads=2,
                hidden_act="gelu",
            )
        )
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig(8, 12, 16, 1, num_attention_heads=3, num_key_value_heads=2)


def test_llama3_inv_freq_matches_transformers(tiny_gqa):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](tiny_gqa.hf.config, "cpu")
    torch.testing.assert_close(rope_inv_freq(tiny_gqa.model.config), hf_inv_freq, rtol=0, atol=0)


# ------------------------------------------------------------------------------------- logits


def test_logits_match_transformers_without_cache(tiny):
    V = tiny.model.config.vocab_size
    rows = [random_ids(V, 40, seed=1), random_ids(V, 40, seed=2)]
    ids = torch.tensor(rows)
    positions = torch.arange(40).expand(2, 40)
    with torch.no_grad():
        logits = tiny.model(ids, positions)
        reference = tiny.hf(ids).logits
    assert logits.shape == (2, 40, V) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference, rtol=0, atol=ATOL)


def test_logits_match_transformers_with_cache(tiny):
    """Prefill, then incremental chunks of 1, 3 and 5 tokens, equal the one-shot reference."""
    V = tiny.model.config.vocab_size
    ids = random_ids(V, 40, seed=3)
    reference = hf_logits(tiny.hf, ids)
    cache = ContiguousKVCache.for_model(tiny.model, num_slots=2, max_seq_len=64)
    cache.allocate()
    slot = cache.allocate()  # slot 1: not the first, to exercise the slot offset
    chunks, start, pieces = [31, 1, 3, 5], 0, []
    with torch.no_grad():
        for n in chunks:
            x = torch.tensor([ids[start : start + n]])
            pos = torch.arange(start, start + n)[None]
            pieces.append(tiny.model(x, pos, cache, [slot])[0])
            start += n
            assert cache.length(slot) == start
    torch.testing.assert_close(torch.cat(pieces), reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
def test_padded_batch_without_cache(tiny, left):
    V = tiny.model.config.vocab_size
    rows = [random_ids(V, n, seed=10 + n) for n in (7, 19, 12)]
    ids, pos = pad_batch(rows, [0, 0, 0], left=left)
    with torch.no_grad():
        logits = tiny.model(ids, pos)
    assert torch.isfinite(logits).all()  # padding rows are garbage but finite
    for b, row in enumerate(rows):
        valid = pos[b] >= 0
        torch.testing.assert_close(logits[b, valid], hf_logits(tiny.hf, row), rtol=0, atol=ATOL)


def test_padded_batch_with_cache_prefill_then_ragged_steps(tiny):
    """Rows of different lengths prefill together, then add different numbers of tokens per step
    (as a batched verify does); each row equals its own unbatched reference."""
    V = tiny.model.config.vocab_size
    full = [random_ids(V, 30, seed=20 + b) for b in range(3)]
    prompt_lens = [5, 17, 11]
    steps = [[3, 1, 0], [1, 5, 2], [4, 4, 4]]  # new tokens per row per step (0 = padding only)
    cache = ContiguousKVCache.for_model(tiny.model, num_slots=4, max_seq_len=48)
    slots = [cache.allocate() for _ in range(4)][1:]  # slots 1, 2, 3
    slots = [slots[2], slots[0], slots[1]]  # not in order: reads go through an index
    got: list[list[torch.Tensor]] = [[] for _ in full]
    done = [0, 0, 0]
    with torch.no_grad():
        for counts in [prompt_lens, *steps]:
            rows = [full[b][done[b] : done[b] + n] for b, n in enumerate(counts)]
            ids, pos = pad_batch(rows, done)
            logits = tiny.model(ids, pos, cache, slots)
            for b, n in enumerate(counts):
                got[b].append(logits[b, :n])
                done[b] += n
            assert [cache.length(s) for s in slots] == done
    for b in range(3):
        reference = hf_logits(tiny.hf, full[b][: done[b]])
        torch.testing.assert_close(torch.cat(got[b]), reference, rtol=0, atol=ATOL)


def test_attention_mask_semantics():
    q = torch.tensor([[2, 3, -1]])
    k = torch.tensor([[0, 1, 2, 3, -1]])
    mask = attention_mask(q, k)[0, 0]
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],  # padding query: sees everything, stays finite
    ]


# ------------------------------------------------------------------------------------- greedy


def greedy_with_cache(model: Llama, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding: prefill the prompt, then one token per forward through the cache."""
    cache = ContiguousKVCache.for_model(model, num_slots=1, max_seq_len=len(prompt) + n)
    slot = cache.allocate()
    out: list[int] = []
    x, start = prompt, 0
    with torch.no_grad():
        for _ in range(n):
            pos = torch.arange(start, start + len(x), device=model.device)[None]
            logits = model(torch.tensor([x], device=model.device), pos, cache, [slot])
            token = int(logits[0, -1].argmax())
            out.append(token)
            start += len(x)
            x = [token]
    return out


def test_greedy_tokens_equal_transformers_generate(tiny, monkeypatch):
    prompt = random_ids(tiny.model.config.vocab_size, 8, seed=5)
    # no early stop at EOS: the loop below always makes 64 tokens
    monkeypatch.setattr(tiny.hf.generation_config, "eos_token_id", None)
    config = GenerationConfig(max_new_tokens=64, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = tiny.hf.generate(torch.tensor([prompt]), generation_config=config)[0, 8:]
    ours = torch.tensor(greedy_with_cache(tiny.model, prompt, 64))
    assert torch.equal(ours, reference)


# ------------------------------------------------------------------------------------- dtypes


def test_bf16_forward_close_to_fp32(tiny_gqa):
    model32 = tiny_gqa.model
    model16 = Llama(model32.config)
    model16.load_state_dict(model32.state_dict())
    model16 = model16.to(torch.bfloat16).eval()
    assert model16.dtype == torch.bfloat16
    ids = torch.tensor([random_ids(model32.config.vocab_size, 24, seed=7)])
    pos = torch.arange(24)[None]
    cache = ContiguousKVCache.for_model(model16, num_slots=1, max_seq_len=32)
    slot = cache.allocate()
    with torch.no_grad():
        reference = model32(ids, pos)
        plain = model16(ids, pos)
        cached = torch.cat([model16(ids[:, :20], pos[:, :20], cache, [slot]),
                            model16(ids[:, 20:], pos[:, 20:], cache, [slot])], dim=1)
    assert plain.dtype == torch.bfloat16 and cache.k[0].dtype == torch.bfloat16
    scale = reference.abs().max()
    for out in (plain, cached):
        assert (out.float() - reference).abs().max() < 0.05 * scale
        agree = (out.float().argmax(-1) == reference.argmax(-1)).float().mean()
        assert agree > 0.9


@pytest.mark.cuda
def test_cuda_matches_cpu(tiny_gqa):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from minispec.loading.loader import load

    model, _ = load(tiny_gqa.path, device="cuda", dtype=torch.float32)
    ids = random_ids(model.config.vocab_size, 16, seed=9)
    cache = ContiguousKVCache.for_model(model, num_slots=1, max_seq_len=32)
    slot = cache.allocate()
    with torch.no_grad():
        x = torch.tensor([ids], device="cuda")
        pos = torch.arange(16, device="cuda")[None]
        logits = torch.cat([model(x[:, :12], pos[:, :12], cache, [slot]),
                            model(x[:, 12:], pos[:, 12:], cache, [slot])], dim=1)
    torch.testing.assert_close(logits[0].cpu(), hf_logits(tiny_gqa.hf, ids), rtol=0, atol=1e-3)
    assert greedy_with_cache(model, ids[:4], 16) == greedy_with_cache(tiny_gqa.model, ids[:4], 16)
