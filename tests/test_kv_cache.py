"""KV caches: pure-Python bookkeeping, then a conformance suite every cache must pass.

To put a new cache (e.g. the paged one) through the same suite, add its factory to
``CACHE_FACTORIES``: a callable ``(model, num_slots, max_seq_len) -> KVCache``.
"""

from __future__ import annotations

import pytest
import torch

from minispec.models.kv_cache import ContiguousKVCache, KVCache, SequenceTable
from minispec.models.llama import Llama
from minispec.models.paged_cache import PagedKVCache

CACHE_FACTORIES = {
    "contiguous": lambda model, num_slots, max_seq_len: ContiguousKVCache.for_model(
        model, num_slots=num_slots, max_seq_len=max_seq_len
    ),
    "paged": lambda model, n, s: PagedKVCache.for_model(model, n, s, block_size=4),
}


@pytest.fixture(params=list(CACHE_FACTORIES))
def make_cache(request):
    """A cache factory ``(model, num_slots=2, max_seq_len=64) -> KVCache``."""
    factory = CACHE_FACTORIES[request.param]
    return lambda model, num_slots=2, max_seq_len=64: factory(model, num_slots, max_seq_len)


def ids_for(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (n,), generator=g).tolist()


def step(model: Llama, cache: KVCache, slot: int, ids: list[int], start: int) -> torch.Tensor:
    """Feed ``ids`` at positions start.. into ``slot``; return their logits (T, V)."""
    with torch.no_grad():
        pos = torch.arange(start, start + len(ids))[None]
        return model(torch.tensor([ids]), pos, cache, [slot])[0]


# -------------------------------------------------------------------- bookkeeping (no tensors)


def test_table_allocate_free_and_reuse():
    table = SequenceTable(num_slots=3, max_seq_len=8)
    assert [table.allocate() for _ in range(3)] == [0, 1, 2]
    assert table.num_free == 0
    with pytest.raises(RuntimeError, match="in use"):
        table.allocate()
    table.free(1)
    assert table.lengths == {0: 0, 2: 0}
    assert table.allocate() == 1  # the lowest free slot is reused
    with pytest.raises(ValueError, match="not allocated"):
        table.free(7)


def test_table_write_plans_and_truncation():
    table = SequenceTable(num_slots=1, max_seq_len=8)
    slot = table.allocate()
    assert table.plan_write(slot, [0, 1, 2, -1]) == 3
    table.set_length(slot, 3)
    assert table.plan_write(slot, [-1, -1]) == 3  # padding only: unchanged
    assert table.plan_write(slot, [3, 4]) == 5
    assert table.plan_write(slot, [1, 2]) == 3  # rewriting position 1 forgets what followed
    with pytest.raises(ValueError, match="gap"):
        table.plan_write(slot, [4, 5])
    with pytest.raises(ValueError, match="consecutive"):
        table.plan_write(slot, [3, 5])
    table.set_length(slot, 7)
    assert table.plan_write(slot, [7]) == 8  # the last position is writable
    with pytest.raises(ValueError, match="max_seq_len"):
        table.plan_write(slot, [7, 8])
    table.set_length(slot, 5)
    table.truncate_to(slot, 2)
    assert table.length(slot) == 2
    table.truncate_to(slot, 2)  # no-op
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="truncate"):
            table.truncate_to(slot, bad)
    assert table.length(slot) == 2
    lengths = table.lengths
    lengths[slot] = 99  # a copy: the table is unchanged
    assert table.length(slot) == 2


# -------------------------------------------------------------------- conformance suite


def test_rollback_equals_never_seen(model, make_cache):
    """Prefill, accept 1 token, write 3 rejected ones, truncate: the next logits are bit-identical
    to those of a cache that never saw the rejected tokens."""
    prompt, accepted, rejected, nxt = ids_for(12, 1), [5], [7, 9, 11], [13, 2]
    P = len(prompt)

    clean = make_cache(model)
    s = clean.allocate()
    step(model, clean, s, prompt, 0)
    step(model, clean, s, accepted, P)
    expected = step(model, clean, s, nxt, P + 1)

    rolled = make_cache(model)
    r = rolled.allocate()
    step(model, rolled, r, prompt, 0)
    step(model, rolled, r, accepted, P)
    step(model, rolled, r, rejected, P + 1)
    assert rolled.length(r) == P + 4
    rolled.truncate_to(r, P + 1)
    assert rolled.length(r) == P + 1
    assert torch.equal(step(model, rolled, r, nxt, P + 1), expected)


