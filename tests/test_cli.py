"""The command line: --help works, the demo's measured numbers agree with theory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from minispec.cli import main


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "minispec", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "demo" in out.stdout


def test_demo_measures_acceptance_near_theory(capsys):
    assert main(["demo", "--samples", "50000", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    measured, theory = map(float, re.search(r"measured ([\d.]+), theory sum min\(p, q\) = ([\d.]+)", text).groups())
    assert abs(measured - theory) < 5 * (theory * (1 - theory) / 50000) ** 0.5
    tv = float(re.search(r"total variation\(measured, p\) = ([\d.]+)", text).group(1))
    assert tv < 0.02


def test_demo_rejects_bad_arguments(capsys):
    assert main(["demo", "--samples", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["nonsense"])


def test_generate_help():
    out = subprocess.run([sys.executable, "-m", "minispec", "generate", "--help"], capture_output=True, text=True)
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
def test_demo_with_shipped_pair_reports_identical_tokens(capsys):
    assert main(["demo", "--samples", "1000", "--max-new-tokens", "32"]) == 0
    assert capsys.readouterr().out.count("identical to target alone") == 3
