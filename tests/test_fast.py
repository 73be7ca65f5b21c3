"""The packed fast path (minispec.speed.packed): same logits as eager, same greedy tokens,
undoable, and an eager fallback with one warning where it cannot pack.

Float tolerance: the packed GEMM sums the same products in another order, so logits may differ from
eager's by float32 rounding (~1e-6 relative); the issue's bound is 1e-4 absolute.
"""

import copy
import warnings
from pathlib import Path

import pytest
import torch
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.paged_cache import PagedKVCache
from minispec.speed import packed
from minispec.speed.packed import PackedLinear, is_fast, make_eager, make_fast, packed_bytes

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="this torch build has no oneDNN")

TOL = 1e-4


def fast_copy(model):
    """A packed deep copy of ``model`` (the eager original stays untouched as the reference)."""
    return make_fast(copy.deepcopy(model))


def test_fast_logits_match_eager_without_cache(tiny):
    fast = fast_copy(tiny.model)
    assert is_fast(fast) and not is_fast(tiny.model)
    V = tiny.model.config.vocab_size
    for B, T in [(1, 1), (1, 5), (3, 9), (2, 33)]:
        ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(B * T))
        pos = torch.arange(T).expand(B, T)
        with torch.inference_mode():
            ref, fast_logits = tiny.model(ids, pos), fast(ids, pos)
        assert (fast_logits - ref).abs().max().item() < TOL


@pytest.mark.parametrize("cache_kind", [ContiguousKVCache, PagedKVCache])
def test_fast_decode_steps_match_eager_with_a_cache(tiny, cache_kind):
    """Prefill, then verify-shaped steps of 1..9 tokens at batch 3 with a padded row, and a
    rollback."""
    eager, fast = tiny.model, fast_copy(tiny.model)
    V = eager.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    caches = [cache_kind.for_model(m, num_slots=3, max_seq_len=128) for m in (eager, fast)]
    slots = [[c.allocate() for _ in range(3)] for c in caches]
    start = [0, 0, 0]
    for T in [12, 1, 5, 9, 2]:
        ids = torch.randint(0, V, (3, T), generator=gen)
        pos = torch.tensor(start)[:, None] + torch.arange(T)  # (3, T)
        pos[2, T // 2 + 1:] = -1  # row 2 is shorter: its tail is padding
        with torch.inference_mode():
            ref, out = (m(ids, pos, c, s)
                        for m, c, s in zip((eager, fast), caches, slots, strict=True))
        valid = pos >= 0
        assert (out[valid] - ref[valid]).abs().max().item() < TOL
        # roll every row back by one position, as after a rejected draft
        start = [max(0, caches[0].length(slot) - 1) for slot in slots[0]]
        for cache, s in zip(caches, slots, strict=True):
            for slot, n in zip(s, start, strict=True):
                cache.truncate_to(slot, n)


def test_make_fast_keeps_parameters_and_is_undoable():
    model = tiny_llama()
    keys, params = list(model.state_dict()), [p.data_ptr() for p in model.parameters()]
    ids, pos = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None]
    with torch.inference_mode():
        ref = model(ids, pos)
    assert make_fast(model) is model and make_fast(model) is model  # twice is harmless
    assert list(model.state_dict()) == keys
    # packed copies are extra, not moved
    assert [p.data_ptr() for p in model.parameters()] == params
    assert packed_bytes(model) > 0
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    make_eager(model)
    assert not is_fast(model) and packed_bytes(model) == 0
    assert list(model.state_dict()) == keys
    with torch.inference_mode():
        assert torch.equal(model(ids, pos), ref)  # eager again: bit for bit the same as before


def test_a_fast_model_copies_and_refuses_a_backward():
    model = make_fast(tiny_llama())
    ids, pos = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
    logits = model(ids, pos)  # under autograd: the forward runs
    assert torch.equal(copy.deepcopy(model)(ids, pos), logits)  # a copy repacks its own weights
    with pytest.raises(RuntimeError, match="no backward.*make_eager"):
        logits.sum().backward()