def test_rollback_of_a_verify_block(model, make_cache):
    """The speculative shape: verify [last, d1, d2, d3] in one forward, accept 2 drafts, truncate,
    continue. Logits match a cache that was fed only the accepted tokens (up to GEMM rounding)."""
    prompt, block, nxt = ids_for(10, 2), [4, 8, 15, 16], [23]
    P = len(prompt)

    rolled = make_cache(model)
    r = rolled.allocate()
    step(model, rolled, r, prompt, 0)
    block_logits = step(model, rolled, r, block, P)
    rolled.truncate_to(r, P + 3)  # keep last, d1, d2
    got = step(model, rolled, r, nxt, P + 3)

    clean = make_cache(model)
    s = clean.allocate()
    step(model, clean, s, prompt, 0)
    clean_block = step(model, clean, s, block[:3], P)
    expected = step(model, clean, s, nxt, P + 3)
    torch.testing.assert_close(block_logits[:3], clean_block, rtol=0, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_truncate_into_the_prompt_and_regrow(model, make_cache):
    cache = make_cache(model)
    s = cache.allocate()
    head, tail = ids_for(6, 3), ids_for(5, 4)
    step(model, cache, s, head, 0)
    step(model, cache, s, tail, 6)
    cache.truncate_to(s, 6)
    got = step(model, cache, s, [1, 2], 6)

    clean = make_cache(model)
    c = clean.allocate()
    step(model, clean, c, head, 0)
    assert torch.equal(got, step(model, clean, c, [1, 2], 6))


def test_truncate_to_zero_is_an_empty_sequence(model, make_cache):
    cache = make_cache(model)
    s = cache.allocate()
    step(model, cache, s, ids_for(9, 5), 0)
    cache.truncate_to(s, 0)
    fresh = make_cache(model)
    f = fresh.allocate()
    prompt = ids_for(4, 6)
    assert torch.equal(step(model, cache, s, prompt, 0), step(model, fresh, f, prompt, 0))


def test_slot_isolation(model, make_cache):
    """Writing, truncating and freeing other slots never changes what a slot sees."""
    cache = make_cache(model, num_slots=3)
    a, b = cache.allocate(), cache.allocate()
    step(model, cache, a, ids_for(8, 7), 0)
    before = step(model, cache, a, [3], 8)
    cache.truncate_to(a, 8)

    step(model, cache, b, ids_for(20, 8), 0)
    cache.truncate_to(b, 5)
    step(model, cache, b, ids_for(7, 9), 5)
    c = cache.allocate()
    step(model, cache, c, ids_for(30, 10), 0)
    cache.free(c)
    assert cache.length(a) == 8 and cache.length(b) == 12
    assert torch.equal(step(model, cache, a, [3], 8), before)


def test_freed_slot_comes_back_empty(model, make_cache):
    cache = make_cache(model, num_slots=1)
    s = cache.allocate()
    step(model, cache, s, ids_for(15, 11), 0)
    cache.free(s)
    s2 = cache.allocate()
    assert cache.length(s2) == 0
    fresh = make_cache(model, num_slots=1)
    f = fresh.allocate()
    prompt = ids_for(5, 12)
    assert torch.equal(step(model, cache, s2, prompt, 0), step(model, fresh, f, prompt, 0))


def test_batched_rows_equal_single_rows(model, make_cache):
    """A batch with ragged rows (padding -1) gives each row the logits it gets alone."""
    batched, single = make_cache(model, num_slots=2), make_cache(model, num_slots=2)
    slots = [batched.allocate(), batched.allocate()]
    alone = [single.allocate(), single.allocate()]
    prompts = [ids_for(5, 13), ids_for(9, 14)]
    with torch.no_grad():
        ids = torch.zeros(2, 9, dtype=torch.long)
        pos = torch.full((2, 9), -1)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p)
            pos[b, : len(p)] = torch.arange(len(p))
        out = model(ids, pos, batched, slots)
    for b, p in enumerate(prompts):
        ref = step(model, single, alone[b], p, 0)
        torch.testing.assert_close(out[b, : len(p)], ref, rtol=0, atol=1e-5)
    assert batched.lengths == {slots[0]: 5, slots[1]: 9}


