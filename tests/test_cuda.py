"""The package on a CUDA device: the same exactness claims the CPU tests make, run on the GPU.

Every test here is skipped without a CUDA device (CI has none); on a GPU machine run
``python -m pytest tests/test_cuda.py -m cuda``. The models are the tiny random checkpoints of
``conftest.py``, loaded on the GPU in float32, so the reference is transformers on the same device
and the same dtype: greedy tokens must be *equal* (minGPT's rule), and speculative decoding must
return exactly the tokens of plain decoding on that device.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lawcheck import chi_square_pvalue

import minispec as ms
from minispec.loading.loader import load
from tests.conftest import make_hf_model, save_hf_model

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

NAME = "gqa-llama3-tied"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a tiny draft of the same vocabulary, both on the GPU, plus transformers'
    target on the GPU."""
    hf_target, hf_draft = make_hf_model(NAME, seed=0), make_hf_model(NAME, seed=1)
    t_dir = save_hf_model(hf_target, tmp_path_factory.mktemp("cuda-target"))
    d_dir = save_hf_model(hf_draft, tmp_path_factory.mktemp("cuda-draft"))
    target, _ = load(t_dir, device="cuda", dtype=torch.float32)
    draft, _ = load(d_dir, device="cuda", dtype=torch.float32)
    return target, draft, hf_target.to("cuda")


def prompts(vocab: int, n: int = 6) -> list[list[int]]:
    """``n`` prompts of different lengths, each with a repeated stretch for n-gram drafters."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        head = torch.randint(4, vocab, (5 + 3 * i,), generator=g).tolist()
        out.append(head + head[:4] + head)
    return out


def test_model_lives_on_the_gpu(pair):
    target, draft, _ = pair
    assert target.device.type == "cuda" and draft.device.type == "cuda"
    assert all(p.is_cuda for p in target.parameters())


def test_greedy_equals_transformers_on_cuda(pair):
    target, _, hf = pair
    for ids in prompts(target.config.vocab_size, 3):
        ours = ms.generate(target, ids, 24).tokens
        x = torch.tensor([ids], device="cuda")
        theirs = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24,
                             min_new_tokens=24, do_sample=False, pad_token_id=0)
        assert torch.equal(torch.tensor(ours), theirs[0, len(ids):].cpu())


@pytest.mark.parametrize("which", ["draft", "ngram", "prompt_lookup", "suffix"])
def test_speculative_greedy_equals_plain_on_cuda(pair, which):
    target, draft, _ = pair
    drafter = {"draft": lambda: ms.ModelDrafter(draft), "ngram": ms.NGramDrafter,
               "prompt_lookup": ms.PromptLookupDrafter, "suffix": ms.SuffixDrafter}[which]
    for ids in prompts(target.config.vocab_size, 3):
        plain = ms.generate(target, ids, 32).tokens
        for adaptive in (False, True):
            out = ms.speculative_generate(target, drafter(), ids, 32, k=4, adaptive=adaptive)
            assert out.tokens == plain, (which, adaptive)
        assert out.stats.new_tokens == 32


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_engine_on_cuda_equals_single_requests(pair, kv_cache):
    target, draft, _ = pair
    ps = prompts(target.config.vocab_size)
    singles = [ms.generate(target, ids, 20).tokens for ids in ps]
    for kwargs in ({}, {"draft": draft, "k": 4}, {"drafter": ms.NGramDrafter(), "k": 3}):
        engine = ms.Engine(target, max_batch_size=4, kv_cache=kv_cache, **kwargs)
        results = engine.generate(ps, max_new_tokens=20, progress=False)
        assert [r.tokens for r in results] == singles, kwargs
        if "draft" in kwargs:              # the draft model's steps were captured, in one pool
            graphs = engine.runner.step.graphs
            assert engine.drafter.step.graphs is graphs
            assert set(engine.drafter.step.steps.values()) & set(graphs.graphs)


def test_sampled_requests_do_not_depend_on_their_neighbours_on_cuda(pair):
    target, draft, _ = pair
    ps = prompts(target.config.vocab_size, 4)
    params = [ms.SamplingParams(temperature=0.9, seed=100 + i) for i in range(len(ps))]
    together = ms.Engine(target, draft=draft, k=3, max_batch_size=4).generate(
        ps, sampling=params, max_new_tokens=16, progress=False)
    for ids, sp, out in zip(ps, params, together, strict=True):
        alone = ms.Engine(target, draft=draft, k=3, max_batch_size=4).generate(
            [ids], sampling=sp, max_new_tokens=16, progress=False)[0]
        assert alone.tokens == out.tokens


def test_speculative_sampling_law_on_cuda():
    """``ms.verify`` on one draft ``x ~ q``, on the GPU: the first token follows p (chi-square; a
    false alarm 1 time in 1000) and the draft is kept at the rate ``sum min(p, q)`` (5 standard
    errors)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], device="cuda")
    q = torch.tensor([0.05, 0.10, 0.20, 0.25, 0.20, 0.20], device="cuda")
    n, target = 20_000, torch.stack([p, p])
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    verdicts = [ms.verify(ms.Proposal.chain([x], q[None]), target, g, greedy=False)
                for x in drafts]
    assert all(v.final_probs.is_cuda for v in verdicts)
    counts = torch.bincount(torch.tensor([v.tokens[0] for v in verdicts]), minlength=6)
    assert chi_square_pvalue(counts, p.cpu()) > 1e-3
    beta = torch.minimum(p, q).sum().item()
    rate = sum(v.num_accepted for v in verdicts) / n
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / n) ** 0.5


