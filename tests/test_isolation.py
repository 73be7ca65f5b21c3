"""Isolation: what one request leaves in the KV memory never reaches another request.

A key column a row cannot see (past its length, a padding token, a padded block, another slot's
memory) contributes exactly zero to attention, even when it holds NaN. Model level: NaN written into
every cache entry the batch does not own changes no logit (``torch.equal``), for both caches, chain
and tree forwards, eager and packed, and the EAGLE head. Engine level: a request whose prompt makes
NaN keys and values fails alone; every healthy request, batched beside it or admitted later onto
its freed blocks or slot, decodes exactly as it does alone.
"""

import copy
import dataclasses

import pytest
import torch
from tinymodels import VOCAB, tiny_llama

import minispec as ms
from minispec.extra_drafters.eagle_head import EagleHead
from minispec.models.llama import Llama, TreeAttention
from minispec.speed import packed

NAN = float("nan")
CACHES = {
    "contiguous": lambda m: ms.ContiguousKVCache.for_model(m, num_slots=3, max_seq_len=32),
    "paged": lambda m: ms.PagedKVCache.for_model(m, num_slots=3, max_seq_len=32, block_size=4),
}
CHAIN_IDS = torch.tensor([[3, 5, 7], [2, 0, 0]])         # row 1: one token and two padding
CHAIN_POS = torch.tensor([[9, 10, 11], [4, -1, -1]])


@pytest.fixture(scope="module", params=["eager", "packed"])
def model(request):
    model = tiny_llama(seed=0)
    if request.param == "packed":
        if (reason := packed.unavailable_reason(model)) is not None:
            pytest.skip(reason)
        packed.make_fast(model)
    return model


def poison_unseen(cache, seen: dict[int, int]) -> None:
    """Write NaN into every entry of every layer except the first ``seen[slot]`` positions of each
    slot in ``seen``: other slots, freed blocks, stale tails and the padding block all hold NaN."""
    for store in cache.k + cache.v:
        flat = store.view(-1, *store.shape[2:])                        # (entries, n_kv, hd)
        keep = torch.zeros(flat.shape[0], dtype=torch.bool)
        for slot, n in seen.items():
            if isinstance(cache, ms.PagedKVCache):
                keep[cache.blocks.slot_mapping(slot, list(range(n)))] = True
            else:
                keep[slot * cache.max_seq_len:slot * cache.max_seq_len + n] = True
        flat[~keep] = NAN


