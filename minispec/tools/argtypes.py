"""``type=`` functions for the command lines' numeric flags: one per kind of value.

Each turns a flag's text into a value or raises ``argparse.ArgumentTypeError``, which argparse
prints as one line (``prog: error: argument --threads: must be ..., got '0'``) before exiting
with status 2. ``minispec`` (``minispec.tools.cli``), ``minispec bench costs``
(``minispec.tools.costs``) and the training recipes share them.
"""

from __future__ import annotations

import argparse
import math
import os

from minispec.drafters.trees import MAX_TREE_NODES

__all__ = ["MAX_DRAFTS", "MAX_SAMPLES", "MAX_THREADS", "non_negative_int", "positive_int",
           "positive_int_list", "probability", "sample_count", "thread_count"]

#: The most ``--threads`` a command accepts: four per CPU of this machine. More threads than
#: cores only slow a step down, and a huge count makes torch crash (``--threads 99999`` ended in
#: a segmentation fault).
MAX_THREADS = 4 * (os.cpu_count() or 1)
#: The largest draft length a list of them (``--ks``) may hold: a round of ``k`` drafts is a tree
#: of ``k + 1`` nodes, and a tree holds at most ``MAX_TREE_NODES``.
MAX_DRAFTS = MAX_TREE_NODES - 1
#: The most draws ``minispec demo --samples`` makes: a million take about two minutes (20,000,
#: the default, a few seconds).
MAX_SAMPLES = 1_000_000


def _integer(text: str, allowed: str, low: int, high: float = math.inf) -> int:
    """``text`` as an integer in ``[low, high]``; else an error that says ``allowed``."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count: an integer >= 1."""
    return _integer(text, "an integer >= 1", 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a number of warm-up repeats, a largest k that may be 0)."""
    return _integer(text, "an integer >= 0", 0)


def thread_count(text: str) -> int:
    """``--threads``: an integer in ``1..MAX_THREADS``."""
    return _integer(text, f"an integer from 1 to {MAX_THREADS} (4 per CPU of this machine)", 1,
                    MAX_THREADS)


def sample_count(text: str) -> int:
    """``--samples``: an integer in ``1..MAX_SAMPLES``."""
    return _integer(text, f"an integer from 1 to {MAX_SAMPLES:,} (a million draws take about two "
                    "minutes)", 1, MAX_SAMPLES)


def probability(text: str) -> float:
    """A real number in ``[0, 1]`` (an acceptance rate)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:                     # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a real number in [0, 1], got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """Draft lengths as ``"1-8"`` (a range, both ends included) or ``"1,2,4"``: integers in
    ``1..MAX_DRAFTS``, each range's ends checked before it is built."""
    allowed = f"integers from 1 to {MAX_DRAFTS} as a range or a list, e.g. 1-8 or 2,4"
    values: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            ends = [int(lo), int(hi)] if hi else [int(lo)]
            if not all(1 <= end <= MAX_DRAFTS for end in ends):
                raise ValueError(part)
            values += range(ends[0], ends[-1] + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
    return values