def test_lengths_advance_once_per_forward(model, make_cache):
    cache = make_cache(model)
    a, b = cache.allocate(), cache.allocate()
    with torch.no_grad():
        ids = torch.zeros(2, 4, dtype=torch.long)
        pos = torch.tensor([[0, 1, 2, 3], [-1, -1, -1, -1]])
        model(ids, pos, cache, [a, b])
    assert cache.lengths == {a: 4, b: 0}  # not 4 * num_layers; an all-padding row stays empty
    plan = cache.prepare([a], torch.tensor([[4, 5]]))
    assert plan.new_lengths == [6] and cache.length(a) == 4  # prepare alone changes nothing
    assert plan.key_positions.shape[0] == 1 and plan.key_positions.shape[1] >= 6
    assert plan.key_positions[0, :6].tolist() == [0, 1, 2, 3, 4, 5]
    assert (plan.key_positions[0, 6:] == -1).all()


def test_write_errors_leave_the_cache_unchanged(model, make_cache):
    cache = make_cache(model, num_slots=2, max_seq_len=16)
    a = cache.allocate()
    step(model, cache, a, ids_for(10, 15), 0)
    bad_writes = [
        ([a], [[11]], "gap"),  # position 10 is next
        ([a], [[10, 11, 12, 13, 14, 15, 16]], "max_seq_len"),
        ([1], [[0]], "not allocated"),
        ([a, a], [[10], [11]], "twice"),
        ([a], [[10], [11]], "slots for a batch"),
    ]
    for slots, positions, message in bad_writes:
        pos = torch.tensor(positions)
        with pytest.raises(ValueError, match=message), torch.no_grad():
            model(torch.zeros_like(pos), pos, cache, slots)
        assert cache.lengths == {a: 10}
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate_to(a, 11)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate_to(a, -1)
    with pytest.raises(ValueError, match="slots"), torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), cache)
    cache.allocate()
    with pytest.raises(RuntimeError, match="in use"):
        cache.allocate()


def test_fill_to_max_seq_len(model, make_cache):
    cache = make_cache(model, num_slots=1, max_seq_len=16)
    s = cache.allocate()
    assert cache.max_seq_len == 16
    step(model, cache, s, ids_for(15, 16), 0)
    step(model, cache, s, [1], 15)  # the last position is writable
    assert cache.length(s) == 16
    with pytest.raises(ValueError, match="max_seq_len"):
        step(model, cache, s, [1], 16)


# -------------------------------------------------------------------- contiguous specifics


def test_contiguous_shapes_and_for_model(model):
    cache = ContiguousKVCache.for_model(model, num_slots=3, max_seq_len=40)
    config = model.config
    assert len(cache.k) == len(cache.v) == config.num_hidden_layers == cache.num_layers
    assert cache.k[0].shape == (3 + 1, 40, config.num_key_value_heads, config.head_dim)
    assert cache.k[0].dtype == model.dtype and cache.k[0].device == model.device
    assert ContiguousKVCache.for_model(model).max_seq_len == config.max_position_embeddings
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ContiguousKVCache.for_model(model, max_seq_len=config.max_position_embeddings + 1)


def test_contiguous_attends_over_the_longest_sequence_only(model):
    cache = ContiguousKVCache.for_model(model, num_slots=3, max_seq_len=100)
    a, b = cache.allocate(), cache.allocate()
    step(model, cache, a, ids_for(7, 17), 0)
    step(model, cache, b, ids_for(3, 18), 0)
    plan = cache.prepare([b, a], torch.tensor([[3, 4], [7, -1]]))
    assert plan.key_positions.tolist() == [
        [0, 1, 2, 3, 4, -1, -1, -1],
        [0, 1, 2, 3, 4, 5, 6, 7],
    ]
    k = torch.randn(2, 2, model.config.num_key_value_heads, model.config.head_dim)
    keys, values = cache.update(0, plan, k, k)
    assert keys.shape == (2, 8, *k.shape[2:])
    assert torch.equal(keys[0, 3:5], k[0]) and torch.equal(keys[1, 7], k[1, 0])
