"""``tests/once.py``: the docs site is built once per test run, whichever workers run its tests.

Each test runs a small throwaway project in a pytest subprocess with two xdist workers: the work
both workers ask for is done once, and the tests of an ``xdist_group`` share one worker under
``--dist loadgroup`` (what pytest 9.2.0 with pytest-xdist 3.8 broke; pyproject.toml pins pytest
below it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent

PROJECT = '''
import os
import sys
import time

import pytest

sys.path.insert(0, {tests!r})
from once import builds, once_per_run

OUT = {out!r}


def _note(kind):
    with open(os.path.join(OUT, kind), "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")


def _make(folder):
    time.sleep(0.5)                      # long enough for the other worker to ask meanwhile
    (folder / "made").write_text("yes")


@pytest.mark.parametrize("i", range(6))
def test_once(tmp_path_factory, i):
    folder = once_per_run(tmp_path_factory, "thing", _make)
    _note("asked")
    assert (folder / "made").read_text() == "yes"
    with open(os.path.join(OUT, "builds"), "w") as f:
        f.write(" ".join(builds(folder)))


@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    _note("grouped")
'''


def _run(tmp_path: Path, python: str = sys.executable) -> dict[str, list[str]]:
    """Run the throwaway project on two workers (``--dist loadgroup``, as the README's command);
    what each kind of its tests saw."""
    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir(), out.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_it.py").write_text(textwrap.dedent(PROJECT.format(tests=str(TESTS),
                                                                       out=str(out))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "--basetemp", str(tmp_path / "base"),
                           str(project)], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {f.name: f.read_text().split() for f in out.iterdir()}


def test_the_site_build_is_done_once_and_its_group_on_one_worker(tmp_path):
    """Work both workers ask for is done once; the tests of an ``xdist_group`` share a worker.
    If only the second fails, this pytest and pytest-xdist do not keep a group together: the
    site is still built once, but the worker that did not build it waits for it."""
    seen = _run(tmp_path)
    assert sorted(set(seen["asked"])) == ["gw0", "gw1"], seen   # both workers asked ...
    assert len(seen["builds"]) == 1, seen                       # ... and one of them made it
    assert len(set(seen["grouped"])) == 1, seen
