"""The command line: --help works, the demo's measured numbers agree with theory."""

import re
import subprocess
import sys

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
