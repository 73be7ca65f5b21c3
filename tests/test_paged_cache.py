"""PagedKVCache: bit-identical to the contiguous cache, plus block accounting and pool exhaustion.

The conformance suite in ``test_kv_cache.py`` also runs on the paged cache; here are the paged
specifics. Exact equality holds because attention receives the same keys and values, in the same
order and shape (B, S, n_kv, hd), from either cache: only where they are stored differs.
"""

from __future__ import annotations

import math

import pytest
import torch

from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.paged_cache import PagedKVCache

V = 64


def ids_for(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g).tolist()


def batch_forward(model, cache, slots, rows: list[tuple[list[int], int]]) -> list[torch.Tensor]:
    """One forward; row b feeds ``ids`` at positions ``start..`` (right-padded with -1).

    Returns each row's logits for its real tokens, (T_b, V).
    """
    T = max(1, max(len(ids) for ids, _ in rows))
    input_ids = torch.zeros(len(rows), T, dtype=torch.long)
    positions = torch.full((len(rows), T), -1)
    for b, (ids, start) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        positions[b, : len(ids)] = torch.arange(start, start + len(ids))
    with torch.no_grad():
        logits = model(input_ids, positions, cache, slots)  # (B, T, V)
    return [logits[b, : len(ids)] for b, (ids, _) in enumerate(rows)]


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_equals_contiguous_through_speculative_rounds(model, block_size):
    """Batched prefill of ragged prompts, decode, then verify-and-truncate rounds with a different
    number of accepted drafts per row: every logit is bit-identical (torch.equal) across caches."""
    contiguous = ContiguousKVCache.for_model(model, num_slots=3, max_seq_len=64)
    paged = PagedKVCache.for_model(model, num_slots=3, max_seq_len=64, block_size=block_size)
    caches = (contiguous, paged)
    slots = [[c.allocate() for _ in range(3)] for c in caches]
    order = [2, 0, 1]  # batch rows in a non-identity slot order
    prompts = [ids_for(n, seed) for seed, n in enumerate((5, 11, 8))]
    lengths = [len(p) for p in prompts]

    def run(rows):
        outs = [
            batch_forward(model, c, [s[i] for i in order], rows)
            for c, s in zip(caches, slots, strict=True)
        ]
        for a, b in zip(*outs, strict=True):
            assert torch.equal(a, b)

    run([(prompts[i], 0) for i in order])  # prefill, padded
    run([(ids_for(1, 10 + i), lengths[i]) for i in order])  # one decode step each
    lengths = [n + 1 for n in lengths]
    g = torch.Generator().manual_seed(0)
    k = 4
    for r in range(4):
        # verify [last, d1..dk] at positions n..n+k, accept a random number a of the k drafts
        run([(ids_for(k + 1, 100 * r + i), lengths[i]) for i in order])
        for i in range(3):
            lengths[i] += 1 + int(torch.randint(0, k + 1, (1,), generator=g))  # last + a drafts
            for c, s in zip(caches, slots, strict=True):
                c.truncate_to(s[i], lengths[i])
    assert contiguous.lengths == paged.lengths
    for s in slots[1]:
        assert len(paged.block_table(s)) == math.ceil(paged.length(s) / block_size)


def test_pool_shapes_and_for_model(model):
    cache = PagedKVCache.for_model(model, num_slots=3, max_seq_len=40, block_size=8)
    config = model.config
    assert cache.num_blocks == 3 * 5  # default: every slot can be full at once
    assert len(cache.k) == len(cache.v) == config.num_hidden_layers == cache.num_layers
    assert cache.k[0].shape == (15 + 1, 8, config.num_key_value_heads, config.head_dim)
    assert cache.k[0].dtype == model.dtype and cache.block_size == 8
    assert PagedKVCache.for_model(model, block_size=32).num_blocks == 128 // 32
    with pytest.raises(ValueError, match="max_position_embeddings"):
        PagedKVCache.for_model(model, max_seq_len=config.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="positive"):
        PagedKVCache.for_model(model, block_size=0)