def test_eagle_head_drafts_exactly_on_cuda(pair):
    """A random EAGLE-style head on the GPU: its drafts are mostly wrong, and the tokens are still
    plain greedy's, in the loop and in the engine."""
    from minispec.extra_drafters.eagle_head import EagleHead

    target, _, _ = pair
    vocab = torch.arange(0, target.config.vocab_size, 2)            # a draft vocabulary V'
    head = EagleHead(target.config, vocab=vocab).to("cuda").bind(target)
    ps = prompts(target.config.vocab_size, 4)
    plain = [ms.generate(target, ids, 24).tokens for ids in ps]
    for ids, want in zip(ps, plain, strict=True):
        assert ms.speculative_generate(target, ms.EagleDrafter(head), ids, 24, k=3).tokens == want
    engine = ms.Engine(target, drafter=ms.EagleDrafter(head), k=3, max_batch_size=4)
    assert [r.tokens for r in engine.generate(ps, max_new_tokens=24, progress=False)] == plain


# ---------------------------------------------------------------- the static step as CUDA graphs


def _both(target, cache_kind: str, batch: int, tree: bool = False):
    """A prefill and a step of ``batch`` rows through the dynamic path and through captured
    graphs, on two equal caches; the step's two logits (the real tokens only)."""
    from minispec.models.llama import TreeAttention
    from minispec.speed.static_step import StaticForward

    make = {"paged": lambda: ms.PagedKVCache.for_model(target, batch, 64, block_size=8),
            "contiguous": lambda: ms.ContiguousKVCache.for_model(target, batch, 64)}[cache_kind]
    dynamic = make()
    slots = [dynamic.allocate() for _ in range(batch)]
    g = torch.Generator().manual_seed(batch)
    vocab = target.config.vocab_size
    lengths = [3 + (7 * b) % 20 for b in range(batch)]
    ids = torch.randint(0, vocab, (batch, max(lengths)), generator=g).cuda()
    pos = torch.tensor([list(range(n)) + [-1] * (max(lengths) - n) for n in lengths]).cuda()
    with torch.inference_mode():
        target(ids, pos, dynamic, slots)
        graphed = copy.deepcopy(dynamic)
        static = StaticForward(target, graphed, graphs=True)
        step = torch.randint(0, vocab, (batch, 3), generator=g).cuda()
        start = torch.tensor(lengths).cuda()
        if tree:       # the root and two siblings under it, at depths 0, 1, 1
            mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).cuda()
            spec = TreeAttention(start[:, None] + torch.arange(3).cuda(), start,
                                 mask.expand(batch, 3, 3))
            step_pos = start[:, None] + torch.tensor([0, 1, 1]).cuda()
        else:
            spec, step_pos = None, start[:, None] + torch.arange(3).cuda()
        expected = target(step, step_pos, dynamic, slots, tree=spec)
        got, _ = static.in_bucket(step, step_pos, slots, spec)             # captured, then replayed
        for slot, n in zip(slots, lengths, strict=True):          # roll back; replay again
            graphed.truncate_to(slot, n)
        again, _ = static.in_bucket(step, step_pos, slots, spec)
        assert torch.equal(again, got)
        return expected, got, static


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("cache_kind", ["paged", "contiguous"])
def test_captured_graphs_equal_the_eager_path_at_every_bucket(pair, batch, cache_kind):
    target = pair[0]
    expected, got, static = _both(target, cache_kind, batch)
    assert static.graphs is not None and static.graphs.graphs      # a graph was captured
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("batch", [1, 5])
def test_a_captured_tree_verify_equals_the_eager_one(pair, batch):
    expected, got, _ = _both(pair[0], "paged", batch, tree=True)
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_the_engine_with_graphs_equals_single_requests_with_preemption_and_refill(pair):
    """Ten requests through a batch of four and a pool too small for them all (preemption and
    refills); draft chains and trees; every output equals plain decoding without graphs."""
    from minispec.speed.static_step import StaticForward

    target, draft, _ = pair
    ps = prompts(target.config.vocab_size, 10)
    expected = [ms.generate(target, p, 24, graphs=False).tokens for p in ps]
    for branching in (None, (2, 1, 1)):
        engine = ms.Engine(target, draft=draft, k=3, max_batch_size=4, block_size=8,
                           num_blocks=40, branching=branching, adaptive=False)
        assert isinstance(engine.runner.step, StaticForward)        # on by default on CUDA
        results = engine.generate(ps, max_new_tokens=24, progress=False)
        assert [r.tokens for r in results] == expected
        assert engine.target_cache.num_used_blocks == 0


