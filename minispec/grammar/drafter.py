"""The drafter of forced tokens alone: a grammar's free drafts, and no guess of its own."""

from __future__ import annotations

from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal
from minispec.drafters.base import Drafter, Shape

__all__ = ["ForcedDrafter"]


class ForcedDrafter(Drafter):
    """Proposes nothing itself: the round drafts what a row's grammar forces
    (``seq.constraint.forced(k)``, one-hot ``q``) before it asks a drafter, so with this one a
    constrained row speculates exactly the spans its grammar forces (keys, quotes, braces) and
    decodes the rest one token a forward. An unconstrained row decodes plainly."""

    def propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """The root alone for every row the round asks (it asks only rows nothing is forced for)."""
        return [Proposal.chain([]) for _ in seqs]
