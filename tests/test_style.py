"""The code style the project promises, checked: ruff's configured rules (pyproject.toml), lines of
at most 100 characters included, over the package, the tests, the benchmarks, the site hooks and
the notebooks' code cells."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    """How to run ruff here: the executable, else the module; None when neither is installed."""
    if shutil.which("ruff"):
        return ["ruff"]
    probe = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    return [sys.executable, "-m", "ruff"] if probe.returncode == 0 else None


def test_ruff_passes_with_line_length_100():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it is a dev dependency)")
    done = subprocess.run([*ruff, "check", "--no-cache", "minispec", "tests", "benchmarks",
                           "docs/hooks", "lessons"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    config = (ROOT / "pyproject.toml").read_text()
    assert "line-length = 100" in config and '"E501"' not in config   # the limit is enforced
