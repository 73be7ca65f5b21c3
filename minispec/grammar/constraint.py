"""A request's grammar on llguidance's matcher: masks along a path, forced tokens, commits.

The matcher holds the *committed* state: the tokens the request has kept. ``mask(path)`` consumes
the drafts of ``path`` into it, reads the mask of allowed tokens and rolls the drafts back -- the
grammar's rollback, beside the caches'. Masks are remembered per path until the next commit, so
the round's draft phase and its verify share them. ``commit`` consumes for real.

EOS: allowed exactly where the grammar may end (llguidance puts it in the mask of an accepting
state, and it is all a finished grammar allows); after an EOS in a path only EOS is allowed (the
request stops there anyway).
"""

from __future__ import annotations

import json
import time
import weakref
from typing import Any

import torch
from torch import Tensor

from minispec.core.constraint import Constraint

__all__ = ["JSON_STYLE", "GrammarConstraint", "compile_grammar", "constraint_for", "llg_tokenizer"]

#: JSON as ``json.dumps`` writes it, no other whitespace (a schema's ``x-guidance`` may override):
#: one text per value, so keys, quotes and separators are forced.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # HF tokenizer -> its own


class GrammarConstraint(Constraint):
    """A [`Constraint`][minispec.core.constraint.Constraint] on an ``llguidance.LLMatcher``.

    Args:
        matcher: a fresh matcher of the request's grammar (nothing consumed).
        vocab_size: ``V``, the target's vocabulary (the mask's length).
        eos_token_ids: the request's EOS ids (the only tokens allowed after an EOS).
        force: propose forced tokens (``forced``); ``False``: never (for comparisons).

    Attributes:
        seconds: process CPU time spent in the grammar (masks, forced tokens, commits).
        masks_computed: masks computed (a remembered one is not counted again).
    """

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: list[int],
                 force: bool = True) -> None:
        self.matcher, self.vocab_size, self.force = matcher, vocab_size, force
        self.eos = torch.zeros(vocab_size, dtype=torch.bool)
        self.eos[list(eos_token_ids)] = True
        self.eos_token_ids = set(eos_token_ids)
        self._masks: dict[tuple[int, ...], Tensor] = {}
        self._forced: list[int] | None = None
        self.seconds, self.masks_computed = 0.0, 0

    def mask(self, path: list[int]) -> Tensor:
        """``(V,)`` bool: the tokens allowed after the committed tokens and ``path``.

        Raises:
            ValueError: ``path`` holds a token the grammar forbids (a draft that was never masked).
        """
        key = tuple(path)
        if (known := self._masks.get(key)) is not None:
            return known
        t0 = time.process_time()
        end = next((i for i, t in enumerate(path) if t in self.eos_token_ids), len(path))
        consumed = self.matcher.try_consume_tokens(list(path[:end]))
        if consumed < end:
            self.matcher.rollback(consumed)
            raise ValueError(f"the grammar forbids draft {path[consumed]} after {path[:consumed]}")
        if end < len(path):                                  # past an EOS: only EOS again
            allowed = self.eos
        else:
            bias = self.matcher.compute_logit_bias()         # one byte a token: 0 or 200
            allowed = torch.frombuffer(bytearray(bias), dtype=torch.uint8)[: self.vocab_size] != 0
        self.matcher.rollback(consumed)                      # back to the committed state
        self._masks[key] = allowed
        self.seconds += time.process_time() - t0
        self.masks_computed += 1
        return allowed

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (llguidance's fast-forward tokens)."""
        if not self.force or limit <= 0:
            return []
        if self._forced is None:
            t0 = time.process_time()
            self._forced = list(self.matcher.compute_ff_tokens())
            self.seconds += time.process_time() - t0
        return self._forced[:limit]

    def commit(self, tokens: list[int]) -> None:
        """Consume the accepted ``tokens`` for real; forget the remembered masks.

        Raises:
            ValueError: the grammar refuses one of them.
        """
        t0 = time.process_time()
        if not self.matcher.consume_tokens(list(tokens)):
            raise ValueError(f"the grammar refuses tokens {tokens}: {self.matcher.get_error()}")
        self._masks.clear()
        self._forced = None
        self.seconds += time.process_time() - t0

    @property
    def finished(self) -> bool:
        """The grammar allows nothing but EOS any more (``is_stopped``)."""
        return bool(self.matcher.is_stopped())


def llg_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (about a second for a 49k vocabulary;
    made once per tokenizer and EOS set).

    Raises:
        ValueError: naming ``tokenizer``, when there is none or llguidance cannot read it.
    """
    if tokenizer is None:
        raise ValueError("tokenizer: a grammar (json_schema or regex) needs the target's tokenizer")
    import llguidance.hf

    key = (vocab_size, tuple(eos_token_ids))
    try:
        made = _TOKENIZERS.setdefault(tokenizer, {})
    except TypeError:                                        # not weakly referable: no cache
        made = {}
    if key not in made:
        try:
            made[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                     eos_token=list(eos_token_ids) or None)
        except Exception as error:          # not a fast tokenizer, more tokens than V, ...
            raise ValueError(f"tokenizer: llguidance cannot read {type(tokenizer).__name__} "
                             f"({error}); a grammar needs a Hugging Face fast tokenizer") from None
    return made[key]


def compile_grammar(json_schema: str | None, regex: str | None, llg_tok: Any) -> str:
    """The llguidance grammar of a schema or a regex, validated against the tokenizer.

    Raises:
        ValueError: naming the field: unparsable JSON, a schema keyword llguidance does not
            support, an invalid regex.
    """
    from llguidance import LLMatcher

    field, text = ("json_schema", json_schema) if json_schema is not None else ("regex", regex)
    try:
        if field == "json_schema":
            json.loads(json_schema)
            grammar = LLMatcher.grammar_from_json_schema(json_schema, defaults=JSON_STYLE)
        else:
            grammar = LLMatcher.grammar_from_regex(regex)
    except ValueError as error:                              # json.JSONDecodeError included
        raise ValueError(f"{field}: cannot parse {text!r}: {error}") from None
    if message := LLMatcher.validate_grammar(grammar, llg_tok):
        raise ValueError(f"{field}: {message.strip()} (in {text!r})")
    return grammar


def constraint_for(sampling: Any, tokenizer: Any, vocab_size: int, eos_token_ids: list[int],
                   force: bool = True) -> GrammarConstraint | None:
    """The core's factory: a request's ``GrammarConstraint`` from ``sampling.json_schema`` or
    ``sampling.regex`` (``None`` when it has neither), checked before any work.

    Raises:
        ValueError: naming the field (see ``compile_grammar``, ``llg_tokenizer``), or a grammar
            that no text can meet.
    """
    if sampling.json_schema is None and sampling.regex is None:
        return None
    from llguidance import LLMatcher

    llg_tok = llg_tokenizer(tokenizer, vocab_size, eos_token_ids)
    grammar = compile_grammar(sampling.json_schema, sampling.regex, llg_tok)
    constraint = GrammarConstraint(LLMatcher(llg_tok, grammar, log_level=0), vocab_size,
                                   eos_token_ids, force)
    first = constraint.mask([])
    if not constraint.matcher.is_accepting() and not bool((first & ~constraint.eos).any()):
        field = "json_schema" if sampling.json_schema is not None else "regex"
        raise ValueError(f"{field}: no text meets {sampling.json_schema or sampling.regex!r}")
    return constraint