def test_a_nan_row_fails_alone_under_graphs(pair):
    """A request whose own prompt holds a token with a NaN embedding fails; its neighbours in the
    same captured batch decode as they do alone."""
    import dataclasses

    from minispec.models.llama import Llama

    target = pair[0]
    bad = target.config.vocab_size - 1
    untied = Llama(dataclasses.replace(target.config, tie_word_embeddings=False)).cuda().eval()
    untied.load_state_dict(target.state_dict()
                           | {"lm_head.weight": target.output_weight.detach().clone()})
    with torch.no_grad():
        untied.embed_tokens.weight[bad] = float("nan")
    ps = prompts(target.config.vocab_size - 1, 3)
    expected = [ms.generate(untied, p, 16, graphs=False).tokens for p in ps]
    engine = ms.Engine(untied, max_batch_size=4, graphs=True)
    results = engine.generate(ps[:1] + [[bad, 3, 4]] + ps[1:], max_new_tokens=16, progress=False)
    assert results[1].finish_reason == "error"
    assert [r.tokens for i, r in enumerate(results) if i != 1] == expected


def test_bfloat16_speculative_tokens_mostly_equal_plain(pair):
    """bf16: a verify of k + 1 rows and a one-row step use different kernels, so a near tie can
    round either way; most tokens still agree (the record measures the fraction on SmolLM2)."""
    target, draft, _ = pair
    t16, d16 = (copy.deepcopy(m).to(torch.bfloat16) for m in (target, draft))
    same = total = 0
    for p in prompts(target.config.vocab_size, 4):
        a = ms.generate(t16, p, 24).tokens
        b = ms.speculative_generate(t16, d16, p, 24, k=3, adaptive=False).tokens
        same += sum(x == y for x, y in zip(a, b, strict=False))
        total += len(a)
    assert same / total > 0.5
