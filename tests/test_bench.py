"""A fast smoke test of the benchmark code on a tiny random checkpoint (its own draft:
alpha = 1)."""

import dataclasses
import json

import pytest

from minispec.tools import bench
from minispec.tools.cli import main

PROMPTS = {"shakespeare": [[1, 5, 9, 2, 7, 3], [4, 4, 8, 1]],
           "repetitive": [[1, 2, 3, 4] * 3 + [1, 2], [7, 8, 9] * 4]}


@pytest.fixture(scope="module")
def results(tiny_gqa):
    model = tiny_gqa.model
    return bench.run_speed(model, model, PROMPTS, max_new_tokens=8, ks=(1, 2), hf_ks=(2,),
                           k_ngram=3, repeats=1, warmup=0, target_dir=tiny_gqa.path,
                           draft_dir=tiny_gqa.path, adaptive=True, log=None)


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
    assert base.tokens == 16 and base.tokens_per_s > 0
    hf = by_name[("shakespeare", "transformers generate")]
    assert hf.vs_hf_greedy == pytest.approx(1.0)
    spec = by_name[("shakespeare", "minispec draft k=2")]
    assert spec.acceptance_rate == 1.0                          # the draft is the target itself
    assert spec.tokens_per_round > 1
    assert "vs ms greedy" in bench.format_table(results)
    alone = dataclasses.replace(base, vs_hf_greedy=float("nan"))   # as with --no-hf
    assert "nan" not in bench.format_table([alone])


def test_cost_model(tiny_gqa, results, tmp_path):
    model = tiny_gqa.model
    costs = bench.measure_costs(model, model, PROMPTS["shakespeare"], max_gamma=2, repeats=3,
                                max_new_tokens=8)
    assert costs.alpha_greedy == 1.0 and costs.agreement_text == 1.0
    assert costs.alpha_t1 == pytest.approx(1.0, abs=1e-5)
    assert 0.3 < costs.c < 3                                    # the same model twice: c near 1
    assert set(costs.r) == {1, 2} and all(v > 0 for v in costs.r.values())
    pred = bench.predict(costs, 2, alpha=0.5)
    assert pred["expected_tokens"] == pytest.approx(1.75)
    assert pred["paper_r1"] == pytest.approx(1.75 / (2 * costs.c + 1))
    comparison = bench.compare_with_measured(costs, results)
    assert [row["k"] for row in comparison] == [1, 2]
    assert "r(1)=" in bench.format_costs(costs, comparison)
    paths = bench.write_outputs(tmp_path, results, costs, comparison, {"quick": True})
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["costs"]["alpha_greedy"] == 1.0 and len(data["results"]) == len(results)
    assert (tmp_path / "bench.png") in paths


def test_cli_bench_quick(tiny_gqa, tmp_path, capsys):
    code = main(["bench", "--quick", "--no-hf", "--target", str(tiny_gqa.path), "--draft",
                 str(tiny_gqa.path), "--ks", "1,2", "--max-new-tokens", "8", "--out",
                 str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "minispec draft k=2" in out and "verify ratio" in out
    assert (tmp_path / "bench.json").exists()


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