def test_blocks_are_taken_as_tokens_arrive(model):
    cache = PagedKVCache.for_model(model, num_slots=2, max_seq_len=64, block_size=4)
    a = cache.allocate()
    assert cache.block_table(a) == [] and cache.num_used_blocks == 0
    batch_forward(model, cache, [a], [(ids_for(5, 1), 0)])
    assert cache.block_table(a) == [0, 1] and cache.num_used_blocks == 2
    batch_forward(model, cache, [a], [(ids_for(3, 2), 5)])  # positions 5..7 fit in block 1
    assert cache.block_table(a) == [0, 1]
    batch_forward(model, cache, [a], [(ids_for(1, 3), 8)])
    assert cache.block_table(a) == [0, 1, 2] and cache.num_free_blocks == cache.num_blocks - 3


def test_truncation_frees_exactly_the_blocks_past_n(model):
    """Truncating to n keeps ceil(n / block_size) blocks (the partial last one included), frees
    the rest, and leaves the other sequences' blocks untouched."""
    bs = 4
    cache = PagedKVCache.for_model(model, num_slots=2, max_seq_len=64, block_size=bs)
    a, b = cache.allocate(), cache.allocate()
    batch_forward(model, cache, [a, b], [(ids_for(10, 4), 0), (ids_for(23, 5), 0)])
    other = cache.block_table(a)
    for n in (23, 21, 20, 17, 9, 1, 0):
        before = cache.block_table(b)
        used = cache.num_used_blocks
        cache.truncate_to(b, n)
        keep = math.ceil(n / bs)
        assert cache.block_table(b) == before[:keep]  # the partial block stays
        assert cache.num_used_blocks == used - (len(before) - keep)  # all others are freed
        assert cache.block_table(a) == other
        assert cache.num_free_blocks + cache.num_used_blocks == cache.num_blocks
    cache.free(a)
    cache.free(b)
    assert cache.num_free_blocks == cache.num_blocks  # nothing leaked


def test_pool_exhaustion_is_all_or_nothing(model):
    cache = PagedKVCache.for_model(model, num_slots=2, max_seq_len=64, block_size=4, num_blocks=5)
    a, b = cache.allocate(), cache.allocate()
    batch_forward(model, cache, [a], [(ids_for(12, 6), 0)])  # 3 blocks

    def snapshot():
        return cache.lengths, cache.block_table(a), cache.block_table(b), cache.num_free_blocks

    state = snapshot()
    # row a needs 1 more block (fits alone), row b needs 2: together 3 > 2 free
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        batch_forward(model, cache, [a, b], [(ids_for(1, 7), 12), (ids_for(6, 8), 0)])
    assert snapshot() == state
    assert not cache.can_allocate(1)  # no free slot
    cache.free(a)  # memory comes back: b now fits
    assert cache.can_allocate(20) and not cache.can_allocate(21)  # a free slot, 5 free blocks
    batch_forward(model, cache, [b], [(ids_for(20, 9), 0)])
    assert cache.num_used_blocks == 5


def test_grow_reserves_and_truncate_releases(model):
    """The engine's pattern: reserve k + 1 positions before a verify, roll back after."""
    paged = PagedKVCache.for_model(model, num_slots=1, max_seq_len=32, block_size=4, num_blocks=4)
    s = paged.allocate()
    batch_forward(model, paged, [s], [(ids_for(6, 10), 0)])
    assert paged.can_grow(s, 6 + 5) and not paged.can_grow(s, 17) and not paged.can_grow(s, 33)
    paged.grow(s, 6 + 5)  # 3 blocks now, though only 6 positions are written
    assert len(paged.block_table(s)) == 3 and paged.length(s) == 6
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        paged.grow(s, 17)
    with pytest.raises(ValueError, match="max_seq_len"):
        paged.grow(s, 33)
    paged.truncate_to(s, 6)  # nothing accepted: the reservation is given back
    assert len(paged.block_table(s)) == 2 and paged.num_free_blocks == 2
    with pytest.raises(ValueError, match="not allocated"):
        paged.can_grow(5, 1)


def test_base_class_capacity_defaults_on_the_contiguous_cache(model):
    cache = ContiguousKVCache.for_model(model, num_slots=2, max_seq_len=16)
    assert cache.block_size == 16 and cache.num_free_blocks == 2  # one block = one slot
    assert cache.can_allocate(16) and not cache.can_allocate(17)
    s = cache.allocate()
    assert cache.num_free_blocks == 1
    assert cache.can_grow(s, 16) and not cache.can_grow(s, 17)
    cache.grow(s, 16)  # only checks
    assert cache.length(s) == 0
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.grow(s, 17)
    with pytest.raises(ValueError, match="not allocated"):
        cache.grow(1, 1)
    cache.allocate()
    assert not cache.can_allocate(1)
