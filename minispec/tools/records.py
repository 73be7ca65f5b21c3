"""The benchmark records: one way to write a measurement, one way to read it back.

A record is a JSON file whose every run says where and how it was measured: the ``machine`` (the
CPU model or GPU, its cores, the torch threads, the torch version and the ``clock``: ``wall``, or
``cpu``, this process's CPU time), the ``commit`` and the ``command`` that made it, and the
``date``. [`stamp`][minispec.tools.records.stamp] makes those fields;
[`write`][minispec.tools.records.write] writes a payload with them.

The records the site, the README and the lessons quote ship inside the package
(``minispec/tools/measured/``), so [`load`][minispec.tools.records.load] reads them from an
installed wheel as from a checkout:

* ``cpu``: ``minispec/tools/measured/cpu.json``, the CPU runs (each with its own machine, clock,
  command and commit);
* ``gpu``: ``minispec/tools/measured/gpu.json``, what ``benchmarks/gpu.py`` writes on a GPU (absent
  until one is recorded);
* ``card`` and ``eagle``: the shipped pair's model card and the shipped EAGLE head's record, in
  ``minispec/zoo``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["FOLDER", "SOURCES", "load", "machine", "path", "stamp", "value", "write"]

#: where the measured records live, inside the package
FOLDER = Path(__file__).resolve().parent / "measured"
_ZOO = Path(__file__).resolve().parents[1] / "zoo"
#: the records that are not in ``FOLDER``: source name -> file
SOURCES = {"card": _ZOO / "model_card.json",
           "eagle": _ZOO / "smollm2-135m-instruct-eagle" / "eagle_config.json"}


def path(source: str) -> Path:
    """The file of a record: ``FOLDER / "{source}.json"``, or the zoo's for ``card`` and
    ``eagle``."""
    return SOURCES.get(source, FOLDER / f"{source}.json")


def load(source: str = "cpu") -> dict:
    """A record by its source name (``cpu``, ``gpu``, ``card`` or ``eagle``).

    Raises:
        FileNotFoundError: no such record is recorded (``gpu`` before a GPU run is committed).
    """
    return json.loads(path(source).read_text(encoding="utf-8"))


def value(source: str, keys: str, spec: str | None = None) -> str:
    """One value of a record: ``keys`` joined by ``/`` (an item of a list by its index),
    formatted by ``spec``; a list (a range measured over runs) as ``low-high``.

    Raises:
        KeyError: ``keys`` names nothing in the record.
    """
    node = load(source)
    for key in keys.strip().split("/"):
        index = re.fullmatch(r"-?\d+", key)
        if isinstance(node, list) and index and -len(node) <= int(key) < len(node):
            node = node[int(key)]
            continue
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"the {source} record has no {keys!r} (no key {key!r})")
        node = node[key]
    if isinstance(node, list):
        return "-".join(format(x, spec.strip()) if spec else str(x) for x in node)
    return format(node, spec.strip()) if spec else str(node)


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(clock: str, load: str | None = None) -> dict:
    """What a measurement ran on and how it was timed.

    Args:
        clock: ``"wall"`` or ``"cpu"`` (this process's CPU time), the clock the times were read
            from.
        load: what else the machine was running, in words, if known.

    Returns:
        ``device`` (the GPU's name where CUDA is used, else the CPU model), ``cores``,
        ``threads`` (torch's), ``torch``, ``platform``, ``clock``, ``cuda`` (the CUDA version,
        where CUDA is used) and ``load`` (if given).
    """
    cuda = torch.cuda.is_available()
    found = {"device": torch.cuda.get_device_name() if cuda else _cpu_model(),
             "cores": os.cpu_count(), "threads": torch.get_num_threads(),
             "torch": torch.__version__, "platform": platform.platform(), "clock": clock}
    return found | ({"cuda": torch.version.cuda} if cuda else {}) | ({"load": load} if load else {})


def _commit() -> str | None:
    """The checkout's ``git rev-parse HEAD``, or ``None`` outside one (an installed wheel)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _command() -> str:
    """This process's command line as a person would type it."""
    first = Path(sys.argv[0])
    if first.name == "__main__.py":
        head = f"python -m {first.parent.name}"
    elif first.suffix == ".py":
        where, here = first.resolve(), Path.cwd()
        head = f"python {where.relative_to(here) if where.is_relative_to(here) else first}"
    else:
        head = first.name
    return " ".join([head, shlex.join(sys.argv[1:])]).strip()


def stamp(clock: str, command: str | None = None, load: str | None = None) -> dict:
    """The fields every run of a record carries: ``machine`` (see
    [`machine`][minispec.tools.records.machine]), ``commit``, ``command`` (default: this
    process's command line) and ``date`` (UTC, ISO 8601)."""
    return {"machine": machine(clock, load), "commit": _commit(),
            "command": command if command is not None else _command(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write(file: str | Path, payload: dict, clock: str, command: str | None = None) -> Path:
    """Write ``payload`` with its [`stamp`][minispec.tools.records.stamp] as JSON to ``file``
    (its folder made if need be); returns the path."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(stamp(clock, command) | payload, indent=2, default=str) + "\n",
                    encoding="utf-8")
    return file
