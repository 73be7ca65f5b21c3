"""Work done once per test run, however many xdist workers ask for it: the docs site's build.

``--dist loadgroup`` keeps the tests of an ``xdist_group`` on one worker only where pytest-xdist's
renaming of a test's node id reaches pytest's scheduler: pytest 9.2.0 derives ``nodeid`` from a
structured id, so the ``@group`` suffix pytest-xdist 3.8 writes to ``item._nodeid`` is lost and
the group is spread over the workers, each of which built the site. So the build does not rely on
the schedule: the first worker to ask builds under a file lock in a folder that every worker of
the run shares, and the others wait for it and reuse what it made.

Kept free of torch so that ``tests/test_once.py`` can run it in small subprocesses.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

#: in the shared folder: one line per time ``make`` was started (the worker's name)
BUILDS = "builds.txt"
DONE, FAILED = "done", "failed.txt"


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``name``'s folder for this run: beside the workers' own temporary folders under xdist (their
    parent, ``pytest-N``, is this run's), in the run's temporary folder without it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / f"{name}-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'main')}"


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 make: Callable[[Path], None]) -> Path:
    """Run ``make(folder)`` once per test run and return ``folder``; every later call, from any
    worker, waits for the first and returns the same folder (a failed ``make`` fails them too,
    with its message, without running it again)."""
    folder = shared_folder(tmp_path_factory, name)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / FAILED).is_file():
            pytest.fail((folder / FAILED).read_text(encoding="utf-8"), pytrace=False)
        if not (folder / DONE).is_file():
            with (folder / BUILDS).open("a", encoding="utf-8") as log:
                log.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\n")
            try:
                make(folder)
            except pytest.skip.Exception:
                raise
            except BaseException as err:
                (folder / FAILED).write_text(f"{name}: {err}", encoding="utf-8")
                raise
            (folder / DONE).write_text("", encoding="utf-8")
    return folder


def builds(folder: Path) -> list[str]:
    """The workers that started ``make`` in ``folder`` (one, once a run is done)."""
    return (folder / BUILDS).read_text(encoding="utf-8").split()
