"""A fast smoke test of the benchmark code on a tiny random checkpoint (its own draft:
alpha = 1). Nothing here asserts on this machine's speed: the timed runs read a fake clock on which
every duration is set by the test, so the checks are of the arithmetic, not of the load."""

import copy
import dataclasses
import json

import pytest

from minispec.tools import bench
from minispec.tools.cli import main

PROMPTS = {"shakespeare": [[1, 5, 9, 2, 7, 3], [4, 4, 8, 1]],
           "repetitive": [[1, 2, 3, 4] * 3 + [1, 2], [7, 8, 9] * 4]}


class FakeClock:
    """A clock for a test: it stands still but for ``tick`` per reading and what ``advance`` adds,
    so every duration a benchmark measures is set by the test."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def results(tiny_gqa):
    """Every method on a clock that advances 1 s per reading: each method's run takes 1 s."""
    model = tiny_gqa.model
    return bench.run_speed(model, model, PROMPTS, max_new_tokens=8, ks=(1, 2), hf_ks=(2,),
                           k_ngram=3, repeats=1, warmup=0, target_dir=tiny_gqa.path,
                           draft_dir=tiny_gqa.path, adaptive=True, log=None,
                           clock=FakeClock(tick=1.0))


def test_every_method_reproduces_minispec_greedy(results):
    names = {(r.prompt_set, r.name) for r in results}
    for expected in ["minispec generate", "minispec draft k=1", "minispec draft k=2",
                     "minispec draft k=auto", "minispec n-gram k=3", "minispec prompt lookup k=3",
                     "transformers generate", "transformers assisted k=2",
                     "transformers prompt lookup k=3"]:
        assert ("shakespeare", expected) in names
    assert ("repetitive", "minispec n-gram k=3") in names
    assert all(r.token_equal for r in results), [r.name for r in results if not r.token_equal]


def test_ratios_and_counts(results):
    by_name = {(r.prompt_set, r.name): r for r in results}
    base = by_name[("shakespeare", "minispec generate")]
    assert base.vs_minispec_greedy == pytest.approx(1.0)
    assert base.seconds == 1.0 and base.tokens == 16 and base.tokens_per_s == 16.0
    hf = by_name[("shakespeare", "transformers generate")]
    assert hf.vs_hf_greedy == pytest.approx(1.0)
    spec = by_name[("shakespeare", "minispec draft k=2")]
    assert spec.acceptance_rate == 1.0                          # the draft is the target itself
    assert spec.tokens_per_round > 1
    assert "vs ms greedy" in bench.format_table(results)
    alone = dataclasses.replace(base, vs_hf_greedy=float("nan"))   # as with --no-hf
    assert "nan" not in bench.format_table([alone])


def target_ms(tokens: int) -> float:
    """The fake cost of a target forward of ``tokens`` tokens: 10 ms plus 1 ms a token."""
    return 1e-3 * (10 + tokens)


DRAFT_MS = 3e-3


@pytest.fixture
def priced_pair(tiny_gqa):
    """``(target, draft, clock)``: the tiny model and a copy of it, each forward of which advances
    ``clock`` by its price (``target_ms(T)``, ``DRAFT_MS``) and by nothing else."""
    clock, target, draft = FakeClock(), tiny_gqa.model, copy.deepcopy(tiny_gqa.model)
    hooks = [target.register_forward_pre_hook(
                 lambda _m, args: clock.advance(target_ms(args[0].shape[1]))),
             draft.register_forward_pre_hook(lambda _m, args: clock.advance(DRAFT_MS))]
    yield target, draft, clock
    for hook in hooks:
        hook.remove()


def test_measured_costs_are_the_forwards_prices(priced_pair):
    """``measure_costs`` reads each shape's median forward off the clock: on a clock where the
    forwards cost known amounts, ``c`` and ``r(gamma)`` are those amounts' ratios, exactly."""
    target, draft, clock = priced_pair
    costs = bench.measure_costs(target, draft, PROMPTS["shakespeare"], max_gamma=2, repeats=3,
                                max_new_tokens=8, clock=clock)
    assert costs.alpha_greedy == 1.0 and costs.agreement_text == 1.0   # the same model twice
    assert costs.alpha_t1 == pytest.approx(1.0, abs=1e-5)
    assert costs.t_target == pytest.approx(target_ms(1))
    assert costs.t_draft == pytest.approx(DRAFT_MS)
    assert costs.c == pytest.approx(DRAFT_MS / target_ms(1))
    assert costs.r == pytest.approx({g: target_ms(g + 1) / target_ms(1) for g in (1, 2)})


def given_costs(c: float = 0.25, r: tuple[float, ...] = (1.1, 1.3)) -> bench.Costs:
    """Costs built from given step times: a 10 ms target step, ``c`` and ``r(1..len(r))``."""
    t = 0.01
    steps = bench.StepCosts.measured({(1, 1): t} | {(1, g + 1): t * v for g, v in enumerate(r, 1)},
                               {1: c * t})
    return bench.Costs(steps=steps, max_gamma=len(r), alpha_t1=0.9, agreement_text=0.8,
                       alpha_greedy=0.5, context=16, threads=1)