def clean_and_poisoned(net, kind: str, run, forward) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward(cache, slots)`` on two rows of 9 and 4 cached positions (the first with a rolled
    back tail) beside a finished request whose memory was freed, then on a copy of that cache with
    NaN wherever the rows cannot see. ``run(ids, positions, cache, slots)`` prefills."""
    cache = CACHES[kind](net)
    gen = torch.Generator().manual_seed(0)
    other, *slots = cache.allocate(), cache.allocate(), cache.allocate()
    with torch.inference_mode():
        for slot, n in ((other, 14), (slots[0], 12), (slots[1], 4)):
            run(torch.randint(0, VOCAB, (1, n), generator=gen), torch.arange(n)[None], cache,
                [slot])
        cache.truncate_to(slots[0], 9)                  # rejected drafts: a stale own tail
        cache.free(other)                               # its contents stay where they were
        poisoned = copy.deepcopy(cache)
        poison_unseen(poisoned, {slots[0]: 9, slots[1]: 4})
        return forward(cache, slots), forward(poisoned, slots)


def assert_unchanged(clean: torch.Tensor, poisoned: torch.Tensor) -> None:
    assert torch.isfinite(poisoned).all()
    assert torch.equal(clean, poisoned)                 # padding rows too: they see zeros there


@pytest.mark.parametrize("kind", CACHES)
def test_nan_where_a_row_cannot_see_leaves_chain_logits_unchanged(model, kind):
    assert_unchanged(*clean_and_poisoned(
        model, kind, model, lambda cache, slots: model(CHAIN_IDS, CHAIN_POS, cache, slots)))


@pytest.mark.parametrize("kind", CACHES)
def test_nan_where_a_row_cannot_see_leaves_tree_logits_unchanged(model, kind):
    trees = [ms.DraftTree.from_drafts([[1, 2, 3], [1, 4]]), ms.DraftTree.from_drafts([[5], [6, 7]])]
    W, lengths = max(len(t) for t in trees), [9, 4]      # the root is the last cached token
    ids, pos = torch.zeros(2, W, dtype=torch.long), torch.full((2, W), -1)
    storage, masks = torch.full((2, W), -1), torch.zeros(2, W, W, dtype=torch.bool)
    for b, (tree, n) in enumerate(zip(trees, lengths, strict=True)):
        depth = [0] * len(tree)
        for i in range(1, len(tree)):
            depth[i] = depth[tree.parents[i]] + 1
        ids[b, :len(tree)] = torch.tensor([9] + tree.tokens[1:])
        pos[b, :len(tree)] = n + torch.tensor(depth)
        storage[b, :len(tree)] = torch.arange(n, n + len(tree))
        masks[b, :len(tree), :len(tree)] = tree.ancestor_mask()
    attn = TreeAttention(storage, torch.tensor(lengths), masks)
    assert_unchanged(*clean_and_poisoned(
        model, kind, model, lambda cache, slots: model(ids, pos, cache, slots, tree=attn)))


@pytest.mark.parametrize("kind", CACHES)
def test_the_eagle_heads_cache_is_isolated_too(kind):
    target = tiny_llama(seed=0)
    head = EagleHead(target.config).bind(target).eval()

    def run(ids, pos, cache, slots):        # the features: any deterministic (B, T, D) will do
        return head(ids, target.embed_tokens(ids), pos, cache, slots)[0]

    assert_unchanged(*clean_and_poisoned(
        head, kind, run, lambda cache, slots: run(CHAIN_IDS, CHAIN_POS, cache, slots)))


def with_nan_row(model: Llama, token: int) -> Llama:
    """``model`` untied (the LM head keeps the embedding's values) with embedding row ``token`` NaN:
    every logit stays finite, but a sequence that reads ``token`` gets NaN keys and values."""
    untied = Llama(dataclasses.replace(model.config, tie_word_embeddings=False)).eval()
    untied.load_state_dict(model.state_dict()
                           | {"lm_head.weight": model.output_weight.detach().clone()})
    with torch.no_grad():
        untied.embed_tokens.weight[token] = NAN
    return packed.make_fast(untied) if packed.is_fast(model) else untied


def test_nan_padding_tokens_do_not_reach_real_tokens_without_a_cache(model):
    bad = with_nan_row(model, 0)          # 0: the runner's padding id
    ids, pos = (torch.tensor([[3, 5, 7, 9], [2, 4, 0, 0]]),
                torch.tensor([[0, 1, 2, 3], [0, 1, -1, -1]]))
    with torch.inference_mode():
        nan_padding, finite_padding = bad(ids, pos), bad(ids.masked_fill(pos < 0, 6), pos)
    assert_unchanged(finite_padding[pos >= 0], nan_padding[pos >= 0])


# ---------------------------------------------------------------------------------- engine

NEW = 10


@pytest.fixture(scope="module")
def poisoned_target():
    """(target, bad token, healthy prompts, their single-request greedy outputs): the target's
    embedding row of the bad token, one that no healthy prompt or output reads, is NaN."""
    clean = tiny_llama(seed=3)
    gen = torch.Generator().manual_seed(0)
    lengths = [3, 30, 5, 18, 4, 25, 7, 12, 3, 20]  # short rows beside long ones: unseen columns
    prompts = [torch.randint(0, VOCAB - 8, (n,), generator=gen).tolist() for n in lengths]
    outputs = [ms.generate(clean, p, max_new_tokens=NEW).tokens for p in prompts]
    unused = set(range(VOCAB)) - {t for p, o in zip(prompts, outputs, strict=True) for t in p + o}
    assert unused, "every token is read: pick other prompts"
    target = with_nan_row(clean, min(unused))
    expected = [ms.generate(target, p, max_new_tokens=NEW).tokens for p in prompts]
    assert expected == outputs                         # the NaN row changes nothing it is not fed
    return target, min(unused), prompts, expected


@pytest.mark.parametrize("drafter", [None, "prompt-lookup"])
@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_a_nan_request_fails_alone_and_leaves_nothing_behind(poisoned_target, kv_cache, drafter):
    target, bad, prompts, expected = poisoned_target
    kwargs = {} if drafter is None else {"drafter": ms.PromptLookupDrafter(), "k": 3}
    engine = ms.Engine(target, max_batch_size=4, kv_cache=kv_cache, **kwargs)
    # NaN from the first / from the last prompt position; they run first and fourth, so the healthy
    # requests admitted after them reuse their freed slot or blocks
    order = [[bad] + prompts[1], *prompts[:2], prompts[3] + [bad], *prompts[2:]]
    results = engine.generate(order, max_new_tokens=NEW, progress=False)
    for result in (results[0], results[3]):
        assert result.finish_reason == "error" and "NaN" in result.error
    healthy = results[1:3] + results[4:]
    assert [r.finish_reason for r in healthy] == ["length"] * len(prompts)
    assert [r.tokens for r in healthy] == expected
    if kv_cache == "paged":
        assert engine.target_cache.num_used_blocks == 0