def test_packed_linear_matches_linear_for_any_rows():
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=True)
    packed = PackedLinear.from_linear(linear)
    for shape in [(1, 24), (7, 24), (2, 3, 24), (0, 24)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            assert torch.allclose(packed(x), linear(x), atol=1e-5)
    assert packed.to_linear().weight is linear.weight


@pytest.mark.parametrize("blas_rows", [0, 1, 3])
def test_either_kernel_gives_eager_logits(tiny, blas_rows):
    """Forwards of 1, 3 and 5 tokens (as many rows per product) with the BLAS up to ``blas_rows``
    rows and oneDNN's packed kernel above."""
    fast = make_fast(copy.deepcopy(tiny.model), blas_rows=blas_rows)
    assert {m.blas_rows for m in fast.modules() if isinstance(m, PackedLinear)} == {blas_rows}
    twin = copy.deepcopy(fast)                               # a copy repacks, same kernels
    assert {m.blas_rows for m in twin.modules() if isinstance(m, PackedLinear)} == {blas_rows}
    for T in (1, 3, 5):
        ids, pos = torch.arange(1, T + 1)[None], torch.arange(T)[None]
        with torch.inference_mode():
            assert (fast(ids, pos) - tiny.model(ids, pos)).abs().max().item() < TOL


@pytest.mark.parametrize("faster_up_to", [0, 3, 8])
def test_the_blas_runs_the_widths_where_it_is_faster(tiny, monkeypatch, faster_up_to):
    """``choose_blas_rows`` times both kernels width by width. On a fake clock where a forward of
    ``T`` tokens takes 1 s with the kernel that is faster at that width (the BLAS up to
    ``faster_up_to`` rows) and 2 s with the other, it finds ``faster_up_to`` (capped at
    ``most=8``), and ``make_fast`` keeps it: no real timing decides."""
    fast = make_fast(copy.deepcopy(tiny.model), blas_rows=0)
    now, width = [0.0], [0]
    forward = fast.forward

    def recording(ids, positions, *args, **kwargs):    # the width of the forward being timed
        width[0] = ids.shape[1]
        return forward(ids, positions, *args, **kwargs)

    def clock():                  # each reading advances by the duration of the current forward
        on_blas = width[0] <= fast.packed_head.blas_rows
        now[0] += 1.0 if on_blas == (width[0] <= faster_up_to) else 2.0
        return now[0]

    monkeypatch.setattr(fast, "forward", recording)
    monkeypatch.setattr(packed.time, "perf_counter", clock)
    assert packed.choose_blas_rows(fast) == faster_up_to
    packed.make_eager(fast)
    packed.make_fast(fast)                                   # make_fast keeps what it measured
    assert {m.blas_rows for m in fast.modules() if isinstance(m, PackedLinear)} == {faster_up_to}


def test_greedy_speculative_equals_greedy_under_the_fast_path():
    target = tiny_llama(seed=0)
    draft = noisy_copy(target, 0.01, seed=None)
    eager_base = [ms.generate(target, p, max_new_tokens=24).tokens for p in ([1], [3, 4, 5])]
    make_fast(target), make_fast(draft)
    for prompt, base in zip(([1], [3, 4, 5]), eager_base, strict=True):
        plain = ms.generate(target, prompt, max_new_tokens=24).tokens
        spec = ms.speculative_generate(target, ms.ModelDrafter(draft), prompt, 24, k=4,
                                       adaptive=False)
        assert spec.tokens == plain == base
        assert spec.stats.target_forwards < 24  # the drafts were accepted: rounds of k+1 tokens ran


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_engine_batches_under_the_fast_path_equal_eager_greedy(kv_cache):
    """Batched verify of padded rows (1..k+1 tokens each) through packed weights."""
    target = tiny_llama(seed=0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    prompts = [[1], [3, 4, 5], [7, 8, 9, 7, 8, 9, 7], [10, 11] * 6, list(range(20, 40))]
    base = [ms.generate(target, p, max_new_tokens=20).tokens for p in prompts]
    make_fast(target), make_fast(draft)
    engine = ms.Engine(target, draft=draft, k=3, max_batch_size=4, kv_cache=kv_cache, block_size=4)
    results = engine.generate(prompts, progress=False, max_new_tokens=20)
    assert [r.tokens for r in results] == base


def test_fallback_warns_once_and_stays_eager():
    model = tiny_llama().to(torch.float64)  # a dtype oneDNN does not pack
    with pytest.warns(RuntimeWarning, match="float64.*eager") as record:
        assert make_fast(model) is model
    assert len(record) == 1 and not is_fast(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.tensor([[1, 2]]), torch.arange(2)[None])  # still runs, eagerly


SHIPPED = Path(ms.__file__).parent / "zoo" / "shakespeare-target" / "model.safetensors"


@pytest.mark.skipif(not SHIPPED.exists(), reason="the shipped model pair is not built yet")
def test_shipped_pair_fast_logits_and_speculative_greedy():
    target, tok = ms.load("shakespeare-target")
    draft, _ = ms.load("shakespeare-draft")
    ids = tok.encode("ROMEO:\nWhat light through yonder window breaks?")
    x, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
    with torch.inference_mode():
        ref = [m(x, pos) for m in (target, draft)]
    base = ms.generate(target, ids, 64).tokens
    make_fast(target), make_fast(draft)
    with torch.inference_mode():
        for m, r in zip((target, draft), ref, strict=True):
            assert (m(x, pos) - r).abs().max().item() < TOL
    spec = ms.speculative_generate(target, ms.ModelDrafter(draft), ids, 64, k=4)
    assert spec.tokens == ms.generate(target, ids, 64).tokens == base


# ------------------------------------------------------------- minispec.tools.costs (the benchmark)


def test_weight_bytes_counts_the_tied_head_once_and_skips_an_untied_embedding(tiny):
    from minispec.tools.costs import weight_bytes

    model = tiny.model
    params = sum(p.numel() for p in model.parameters())
    embed = model.embed_tokens.weight.numel()
    expected = params if model.lm_head is None else params - embed
    assert weight_bytes(model) == 4 * expected


def test_costs_benchmark_reports_both_modes(tiny_gqa, capsys):
    from minispec.tools.costs import main, measure

    report = measure(str(tiny_gqa.path), batches=(1, 2), context=16, max_k=3, repeats=1,
                     progress=False)
    assert sorted(report.modes) == ["eager", "fast"] and report.batches == [1, 2]
    for steps in report.modes.values():         # one StepCosts per mode, every (batch, width)
        assert sorted(steps.verify) == [(b, t) for b in (1, 2) for t in (1, 2, 3, 4)]
        assert steps.r(0, 2) == 1.0
        assert steps.r(3) == steps.verify[1, 4] / steps.verify[1, 1]
    assert report.roofline_ms == pytest.approx(report.weight_bytes / report.bandwidth_gbs / 1e6)
    assert report.predicted_speedup("fast", 0.0, 1) == pytest.approx(1 / report.modes["fast"].r(1))
    assert main(["--target", str(tiny_gqa.path), "--batch", "1", "--context", "8", "--max-k", "1",
                 "--repeats", "1"]) == 0
    assert "r fast" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0


def test_matmul_ms_times_eager_and_packed_for_each_row_count():
    from minispec.tools.costs import matmul_ms

    times = matmul_ms(32, 48, rows=(1, 5), repeats=1)
    assert set(times) == {"eager", "fast"} and all(set(t) == {1, 5} for t in times.values())
    assert all(ms_ > 0 for t in times.values() for ms_ in t.values())
    runs = matmul_ms(32, 48, rows=(1, 5), repeats=3, per_repeat=True)   # paired repeats, in order
    assert all(len(v) == 3 and min(v) > 0 for per in runs.values() for v in per.values())


def test_bench_costs_command_shows_eager_and_fast_side_by_side(tiny_gqa, tmp_path, capsys):
    """``minispec bench costs`` (and its alias ``roofline``) is the eager-against-fast report."""
    import json

    from minispec.tools.cli import main

    quick = ["--batch", "1", "--context", "8", "--max-k", "2", "--repeats", "1"]
    for name in ("costs", "roofline"):
        assert main(["bench", name, "--model", str(tiny_gqa.path), *quick,
                     "--out", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "eager" in out and "fast" in out and "roofline" in out and "fraction achieved" in out
        assert "r eager" in out and "r fast" in out and "c = 0" in out
    report = json.loads((tmp_path / "costs.json").read_text())["costs"]
    assert set(report["modes"]) == {"eager", "fast"} and report["modes"]["fast"]["verify"]
    # --fast is accepted and said to change nothing; an unknown flag is an error, not ignored
    assert main(["bench", "costs", "--fast", "--target", str(tiny_gqa.path), *quick]) == 0
    assert "changes nothing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "costs", "--no-such-flag"])
    assert main(["bench", "--threads", "1", "costs"]) == 2  # options belong after 'costs'
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "costs", "--help"])
    assert exit_info.value.code == 0
    assert "eager and fast" in capsys.readouterr().out


@pytest.mark.skipif(not SHIPPED.exists(), reason="the shipped model pair is not built yet")
def test_bench_costs_defaults_to_the_shipped_pair_and_measures_c(capsys):
    from minispec.tools.cli import main

    assert main(["bench", "costs", "--batch", "1", "--context", "8", "--max-k", "1",
                 "--repeats", "1", "--clock", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "target shakespeare-target" in out and "draft shakespeare-draft: c eager" in out
    assert "c fast" in out


@pytest.mark.skipif(not SHIPPED.exists(), reason="the shipped model pair is not built yet")
def test_costs_speedups_check_every_output_against_eager_greedy():
    from minispec.tools.costs import format_speedups, measure_speedups

    rows = measure_speedups("shakespeare-target", "shakespeare-draft", new_tokens=12, repeats=1,
                            progress=False)
    assert [r.method for r in rows] == ["greedy", "ngram", "prompt_lookup", "draft"]
    assert all(r.tokens_equal and set(r.seconds) == {"eager", "fast"} for r in rows)
    assert "prompt_lookup" in format_speedups(rows)


def test_load_fast_packs_and_keeps_greedy_tokens():
    """``ms.load(name, fast=True)`` is the packed model, with the eager model's greedy output."""
    eager, tok = ms.load("shakespeare-target")
    packed, _ = ms.load("shakespeare-target", fast=True)
    assert is_fast(packed) and not is_fast(eager)
    ids = tok.encode("ROMEO:")
    assert ms.generate(packed, ids, 16).tokens == ms.generate(eager, ids, 16).tokens
