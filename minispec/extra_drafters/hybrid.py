"""[`HybridDrafter`][minispec.extra_drafters.hybrid.HybridDrafter]: per round and per request, draft
from the context (a suffix match) when it can be trusted, from a feature head otherwise (the
SAM-Decoding recipe: retrieval with an EAGLE fallback).

**The rule.** Each request keeps a running estimate of how many drafts a round accepts, per source:
one number for the head, and one per match length ``m = 1..6+`` for the context (a 6-token match
is much stronger evidence than a 1-token one). A round drafts from the context when it found a
match of at least ``min_match`` tokens and

    (1 + E_context[m]) * (1 + head_cost)  >=  1 + E_head

that is, when the tokens a context round is expected to yield are worth at least those of a head
round, which takes ``1 + head_cost`` times as long (``k`` head forwards, and ``k`` drafts to
verify where a context draft is often shorter). After verify, the source that drafted moves its
estimate: ``E <- (1 - decay) * E + decay * accepted``. A source that does badly loses its
rounds, and wins them back when the other does worse.

**The numbers** (defaults: ``PRIOR_CONTEXT``, ``PRIOR_HEAD``, ``head_cost = 0.3``,
``decay = 0.3``) are what ``benchmarks/suffix.py --calibrate`` measures on SmolLM2-135M-Instruct
with the shipped head: accepted drafts per round by source and match length, and a head round's
cost. With them a match of any length is tried first (the context wins while ``E_context[m] >=
0.04``), and the head drafts when there is no match, or when matches of that length keep failing
(five failures in a row take 0.2 below 0.04). ``decay = 0.3`` weighs about the last three rounds of
that source. A stronger head raises its own estimate as it drafts (at ``E_head = 1`` only matches of
2+ tokens still win) -- the rule stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from minispec.core.sampling import check_args, is_int, is_real
from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal
from minispec.drafters.base import Drafter, Shape
from minispec.drafters.ngram import DRAFTERS, ContextDrafter
from minispec.extra_drafters.suffix import SuffixDrafter
from minispec.models.kv_cache import KVCache
from minispec.models.llama import Llama

__all__ = ["PRIOR_CONTEXT", "PRIOR_HEAD", "HybridDrafter", "Tally"]

#: Drafts a context round is expected to accept after a match of 1, 2, ..., 6+ tokens (k = 4).
PRIOR_CONTEXT: tuple[float, ...] = (0.2, 0.7, 1.6, 2.6, 2.6, 3.2)
#: Drafts a head round is expected to accept (k = 4).
PRIOR_HEAD: float = 0.35


@dataclass
class Tally:
    """One request's running estimates: drafts accepted per round, by source.

    Attributes:
        head: the head's estimate.
        context: the context's, by match length ``1..len(context)`` (the last: that or longer).
    """

    head: float = PRIOR_HEAD
    context: list[float] = field(default_factory=lambda: list(PRIOR_CONTEXT))

    def expected(self, match: int) -> float:
        """The context's estimate after a match of ``match >= 1`` tokens."""
        return self.context[min(match, len(self.context)) - 1]

    def prefers_context(self, match: int, min_match: int, head_cost: float) -> bool:
        """The rule of the module docstring."""
        return match >= min_match and (1 + self.expected(match)) * (1 + head_cost) >= 1 + self.head

    def update(self, source: str, match: int, accepted: int, decay: float) -> None:
        """Move the estimate of the source that drafted towards this round's ``accepted``."""
        if source == "head":
            self.head += decay * (accepted - self.head)
        else:
            i = min(match, len(self.context)) - 1
            self.context[i] += decay * (accepted - self.context[i])


