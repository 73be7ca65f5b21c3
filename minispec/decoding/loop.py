"""Single-sequence decoding: plain ``generate`` and ``speculative_generate`` (Leviathan
Algorithm 1).

The loop drives the same round as the [`Engine`][minispec.serving.engine.Engine] --
[`SpeculativeRunner.round`][minispec.decoding.runner.SpeculativeRunner.round] on a batch of one,
with the same draft-length policy (goodput ``k``, the default for chains in both) -- so the two
cannot drift apart:

1. **draft**: the drafter guesses ``k`` tokens after the context (with the ``q`` of each);
2. **verify**: one target forward scores ``[last, d_1..d_k]`` and the accept rule keeps a prefix of
   the drafts plus one token from the target (a correction or the bonus);
3. **roll back**: both caches forget the rejected drafts;
4. **emit**: the tokens are appended until a stop rule fires (EOS, stop id or string, budget,
   context), even in the middle of an accepted block.

Plain decoding is the special case with no drafter (``k = 0``): every round is one target step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from minispec.core.constraint import make_constraint
from minispec.core.sampling import SamplingParams, is_int
from minispec.core.sequence import Round, Sequence
from minispec.core.stats import SpecStats
from minispec.core.tree import DynamicTree, tree_size
from minispec.decoding.goodput import KChoice, policy_for, run_round
from minispec.decoding.runner import SpeculativeRunner
from minispec.drafters.base import Drafter, ModelDrafter, keeps_cache
from minispec.drafters.suffix import DRAFTERS
from minispec.drafters.trees import check_branching
from minispec.models.chat import encode_prompt, end_of_turn_ids, is_chat
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama

__all__ = ["GenerationResult", "Round", "context_limit", "generate",
           "make_sequence", "speculative_generate"]


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
        k_choices: how ``speculative_generate``'s policy chose each round's ``k`` (in
            ``stats.k_per_round``): one [`KChoice`][minispec.decoding.goodput.KChoice] per round,
            with the acceptance and proposal-rate estimates it used and the predicted goodput
            of every plan it considered. Empty with a fixed ``k``; the ``Engine`` keeps its
            batches' choices in ``Engine.k_choices``.
    """

    tokens: list[int]
    text: str | None
    finish_reason: str
    stats: SpecStats
    rounds: list[Round] = field(default_factory=list)
    error: str | None = None
    k_choices: list[KChoice] = field(default_factory=list)

    @classmethod
    def of(cls, seq: Sequence, k_choices: Seq[KChoice] = ()) -> GenerationResult:
        """The result of a finished sequence."""
        return cls(list(seq.generated), seq.text(), seq.finish_reason, seq.stats, seq.rounds,
                   seq.error, list(k_choices))


def generate(model: Llama, prompt_ids: Any, max_new_tokens: int = 64,
             sampling: SamplingParams | None = None, **kwargs) -> GenerationResult:
    """Plain autoregressive decoding: one target forward per token.

    Args and keyword arguments: as
    [`speculative_generate`][minispec.decoding.loop.speculative_generate], without a drafter.
    """
    return speculative_generate(model, None, prompt_ids, max_new_tokens, k=0, sampling=sampling,
                                **kwargs)


