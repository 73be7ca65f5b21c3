"""Where a round's time goes: a draft-length policy that times each phase.

The core has no clock. [`TimedRounds`][minispec.speed.timing.TimedRounds] is the fixed-``k``
policy with one: every round drafts its cap, as with
[`FixedK`][minispec.decoding.runner.FixedK], and the seconds between the round's marks
(``time.perf_counter``) add up per phase, for benchmarks that ask what a draft step costs
against a verify.
"""

from __future__ import annotations

import time

from minispec.core.sequence import Sequence
from minispec.decoding.runner import FixedK, SpeculativeRunner

__all__ = ["PHASES", "TimedRounds"]

#: The round's phases, in order (``SpeculativeRunner.round`` marks the end of each).
PHASES = ("draft", "score", "rollback", "emit")


class TimedRounds(FixedK):
    """``FixedK`` with a wall clock on every phase.

    Attributes:
        seconds: phase -> seconds over every round run so far.
        rounds: rounds run so far.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.rounds = 0

    def round(self, runner: SpeculativeRunner, seqs: list[Sequence], caps: list[int]
              ) -> list[list[int]]:
        """Run the round with each row's cap, adding each phase's seconds."""
        last = [time.perf_counter()]

        def mark(phase: str) -> None:
            now = time.perf_counter()
            self.seconds[phase] += now - last[0]
            last[0] = now

        self.rounds += 1
        return runner.round(seqs, caps, mark=mark)