class HybridDrafter(Drafter):
    """Drafts each row from the context or from a feature head, by the rule of the module docstring.

    Every hook that carries features (``observe_prefill``, ``observe``) is forwarded to the head
    for every row, also in rounds where the context drafted: an EAGLE head needs the target's
    features of every committed position, in order, and catches up on the ones it has not fed in
    its next round. Statistics and choices are per request, so a request drafts the same alone as
    in a batch.

    Args:
        context: the context source: a
            [`SuffixDrafter`][minispec.extra_drafters.suffix.SuffixDrafter] (default; its state per
            request shares its store) or a
            [`PromptLookupDrafter`][minispec.drafters.ngram.PromptLookupDrafter], an instance, a
            class or a name (``"suffix"``, ``"prompt_lookup"``).
        head: the drafter used otherwise, normally an
            [`EagleDrafter`][minispec.extra_drafters.eagle.EagleDrafter] (a ``ModelDrafter`` works
            too).
        min_match: shortest context match ever used.
        head_cost: a head round's extra time relative to a context round.
        decay: weight of the newest round in the running estimates.

    Attributes:
        rounds: rounds drafted by each source, all requests (``{"context": .., "head": ..}``).
        accepted: drafts accepted from each source, all requests.
    """

    def __init__(self, context: Any = None, head: Drafter | None = None, *, min_match: int = 1,
                 head_cost: float = 0.3, decay: float = 0.3) -> None:
        check_args("HybridDrafter", [
            ("head", head, isinstance(head, Drafter), "a batched drafter (an EagleDrafter)"),
            ("min_match", min_match, is_int(min_match) and min_match >= 1, "an integer >= 1"),
            ("head_cost", head_cost, is_real(head_cost) and head_cost >= 0, "a finite number >= 0"),
            ("decay", decay, is_real(decay) and 0 < decay <= 1, "a number in (0, 1]")])
        spec = SuffixDrafter() if context is None else context
        source = DRAFTERS.get(spec, spec) if isinstance(spec, str) else spec
        source = source() if isinstance(source, type) else source
        check_args("HybridDrafter", [("context", context, isinstance(source, ContextDrafter),
                                      "a context drafter (a SuffixDrafter or a "
                                      "PromptLookupDrafter)")])
        self.spec, self.context, self.head = spec, source.clone(), head
        self.min_match, self.head_cost, self.decay = min_match, head_cost, decay
        self.wants_hidden, self.model, self.max_seq_len = (head.wants_hidden, head.model,
                                                           head.max_seq_len)
        self.feature_layers = head.feature_layers
        self.tallies: dict[str, Tally] = {}
        self.chosen: dict[str, tuple[str, int]] = {}     # request -> (source, match) this round
        self.rounds = {"context": 0, "head": 0}
        self.accepted = {"context": 0, "head": 0}

    @property
    def forwards(self) -> int:
        """The head's forwards (the context source has no model)."""
        return self.head.forwards

    def attach(self, cache: KVCache, forward: Any = None) -> None:
        """The head keeps its keys and values in ``cache`` (the loops allocate its slots)."""
        self.cache = cache
        self.head.attach(cache, forward)

    def rewind(self, seqs: list[Sequence]) -> None:
        """Both sources forget a failed proposal; so does the rule."""
        for seq in seqs:
            self.chosen.pop(seq.request_id, None)
        self.context.rewind(seqs)
        self.head.rewind(seqs)

    def clone(self) -> HybridDrafter:
        """The same sources and rule, with the head's clone and no request state."""
        return HybridDrafter(self.spec, self.head.clone(), min_match=self.min_match,
                             head_cost=self.head_cost, decay=self.decay)

    def check_target(self, target: Llama) -> None:
        """The head's check (an EAGLE head must be bound to ``target`` itself)."""
        self.head.check_target(target)

    # ------------------------------------------------------------------ the round's hooks

    def propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """The context source proposes for every row (lookups, no model); rows it does not win
        go to the head, in one call. (A row the context wins has drafted: its match is at least
        ``min_match >= 1`` tokens.)"""
        proposals = self.context.propose(seqs, shapes)
        head = [b for b in range(len(seqs)) if self._head_wins(seqs[b], shapes[b], proposals[b])]
        if head:
            drafted = self.head.propose([seqs[b] for b in head], [shapes[b] for b in head])
            for b, proposal in zip(head, drafted, strict=True):
                proposals[b] = proposal
                if proposal.depth == 0:                    # nothing drafted: nothing to learn
                    self.chosen.pop(seqs[b].request_id, None)
        return proposals

    def _head_wins(self, seq: Sequence, shape: Shape, proposal: Proposal) -> bool:
        """Choose the row's source by the rule and remember it (with the length of the match the
        context's ``proposal`` came from, 0 for none); whether the head drafts. A row with no room,
        or whose context drafter failed, chooses nothing."""
        if not shape or seq.is_finished:
            return False
        match = self.context.requests[seq.request_id].last_match if proposal.depth else 0
        tally = self.tallies.setdefault(seq.request_id, Tally())
        context_wins = tally.prefers_context(match, self.min_match, self.head_cost)
        self.chosen[seq.request_id] = ("context" if context_wins else "head", match)
        return not context_wins

    def observe_prefill(self, seqs: list[Sequence], starts: list[int], hidden: list[Tensor] | None
                        ) -> None:
        """The head sees every prefill (its features of the prompt)."""
        self.head.observe_prefill(seqs, starts, hidden)

    def observe(self, seqs: list[Sequence], num_accepted: list[int], hidden: list[Tensor] | None,
                paths: list[list[int]]) -> None:
        """Update the estimate of each row's source; the head sees every row's accepted features,
        whoever drafted."""
        for seq, a in zip(seqs, num_accepted, strict=True):
            if (chosen := self.chosen.pop(seq.request_id, None)) is not None:
                source, match = chosen
                self.tallies[seq.request_id].update(source, match, a, self.decay)
                self.rounds[source] += 1
                self.accepted[source] += a
        self.head.observe(seqs, num_accepted, hidden, paths)

    def release(self, seq: Sequence) -> None:
        """Forget ``seq`` in the rule, the context source and the head."""
        for state in (self.tallies, self.chosen):
            state.pop(seq.request_id, None)
        self.context.release(seq)
        self.head.release(seq)
