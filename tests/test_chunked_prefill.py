"""Chunked prefill: a long prompt is prefilled over several steps within a per-step token budget,
while the requests already running keep decoding; outputs stay those of single-request decoding."""

from __future__ import annotations

import pytest
import torch
from tinymodels import tiny_llama

import minispec as ms


@pytest.mark.parametrize("drafter", [None, "ngram", "model"])
def test_a_long_prompt_does_not_stall_the_running_requests(drafter):
    torch.manual_seed(0)
    target = tiny_llama(seed=0, max_pos=160)
    spec = tiny_llama(seed=0, max_pos=160) if drafter == "model" else drafter
    short, long = [1, 2, 3], [i % 40 + 1 for i in range(90)]
    budget = 16
    engine = ms.Engine(target, drafter=spec, k=3, max_batch_size=4, block_size=8,
                       max_num_batched_tokens=budget)
    widths = []                                             # tokens per row of every forward
    hook = target.register_forward_hook(lambda mod, args, out: widths.append(args[0].shape[1]))
    first = engine.add_request(short, max_new_tokens=30)
    tokens = {first: [o.token for o in engine.step()]}      # the short request is decoding
    second = engine.add_request(long, max_new_tokens=10)
    tokens[second], steps_while_filling = [], 0
    while engine.has_unfinished():
        filling = any(s.prefill_left > 0 for s in engine.scheduler.running)
        outs = engine.step()
        steps_while_filling += filling and any(o.request_id == first and o.token is not None
                                               for o in outs)
        for o in outs:
            if o.token is not None:
                tokens[o.request_id].append(o.token)
    hook.remove()
    assert steps_while_filling >= 4          # ~90 tokens at <= 16 a step: the short one kept going
    assert max(widths) <= budget             # no forward fed more than the budget per row
    for prompt, rid in ((short, first), (long, second)):
        assert tokens[rid] == ms.generate(target, prompt, 30 if rid == first else 10).tokens
    assert engine.target_cache.num_used_blocks == 0


def test_the_budget_is_validated():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        ms.Engine(tiny_llama(), max_num_batched_tokens=0)


def test_a_prompt_is_prefilled_once():
    """The rounds keep the cache at ``n - 1`` positions: no step after admission prefills again."""
    target = tiny_llama(seed=0)
    engine = ms.Engine(target, drafter="ngram", k=3, max_batch_size=4, block_size=4)
    engine.generate([[1, 2, 3], [4, 5, 6, 7], [8, 9]], progress=False, max_new_tokens=12)
    assert engine.prefill_forwards == 1


def test_a_tree_round_is_priced_at_its_nodes():
    """The chunked-prefill budget counts what a decoding request's round feeds: a tree's nodes."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    engine = ms.Engine(target, draft=draft, k=2, branching=(3, 2), max_num_batched_tokens=16)
    engine.add_request([1, 2, 3], max_new_tokens=8)
    engine.step()
    (seq,) = engine.scheduler.running
    assert engine._round_tokens(seq) == 1 + 3 + 3 * 2
    chains = ms.Engine(target, draft=draft, k=2, max_num_batched_tokens=16)
    chains.add_request([1, 2, 3], max_new_tokens=8)
    chains.step()
    (seq,) = chains.scheduler.running
    assert chains._round_tokens(seq) == 2 + 1
