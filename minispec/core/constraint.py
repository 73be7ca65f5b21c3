"""A grammar on a request, as the round sees it: four calls, no compiler.

A request may carry a [`Constraint`][minispec.core.constraint.Constraint] (``Sequence.constraint``).
The round masks the target's ``p`` and the draft's ``q`` with the same ``mask(path)`` at every
draft position, proposes the tokens the grammar ``forced`` as free drafts, and ``commit``s only
the accepted tokens, so whatever a path explored is rolled back with the caches. Nothing here
compiles a grammar: a wing registers a factory in ``FACTORIES`` (the facade does,
[`minispec.grammar`][minispec.grammar]) and request building calls
[`make_constraint`][minispec.core.constraint.make_constraint].
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["FACTORIES", "Constraint", "ask", "make_constraint"]

#: ``factory(sampling, tokenizer, vocab_size, eos_token_ids) -> Constraint | None``, tried in order.
FACTORIES: list = []


class Constraint:
    """The no-op constraint: every token allowed, nothing forced, never finished."""

    def mask(self, path: list[int]) -> Tensor | None:
        """``(V,)`` bool: the tokens allowed after the committed tokens and ``path``; None: all."""
        return None

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces after the committed tokens ([] if none)."""
        return []

    def commit(self, tokens: list[int]) -> None:
        """The round accepted ``tokens``: advance the committed state."""

    @property
    def finished(self) -> bool:
        """The grammar accepts no more tokens (the request stops with ``"grammar"``)."""
        return False


def ask(seq: Any, call: str, *args: Any) -> Any:
    """``seq.constraint.<call>(*args)`` for the round; ``None`` without a constraint, for a finished
    request, or when the grammar raises ``ValueError``: then that request alone fails."""
    if seq.constraint is None or seq.is_finished:
        return None
    try:
        return getattr(seq.constraint, call)(*args)
    except ValueError as error:
        seq.fail(error)
        return None


def make_constraint(sampling: Any, tokenizer: Any, vocab_size: int,
                    eos_token_ids: Any) -> Constraint | None:
    """The request's constraint from ``sampling.json_schema`` / ``sampling.regex``, or None.

    Raises:
        ValueError: a grammar was asked for but no factory is registered, or a factory refused it.
    """
    if getattr(sampling, "json_schema", None) is None and getattr(sampling, "regex", None) is None:
        return None
    for factory in FACTORIES:
        if (constraint := factory(sampling, tokenizer, vocab_size, eos_token_ids)) is not None:
            return constraint
    raise ValueError("json_schema and regex need the grammar wing: pip install minispec[grammar]")
