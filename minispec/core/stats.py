"""Statistics of a speculative decoding run, returned as data so lessons and tests can assert on
them.

Two acceptance numbers are easy to confuse:

* ``acceptance_rate`` estimates ``alpha``: accepted drafts divided by drafts actually *tested*
  (a round tests its drafts up to and including the first rejection). Under Leviathan's i.i.d.
  assumption each test succeeds with probability ``alpha``, so this is the natural estimator.
* ``draft_efficiency``: accepted drafts divided by drafts *proposed*. It is lower, because drafts
  after the first rejection are thrown away untested: its expectation is
  ``theory.expected_accepted(alpha, k) / k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecStats"]


@dataclass
class SpecStats:
    """Counters of one generation (one request).

    Attributes:
        k: the draft length asked for (0 for plain decoding): the upper bound when a policy
            chooses each round's.
        k_per_round: the draft length each round asked for (the policy's choice, shrunk near the
            request's limits; 0: a plain round).
        drafted_per_round: drafts proposed in each round (can be < k: near ``max_seq_len``, or an
            n-gram drafter with nothing to say).
        accepted_per_round: drafts accepted in each round.
        target_forwards: target forwards after the prefill (one per round).
        draft_forwards: draft-model forwards (0 for n-gram drafters).
        new_tokens: tokens emitted (after any stop condition cut a round short).
        preemptions: times the engine preempted this request (its cache was dropped and rebuilt).
        accepted: drafts accepted, all rounds together.
        tested: drafts the target tested (the accepted ones plus each round's first rejection).
    """

    k: int = 0
    k_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    new_tokens: int = 0
    preemptions: int = 0
    accepted: int = 0
    tested: int = 0

    def record_round(self, drafted: int, accepted: int) -> None:
        """Add one round: ``drafted`` proposals, ``accepted`` of them kept, one target forward."""
        self.drafted_per_round.append(drafted)
        self.accepted_per_round.append(accepted)
        self.accepted += accepted
        self.tested += accepted + (accepted < drafted)
        self.target_forwards += 1

    @property
    def rounds(self) -> int:
        """Number of draft-verify rounds (target forwards after the prefill)."""
        return len(self.accepted_per_round)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / tested drafts: the estimate of ``alpha`` (NaN when nothing was drafted)."""
        return self.accepted / self.tested if self.tested else float("nan")

    @property
    def draft_efficiency(self) -> float:
        """Accepted / proposed drafts: the fraction of drafting work that was kept."""
        drafted = sum(self.drafted_per_round)
        return sum(self.accepted_per_round) / drafted if drafted else float("nan")

    @property
    def per_position_acceptance(self) -> list[float]:
        """For draft position ``i = 1..k``: P(draft i accepted | drafts 1..i-1 accepted, i
        proposed).

        Under the i.i.d. assumption every entry estimates the same ``alpha``.
        """
        k = max(self.drafted_per_round, default=0)
        rounds = list(zip(self.accepted_per_round, self.drafted_per_round, strict=True))
        rates = []
        for i in range(1, k + 1):
            reached = [a for a, d in rounds if d >= i and a >= i - 1]
            rates.append(sum(a >= i for a in reached) / len(reached) if reached else float("nan"))
        return rates

    @property
    def mean_tokens_per_round(self) -> float:
        """Mean tokens a round yields (accepted + 1), the quantity of Equation (1)."""
        return 1 + sum(self.accepted_per_round) / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        """Emitted tokens per target forward after the prefill (1.0 for plain decoding)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else float("nan")

    def summary(self) -> str:
        """One line for terminals: tokens per target forward and, with drafts, the acceptance
        (counts only: whoever runs the decoding owns the clock)."""
        line = (f"{self.new_tokens} tokens in {self.rounds} target forwards "
                f"({self.tokens_per_target_forward:.2f} tokens/forward), k={self.k}")
        return line + (f", acceptance {self.acceptance_rate:.3f}" if self.tested
                       else ", no draft tested")
