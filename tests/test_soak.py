"""A soak: many mixed requests, some hostile, through the engine in several configurations.

Per configuration, 40 requests arrive at random steps with random prompts, budgets and samplings
(greedy or seeded); about 10 % are refused at admission (an id outside the vocabulary), about 8 %
fail inside a step (their prompt holds a token whose embedding row is NaN, so their keys, values
and logits are NaN), some are aborted and some are read through a stream that is closed early. The
pool is small enough to force preemption. Then, for every configuration:

* every admitted request finishes exactly once (none lost, none duplicated) and both pools end
  with every block free;
* a request fails iff it holds the NaN token, and the error names the cause;
* every healthy request's tokens equal its run alone (``ms.speculative_generate`` with the same
  drafter, ``k``, branching and seed; greedy ones also equal ``ms.generate``): nothing a neighbour
  did -- failing, being aborted, being preempted -- changes them. The models run in float64 so a
  float near-tie between a batched and a single forward cannot flip a token.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_eagle import random_head
from tinymodels import VOCAB, noisy_copy, tiny_llama

import minispec as ms
from minispec.models.llama import Llama

NAN_TOKEN = VOCAB - 1
CONFIGS = {
    "model, paged": dict(drafter="model", kv_cache="paged"),
    "ngram, contiguous": dict(drafter="ngram", kv_cache="contiguous"),
    "model tree, paged": dict(drafter="model", kv_cache="paged", branching=(2, 2, 1)),
    "ngram tree, paged, chunked": dict(drafter="ngram", kv_cache="paged", branching=(3, 1, 1),
                                       max_num_batched_tokens=20),
    "prompt lookup, paged": dict(drafter="prompt_lookup", kv_cache="paged"),
    "EAGLE head, paged": dict(drafter="eagle", kv_cache="paged"),
}


class NaNRow(Llama):
    """A model whose embedding row ``NAN_TOKEN`` is NaN: a sequence that reads the token gets NaN
    keys, values and logits; no model ever predicts it (its logit is -inf), so a healthy request
    never reads it."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        (out[0] if isinstance(out, tuple) else out)[..., NAN_TOKEN] = float("-inf")
        return out


def nan_row(model: Llama) -> NaNRow:
    poisoned = NaNRow(model.config).to(model.dtype).eval()
    poisoned.load_state_dict(model.state_dict())
    with torch.no_grad():
        poisoned.embed_tokens.weight[NAN_TOKEN] = float("nan")
    return poisoned


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=0).double()
    return nan_row(target), nan_row(noisy_copy(target, 0.05, seed=3))


def requests(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        prompt = [rng.randrange(0, NAN_TOKEN) for _ in range(rng.randint(1, 20))]
        roll = rng.random()
        if roll < 0.10:
            prompt[rng.randrange(len(prompt))] = VOCAB + 3          # refused at admission
        elif roll < 0.18:
            prompt[rng.randrange(len(prompt))] = NAN_TOKEN          # fails inside a step
        temperature = rng.choice([0.0, 0.0, 0.9])
        out.append(dict(arrival=rng.randrange(0, 25), prompt=prompt, new=rng.randint(0, 40),
                        sampling=ms.SamplingParams(temperature=temperature, top_k=8,
                                                   seed=rng.randrange(10_000)),
                        abort=rng.random() < 0.05, stream=rng.random() < 0.08, name=f"r{i}"))
    return sorted(out, key=lambda r: r["arrival"])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_soak(models, config):
    target, draft = models
    options = dict(CONFIGS[config])
    kind = options.pop("drafter")
    head = random_head(target, torch.arange(NAN_TOKEN), seed=4).double()   # never drafts NaN
    drafter = {"model": draft, "eagle": ms.EagleDrafter(head)}.get(kind, kind)
    block = {"block_size": 4, "num_blocks": 16} if options["kv_cache"] == "paged" else {}
    engine = ms.Engine(target, drafter=drafter, k=3, max_batch_size=5, max_seq_len=64, **block,
                       **options)
    pending, admitted, finished, tokens = requests(random.Random(config), 40), {}, {}, {}
    refused = step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0]["arrival"] <= step:
            r = pending.pop(0)
            try:
                if r["stream"]:                    # read two outputs, then close the stream
                    stream = engine.stream([r["prompt"]], r["sampling"], max_new_tokens=r["new"])
                    seen = [o for _, o in zip(range(2), stream, strict=False)]
                    stream.close()
                    for o in seen:
                        admitted.setdefault(o.request_id, dict(r, closed=True))
                        finished.update({o.request_id: o} if o.finished else {})
                    continue
                rid = engine.add_request(r["prompt"], r["sampling"], r["name"],
                                         max_new_tokens=r["new"])
            except ValueError:
                refused += 1
                continue
            admitted[rid] = r
        for out in engine.step():
            if out.token is not None:
                tokens.setdefault(out.request_id, []).append(out.token)
            if out.finished:
                assert out.request_id not in finished          # finishes exactly once
                finished[out.request_id] = out
        victims = [rid for rid, r in admitted.items() if r["abort"] and rid not in finished]
        for rid in victims[:1]:
            engine.abort(rid)
        step += 1
        assert step < 2000
    streamed = {rid for rid, r in admitted.items() if r.get("closed")}
    assert set(finished) | streamed == set(admitted)              # none lost
    assert refused > 0
    if kind == "model" and block:                 # the small pool forced preemption
        assert engine.scheduler.num_preemptions > 0
    for cache in (engine.target_cache, engine.draft_cache):
        if cache is not None and block:
            assert cache.num_used_blocks == 0
    for rid, out in finished.items():
        r = admitted[rid]
        if out.finish_reason == "abort":
            continue
        poisoned = NAN_TOKEN in r["prompt"] and r["new"] > 0     # a request with no round is done
        assert (out.finish_reason == "error") == poisoned, (rid, out.finish_reason, out.error)
        if poisoned:
            assert "NaN" in out.error
            continue
        alone = ms.speculative_generate(target, drafter, r["prompt"], r["new"], k=3,
                                        sampling=r["sampling"], max_seq_len=64,
                                        branching=options.get("branching"))
        assert tokens.get(rid, []) == alone.tokens, rid
        if r["sampling"].temperature == 0:
            assert alone.tokens == ms.generate(target, r["prompt"], r["new"], max_seq_len=64).tokens
