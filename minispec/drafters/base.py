"""The ``Drafter`` interface: every call the round makes to whoever proposes drafts.

Both decoding loops ([`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate]
for one sequence, the [`Engine`][minispec.serving.engine.Engine] for many) talk to a drafter only
through these calls, in this order:

* ``check_target``, ``clone`` and (a drafter with a ``model``) ``attach(cache, forward)``;
* ``observe_prefill(seqs, starts, hidden)`` after the target prefilled a prompt (or a chunk);
* ``propose(seqs, shapes) -> list[Proposal]`` -- row ``b`` guesses after ``seqs[b].context`` in
  the shape ``shapes[b]``: an ``int`` ``k`` asks for a chain of up to ``k`` drafts, a tuple
  ``(b_1, .., b_k)`` for a tree with ``b_t`` children per node at depth ``t``. Each draw carries
  the distribution ``q`` it came from (``None`` for a deterministic drafter: verify treats that as
  one-hot ``q``, and sampling stays exact);
* ``rewind(seqs)`` -- only when a batched ``propose`` raised: forget what it drafted for these
  rows, which the round then asks again in smaller groups (a failing row fails alone);
* ``observe(seqs, num_accepted, hidden, paths)`` -- after verify: how many drafts each row kept
  and, for a drafter with ``wants_hidden = True``, the target's last hidden states at the
  *accepted* positions only (a rejected draft's state never reaches a drafter);
* ``release(seq)`` -- the request is gone: drop what is kept for it.

Every call has a no-op default, so a drafter overrides only what it needs. The drafters of the
core: a draft model ([`ModelDrafter`][minispec.drafters.model.ModelDrafter], built on
[`ModelBackedDrafter`][minispec.drafters.model.ModelBackedDrafter], the machinery of any drafter
that owns a model and a KV cache) and the context drafters of
[`minispec.drafters.ngram`][minispec.drafters.ngram] (n-gram tables, prompt lookup).
"""

from __future__ import annotations

from typing import Any

from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal, TreeShape

__all__ = ["Drafter", "Shape", "keeps_cache"]

#: What a row drafts: ``k``, a chain of up to ``k`` drafts, or a branching ``(b_1, .., b_k)``, a
#: tree with ``b_t`` children per node at depth ``t`` (``()``: nothing), or a ``TreeShape`` that
#: the drafter grows itself (a dynamic tree).
Shape = int | tuple[int, ...] | TreeShape


class Drafter:
    """Who proposes drafts: the calls the round makes (module docstring), with no-op defaults.

    Attributes:
        wants_hidden: give ``observe`` (and ``observe_prefill``) the target's final-normed hidden
            states; a feature head (EAGLE) needs them, other drafters do not.
        feature_layers: with ``wants_hidden``, the target layers whose input streams to hand over
            instead, concatenated (``Llama.forward``'s ``return_hidden``); ``None``: the
            final-normed states.
        model: a model whose KV cache the loop makes and hands over with ``attach``; ``None``
            for a drafter without one.
        cache: that cache, once attached.
        max_seq_len: longest context the drafter can draft for (``None``: no limit of its own).
        forwards: drafter forwards so far (batched; lazy prefills included).
        dynamic_trees: can grow a [`TreeShape`][minispec.core.tree.TreeShape] (a drafter whose
            own model scores its nodes).
    """

    wants_hidden: bool = False
    feature_layers: tuple[int, ...] | None = None
    model: Any = None
    cache: Any = None
    max_seq_len: int | None = None
    forwards: int = 0
    dynamic_trees: bool = False

    def check_target(self, target: Any) -> None:
        """``ValueError`` if this drafter cannot draft for ``target`` (default: it can)."""

    def clone(self) -> Drafter:
        """A fresh drafter with no request state and no cache (an engine owns its own)."""
        return self

    def attach(self, cache: Any, forward: Any = None) -> None:
        """Keep keys and values in ``cache``, running chain steps through ``forward`` (a
        ``forward(model, cache)`` collaborator; ``None``: eagerly). Called when ``model`` is set."""
        self.cache = cache

    def observe_prefill(self, seqs: list[Sequence], starts: list[int], hidden: list | None
                        ) -> None:
        """The target prefilled positions ``starts[b]..`` of row ``b``; ``hidden[b]`` is their
        ``(T_b, D)`` features when ``wants_hidden`` (else ``None``)."""

    def propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """Row ``b``'s guesses after ``seqs[b].context`` in the shape ``shapes[b]``; a row whose
        drafting fails alone is failed (``seq.fail``) and proposes the root alone. Default: no
        guesses (every round is a plain step)."""
        return [Proposal.chain([]) for _ in seqs]

    def rewind(self, seqs: list[Sequence]) -> None:
        """Forget what a ``propose`` that raised drafted for ``seqs`` (the round retries them)."""

    def observe(self, seqs: list[Sequence], num_accepted: list[int], hidden: list | None,
                paths: list[list[int]]) -> None:
        """What verify kept in each row: ``num_accepted[b]`` drafts, the tree nodes ``paths[b]``
        (a chain's: ``1..a``), and with ``wants_hidden`` the target's ``(a_b + 1, D)`` features
        of the root and the accepted nodes only."""

    def release(self, seq: Sequence) -> None:
        """Forget ``seq`` (finished or aborted)."""


def keeps_cache(drafter: Drafter | None) -> bool:
    """Whether ``drafter`` keeps keys and values in a cache the decoding loop makes and manages
    (a draft model, an EAGLE head): its ``model`` gives the cache's shape."""
    return drafter is not None and drafter.model is not None