def test_the_cost_model_from_given_costs(results, tmp_path):
    """The cost model's arithmetic, from given costs: ``c``, ``r``, the predictions of the
    r-extended model and of Theorem 3.8, and the comparison with measured speedups."""
    costs = given_costs(c=0.25, r=(1.1, 1.3))
    assert costs.c == pytest.approx(0.25) and costs.r == pytest.approx({1: 1.1, 2: 1.3})
    pred = bench.predict(costs, 2)                              # alpha: costs.alpha_greedy
    assert pred["expected_tokens"] == pytest.approx(1.75)       # 1 + 0.5 + 0.25
    assert pred["r_model"] == pytest.approx(1.75 / (2 * 0.25 + 1.3))
    assert pred["paper_r1"] == pytest.approx(1.75 / (2 * 0.25 + 1))
    comparison = bench.compare_with_measured(costs, results)
    assert [row["k"] for row in comparison] == [1, 2]
    row = comparison[1]                       # the fake clock: every method as fast as greedy
    assert row["measured"] == 1.0
    assert row["measured_over_r_model"] == pytest.approx(1 / pred["r_model"])
    assert row["predicted_from_measured_tokens"] == pytest.approx(
        row["measured_tokens_per_round"] / (2 * 0.25 + 1.3))
    assert "r(1)=1.10, r(2)=1.30" in bench.format_costs(costs, comparison)
    paths = bench.write_outputs(tmp_path, results, costs, comparison, {"quick": True})
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["costs"]["alpha_greedy"] == 0.5 and len(data["results"]) == len(results)
    assert data["costs"]["c"] == pytest.approx(0.25)
    assert (tmp_path / "bench.png") in paths


def test_cli_bench_quick(tiny_gqa, tmp_path, capsys):
    code = main(["bench", "--quick", "--no-hf", "--target", str(tiny_gqa.path), "--draft",
                 str(tiny_gqa.path), "--ks", "1,2", "--max-new-tokens", "8", "--out",
                 str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "minispec draft k=2" in out and "verify ratio" in out
    record = json.loads((tmp_path / "bench.json").read_text())     # stamped by tools.records
    assert {"machine", "commit", "command", "date", "settings", "results"} <= set(record)
    assert record["machine"]["clock"] == "wall" and record["machine"]["threads"] >= 1


def test_cli_bench_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--threads" in capsys.readouterr().out


# ------------------------------------------------------ time_methods and the real workloads


def test_time_methods_flags_a_method_that_changes_tokens(tiny_gqa):
    model = tiny_gqa.model
    prompts = {"set": PROMPTS["shakespeare"]}
    reference = {"set": [bench.generate(model, ids, 6).tokens for ids in prompts["set"]]}

    def good(ids):
        return bench.generate(model, ids, 6).tokens, None

    def bad(ids):
        tokens = bench.generate(model, ids, 6).tokens
        return tokens[:-1] + [(tokens[-1] + 1) % 128], None

    results = bench.time_methods(
        [bench.Method("minispec generate", "minispec", "set", good),
         bench.Method("broken", "minispec", "set", bad)], prompts, reference, repeats=2, warmup=0,
        log=None)
    assert [r.token_equal for r in results] == [True, False]
    assert results[1].mismatches == [0, 1]
    assert len(results[0].seconds_all) == 2 and results[0].vs_minispec_greedy == pytest.approx(1.0)


@pytest.fixture(scope="module")
def chat_shakespeare():
    """The shipped target with a ChatML template on its tokenizer: the workloads run end to end."""
    from minispec import zoo
    from minispec.loading.loader import load

    target, tokenizer = load("shakespeare-target")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return target, tokenizer, zoo.path("shakespeare-target")


def test_workloads_encode_every_task(chat_shakespeare):
    from minispec.tools import workloads

    _, tokenizer, _ = chat_shakespeare
    prompts = workloads.encode_tasks(tokenizer)
    assert list(prompts) == list(workloads.TASKS)
    assert set(workloads.GROUNDED) | set(workloads.OPEN_ENDED) == set(workloads.TASKS)
    for task, ids in prompts.items():
        text = tokenizer.decode(ids)
        assert text.endswith("<|im_start|>assistant\n"), task
    assert "Millbrook" in tokenizer.decode(prompts["summarize"])
    with pytest.raises(ValueError, match="unknown task"):
        workloads.encode_tasks(tokenizer, ("poetry",))


def test_workloads_run_reproduces_greedy_everywhere(chat_shakespeare):
    from minispec.tools import workloads

    target, tokenizer, directory = chat_shakespeare
    results = workloads.run(target, tokenizer, directory, tasks=("chat", "code_edit"),
                            max_new_tokens=8, k=3, log=None)
    assert [(r.prompt_set, r.name) for r in results[:5]] == [
        ("chat", "minispec generate"), ("chat", "minispec n-gram k=3"),
        ("chat", "minispec prompt lookup k=3"), ("chat", "transformers generate"),
        ("chat", "transformers prompt lookup k=3")]
    assert len(results) == 10 and all(r.token_equal for r in results)
    assert all(r.tokens == 8 for r in results)
    spec = next(r for r in results if r.name == "minispec prompt lookup k=3")
    assert spec.tokens_per_round >= 1.0 and spec.target_forwards >= 1
    assert "all outputs identical to minispec greedy (10/10" in workloads.format_results(results)


def test_time_steps_reads_each_shape_off_the_clock(priced_pair):
    """``costs.time_steps`` on a clock that the forwards advance by their prices: each shape's
    median is its price, so ``r(k)`` is exact; the probe runs once per model per timed repeat."""
    from minispec.tools import costs

    target, draft, clock = priced_pair
    probes = []
    steps, bandwidths = costs.time_steps({"target": target, "draft": draft}, batch=1, context=8,
                                         max_k=2, repeats=3, progress=False,
                                         probe=lambda: probes.append(1) or 1.0, clock=clock)
    assert steps["target"].verify == pytest.approx({(1, t): target_ms(t) for t in (1, 2, 3)})
    assert steps["draft"].verify == pytest.approx({(1, t): DRAFT_MS for t in (1, 2, 3)})
    assert steps["target"].r(2) == pytest.approx(target_ms(3) / target_ms(1))
    assert len(bandwidths) == len(probes) == 2 * 3
