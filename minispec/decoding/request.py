"""Requests as both drivers build them, and what a finished one returns.

[`make_sequence`][minispec.decoding.request.make_sequence] turns a user's prompt and limits into a
checked [`Sequence`][minispec.core.sequence.Sequence];
[`as_drafter_for`][minispec.decoding.request.as_drafter_for] turns what a user passes as a drafter
into a [`Drafter`][minispec.drafters.base.Drafter];
[`context_limit`][minispec.decoding.request.context_limit] bounds the context by both models';
[`GenerationResult`][minispec.decoding.request.GenerationResult] is what a finished request
returns, from ``speculative_generate`` and from the ``Engine`` alike. Every check runs before a
cache is made or a forward runs, with the same message in either driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from minispec.core.constraint import make_constraint
from minispec.core.sampling import SamplingParams, is_int
from minispec.core.sequence import Round, Sequence
from minispec.core.stats import SpecStats
from minispec.core.tree import TreeShape, tree_size
from minispec.decoding.runner import DEFAULTS
from minispec.drafters.base import Drafter
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import DRAFTERS
from minispec.drafters.trees import check_branching
from minispec.models.llama import Llama

__all__ = ["GenerationResult", "as_drafter_for", "context_limit", "make_sequence", "prompt_ids"]


@dataclass
class GenerationResult:
    """What a decoding call returns (and what ``Engine.generate`` returns per request).

    Attributes:
        tokens: the new tokens only (the prompt is not repeated).
        text: ``tokens`` decoded (and cut before a stop string), when a tokenizer was given.
        finish_reason: ``"length"`` (max_new_tokens), ``"eos"``, ``"stop"`` (stop token id or
            string), ``"max_seq_len"`` (the context is full), ``"error"`` or ``"abort"`` (engine).
        stats: a [`minispec.core.stats.SpecStats`][minispec.core.stats.SpecStats].
        rounds: every round's drafts and outcome (drawn by
            [`minispec.tools.viz`][minispec.tools.viz]).
        error: what went wrong, for ``finish_reason="error"``.
        k_choices: how ``speculative_generate``'s draft-length policy chose each round's ``k``
            (in ``stats.k_per_round``), one record per round (the goodput policy's
            ``KChoice``); empty with a fixed ``k``. The ``Engine`` keeps its batches' choices
            in ``Engine.k_choices``.
    """

    tokens: list[int]
    text: str | None
    finish_reason: str
    stats: SpecStats
    rounds: list[Round] = field(default_factory=list)
    error: str | None = None
    k_choices: list = field(default_factory=list)

    @classmethod
    def of(cls, seq: Sequence, k_choices: Seq = ()) -> GenerationResult:
        """The result of a finished sequence."""
        return cls(list(seq.generated), seq.text(), seq.finish_reason, seq.stats, seq.rounds,
                   seq.error, list(k_choices))


def make_sequence(request_id: str, target: Llama, prompt: Any, sampling: SamplingParams | None, *,
                  max_new_tokens: Any, max_seq_len: int, k: int, tokenizer=None,
                  stop: str | Seq[str] = (), stop_token_ids: Seq[int] = (),
                  eos_token_id: int | Seq[int] | None = None) -> Sequence:
    """A request as both loops build it: the prompt encoded (ids, text or chat messages), its EOS
    ids (given, or the target config's, plus the chat template's end of turn for messages), its
    grammar (``sampling.json_schema`` or ``sampling.regex``, compiled by a registered factory:
    [`make_constraint`][minispec.core.constraint.make_constraint]), and every check of
    [`Sequence.new`][minispec.core.sequence.Sequence.new].

    Raises:
        ValueError: for a bad request, with the same message in either loop.
    """
    ids, end_of_turn = prompt_ids(prompt, tokenizer)
    eos = target.config.eos_token_ids if eos_token_id is None else eos_token_id   # []: no EOS
    eos = tuple(eos) if isinstance(eos, (list, tuple, set, frozenset)) else (eos,)  # one or several
    eos += end_of_turn
    seq = Sequence.new(request_id, ids, sampling, max_new_tokens=max_new_tokens,
                       max_seq_len=max_seq_len, vocab_size=target.config.vocab_size,
                       eos_token_ids=eos, stop_token_ids=stop_token_ids, stop=stop,
                       tokenizer=tokenizer, k=k, device=target.device)
    seq.constraint = make_constraint(seq.sampling, tokenizer, target.config.vocab_size,
                                     sorted(seq.eos_token_ids))
    return seq


def prompt_ids(prompt: Any, tokenizer: Any) -> tuple[list[Any], tuple[int, ...]]:
    """The prompt's token ids (``Sequence.new`` checks them) and the ids that end its answer
    besides EOS: token ids as given; text and chat messages encoded by ``DEFAULTS.prompts`` (the
    loading wing's [`minispec.loading.prompts`][minispec.loading.prompts]), which also names a
    chat template's end-of-turn token.

    Raises:
        ValueError: text or messages with no encoder installed, or what the encoder refuses.
    """
    if isinstance(prompt, (list, tuple)) and not any(isinstance(t, Mapping) for t in prompt):
        return list(prompt), ()
    if (encoder := DEFAULTS.prompts) is None:
        raise ValueError("a prompt of text or chat messages needs a prompt encoder "
                         "(import minispec); pass token ids")
    end_of_turn = encoder.end_of_turn_ids(tokenizer) if encoder.is_chat(prompt) else ()
    return encoder.encode_prompt(prompt, tokenizer), end_of_turn


def as_drafter_for(spec: Any, k: Any, branching: Any
                   ) -> tuple[Drafter | None, int, tuple[int, ...] | None, int]:
    """What a user passes as a drafter, for chains or (with ``branching``) trees of depth ``k``,
    checked with ``k`` for both loops.

    ``spec`` is ``None`` (plain decoding); a draft [`Llama`][minispec.models.llama.Llama] (made a
    [`ModelDrafter`][minispec.drafters.model.ModelDrafter]); a
    [`Drafter`][minispec.drafters.base.Drafter]; a name in ``DRAFTERS`` (``"ngram"``,
    ``"prompt_lookup"``, ``"suffix"``); or a drafter class or factory (called once). ``k`` must be
    an integer, >= 1 with a drafter (0 allowed without one).

    Returns:
        The drafter (``None``: plain decoding), the ``k`` to draft (0 without a drafter), the
        checked branching (``None``: chains), and the cache positions a round needs beyond a
        chain's ``k + 1`` (a tree is stored past the context before it is compacted).
    """
    if branching is not None and spec is None:
        raise ValueError("branching needs a drafter")
    if isinstance(spec, Llama):
        spec = ModelDrafter(spec)
    if isinstance(spec, str):
        if spec not in DRAFTERS:
            raise ValueError(f"unknown drafter {spec!r}; choose one of {sorted(DRAFTERS)}")
        spec = DRAFTERS[spec]
    if callable(spec) and not isinstance(spec, Drafter):         # a drafter class or a factory
        spec = spec()
    if spec is not None and not isinstance(spec, Drafter):
        raise ValueError(f"{spec!r} is no drafter: a chain or tree drafter is a draft model, a "
                         f"Drafter, a name in {sorted(DRAFTERS)} or a factory making a Drafter")
    low = 0 if spec is None else 1
    if not is_int(k) or k < low:
        raise ValueError(f"k must be an integer >= {low}{' with a drafter' if low else ''}, "
                         f"got {k!r}")
    if branching is None:
        return spec, k if spec is not None else 0, None, 0
    branching = check_branching(branching, k)
    if isinstance(branching, TreeShape) and not spec.dynamic_trees:
        raise ValueError(f"a {type(branching).__name__} is grown from a model's confidence: it "
                         f"needs a draft model or an EAGLE head, not {type(spec).__name__}")
    return spec, k, branching, tree_size(branching) - (k + 1)


def context_limit(target: Llama, drafter: Any, max_seq_len: Any) -> int:
    """The longest prompt + new tokens: ``max_seq_len`` checked against both models' context.

    Also checks that a draft model shares the target's token ids. ``ValueError`` when it is not an
    integer in ``[1, max_position_embeddings]``.
    """
    limit = target.config.max_position_embeddings
    if max_seq_len is not None and not (is_int(max_seq_len) and 1 <= max_seq_len <= limit):
        raise ValueError(f"max_seq_len must be an integer in [1, {limit}] (the target's context), "
                         f"got {max_seq_len!r}")
    if drafter is not None:
        drafter.check_target(target)
        limit = min(limit, drafter.max_seq_len or limit)
    return min(limit, max_seq_len or limit)