@torch.inference_mode()
def speculative_generate(target: Llama, drafter: Any, prompt_ids: Any, max_new_tokens: int = 64,
                         k: int = 4, sampling: SamplingParams | None = None, *, tokenizer=None,
                         stop: str | Seq[str] = (), stop_token_ids: Seq[int] = (),
                         eos_token_id: int | Seq[int] | None = None,
                         max_seq_len: int | None = None, branching: Seq[int] | None = None,
                         adaptive: bool = False, graphs: bool | None = None) -> GenerationResult:
    """Speculative decoding of one sequence (Leviathan et al. 2023, Algorithm 1).

    Args:
        target: the target model ``p``.
        drafter: a draft [`Llama`][minispec.models.llama.Llama], a
            [`Drafter`][minispec.drafters.base.Drafter] (``ModelDrafter``, ``NGramDrafter``,
            ``PromptLookupDrafter``, ...) or a class or factory making one, a name (``"ngram"``,
            ``"prompt_lookup"``, ``"suffix"``), or ``None`` for plain decoding.
        prompt_ids: prompt token ids, a string or chat messages ``[{"role": ..., "content": ...}]``
            (both need ``tokenizer``; messages are rendered with its chat template, and decoding
            also stops at the template's end-of-turn token).
        max_new_tokens: at most this many new tokens (an integer >= 0).
        k: drafts per round (gamma), an integer >= 1 with a drafter; shrunk near ``max_seq_len``.
        sampling: the adjustments applied to both models' logits and the seed of the one
            ``torch.Generator`` of this call (default: greedy).
        tokenizer: a Hugging Face tokenizer to encode the prompt, decode the result and match
            stop strings.
        stop: a stop string or several (need ``tokenizer``); the text is cut before the first.
        stop_token_ids: extra token ids that end the sequence (kept in ``tokens``).
        eos_token_id: end-of-sequence id(s); default: the target config's; ``[]`` disables EOS.
        max_seq_len: limit on prompt + new tokens, in ``[1, max_position_embeddings]``.
        branching: draft a tree instead of a chain: children per node at each depth, e.g.
            ``(3, 2, 1, 1)`` (``k`` is the depth), all verified in one target forward with tree
            attention, by the same round as a chain (every drafter draws trees; see
            [`minispec.drafters.trees`][minispec.drafters.trees]), or a
            [`DynamicTree`][minispec.core.tree.DynamicTree] (a draft model or an EAGLE head:
            the tree EAGLE-2 grows from the drafter's confidence). ``None``: the chain of
            Algorithm 1.
        adaptive: ``False`` (the default): every round drafts ``k`` (shrunk only near
            ``max_seq_len`` and the token budget), the fixed gamma the theorems are about.
            ``True``: the engine's draft-length policy chooses each round's ``k`` in ``0..k``
            ([`GoodputK`][minispec.decoding.goodput.GoodputK]: the step costs this call measures
            and the running acceptance), recorded in ``stats.k_per_round``; a seeded sampled
            request keeps ``k``, so its tokens depend on its seed only.
        graphs: run the target (and a draft model's chain steps) as static-shape steps, captured
            as CUDA graphs on a GPU ([`minispec.models.static_step`][minispec.models.static_step]);
            ``None`` (the default): on a GPU only; on the CPU ``True`` runs the same step eagerly.

    Returns:
        A [`GenerationResult`][minispec.decoding.loop.GenerationResult]; greedy output is
        token-for-token the target's greedy output, sampled output has the target's law.

    Raises:
        ValueError: for a bad request or configuration (the same checks as ``Engine.add_request``),
            or NaN logits.
    """
    # every check runs before a cache is made or a forward runs
    drafter, k, branching, extra = as_drafter_for(drafter, k, branching)  # k: 0 without one
    policy = policy_for(adaptive, k, branching is None)
    seq = make_sequence("0", target, prompt_ids, sampling, max_new_tokens=max_new_tokens,
                        max_seq_len=context_limit(target, drafter, max_seq_len), k=k,
                        tokenizer=tokenizer, stop=stop, stop_token_ids=stop_token_ids,
                        eos_token_id=eos_token_id)
    cache = ContiguousKVCache.for_model(target, 1, seq.max_seq_len, extra)
    seq.slot = cache.allocate()
    if keeps_cache(drafter):                # a draft model's or a head's cache; a tree's nodes too
        drafter.attach(ContiguousKVCache.for_model(drafter.model, 1, seq.max_seq_len, extra))
        seq.draft_slot = drafter.cache.allocate()
    runner = SpeculativeRunner(target, cache, drafter, branching, graphs)
    if (reason := seq.done_before_start()) is not None:
        seq.finish(reason)
    else:
        runner.prefill([seq])        # all but the last prompt token; each round feeds the last one
    while not seq.is_finished:       # draft, verify, roll back, emit: the Engine's round, B = 1
        run_round(policy, runner, [seq], k)
    if drafter is not None:
        drafter.release(seq)
    if seq.finish_reason == "error":
        raise ValueError(seq.error)
    return GenerationResult.of(seq, policy.choices if policy else ())    # one choice a round


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
    ids = encode_prompt(prompt, tokenizer)
    eos = target.config.eos_token_ids if eos_token_id is None else eos_token_id   # []: no EOS
    eos = tuple(eos) if isinstance(eos, (list, tuple, set, frozenset)) else (eos,)  # one or several
    eos += end_of_turn_ids(tokenizer) if is_chat(prompt) else ()
    seq = Sequence.new(request_id, ids, sampling, max_new_tokens=max_new_tokens,
                       max_seq_len=max_seq_len, vocab_size=target.config.vocab_size,
                       eos_token_ids=eos, stop_token_ids=stop_token_ids, stop=stop,
                       tokenizer=tokenizer, k=k, device=target.device)
    seq.constraint = make_constraint(seq.sampling, tokenizer, target.config.vocab_size,
                                     sorted(seq.eos_token_ids))
    return seq


def as_drafter_for(spec: Any, k: Any, branching: Any
                   ) -> tuple[Drafter | None, int, tuple[int, ...] | None, int]:
    """What a user passes as a drafter, for chains or (with ``branching``) trees of depth ``k``,
    checked with ``k`` for both loops.

    ``spec`` is ``None`` (plain decoding); a draft [`Llama`][minispec.models.llama.Llama] (made a
    [`ModelDrafter`][minispec.drafters.base.ModelDrafter]); a
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
    if isinstance(branching, DynamicTree) and not spec.dynamic_trees:
        raise ValueError("a DynamicTree is grown from a model's confidence: it needs a draft "
                         f"model or an EAGLE head, not {type(spec).__name__}")
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
