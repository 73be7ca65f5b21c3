"""Constraints: a grammar on a request (JSON schema, regex), and speculation that stays exact.

A wing: the core never imports it. It provides the per-request collaborator the round calls,
a [`Constraint`][minispec.core.constraint.Constraint]: here a
[`GrammarConstraint`][minispec.grammar.constraint.GrammarConstraint] built on llguidance's matcher
(``pip install 'minispec[grammar]'``). The facade registers
[`constraint_for`][minispec.grammar.constraint.constraint_for] in the core's hook, so a request
whose ``SamplingParams`` has ``json_schema`` or ``regex`` gets one in either loop.

Under a grammar the target's law is ``p`` masked to the allowed tokens and renormalized, at every
position; the draft's ``q`` gets the same mask from the same grammar state, verify walks the masked
``p``, and the grammar commits only accepted tokens -- what a rejected path explored is rolled
back where the caches are. Tokens the grammar forces (keys, quotes, braces) are proposed as
drafts with one-hot ``q`` ([`ForcedDrafter`][minispec.grammar.drafter.ForcedDrafter] drafts
nothing else), so greedy output is constrained greedy output token for token and sampled output
has the masked law.
"""

from minispec.grammar.constraint import GrammarConstraint, constraint_for
from minispec.grammar.drafter import ForcedDrafter

__all__ = ["ForcedDrafter", "GrammarConstraint", "constraint_for"]
