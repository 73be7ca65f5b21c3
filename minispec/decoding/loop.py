"""Single-sequence decoding: plain ``generate`` and ``speculative_generate`` (Leviathan
Algorithm 1).

The loop drives the same round as the [`Engine`][minispec.serving.engine.Engine] --
[`SpeculativeRunner.round`][minispec.decoding.runner.SpeculativeRunner.round] on a batch of one,
through the same draft-length policy -- so the two cannot drift apart:

1. **draft**: the drafter guesses ``k`` tokens after the context (with the ``q`` of each);
2. **score**: one target forward scores ``[last, d_1..d_k]`` and the accept rule keeps a prefix of
   the drafts plus one token from the target (a correction or the bonus);
3. **roll back**: both caches forget the rejected drafts;
4. **emit**: the tokens are appended until a stop rule fires (EOS, stop id or string, budget,
   context), even in the middle of an accepted block.

Plain decoding is the special case with no drafter (``k = 0``): every round is one target step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from minispec.core.sampling import SamplingParams
from minispec.decoding.request import (
    GenerationResult,
    as_drafter_for,
    context_limit,
    make_sequence,
)
from minispec.decoding.runner import (
    ChainVerifier,
    SpeculativeRunner,
    collaborators,
    run_round,
)
from minispec.drafters.base import keeps_cache
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Forward, Llama

__all__ = ["GenerationResult", "generate", "speculative_generate"]


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
                         adaptive: bool = False, graphs: bool | None = None,
                         policy: Any = None, forward: Forward | None = None,
                         verify: ChainVerifier | None = None) -> GenerationResult:
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
            [`DynamicTree`][minispec.extra_drafters.dynamic.DynamicTree] (a draft model or an
            EAGLE head: the tree EAGLE-2 grows from the drafter's confidence). ``None``: the
            chain of Algorithm 1.
        adaptive: ``False`` (the default): every round drafts ``k`` (shrunk only near
            ``max_seq_len`` and the token budget), the fixed gamma the theorems are about.
            ``True``: the engine's draft-length policy chooses each round's ``k`` in ``0..k``
            (the goodput policy of [`minispec.speed.goodput`][minispec.speed.goodput]: the step
            costs this call measures and the running acceptance), recorded in
            ``stats.k_per_round``; a seeded sampled request keeps ``k``, so its tokens depend on
            its seed only.
        graphs: run the target (and a draft model's chain steps) as static-shape steps, captured
            as CUDA graphs on a GPU ([`minispec.speed.static_step`][minispec.speed.static_step]);
            ``None`` (the default): on a GPU only; on the CPU ``True`` runs the same step eagerly.
        policy: a draft-length policy to use instead of the one ``adaptive`` names (an object
            with ``round(runner, seqs, caps)``, ``forget`` and ``choices``, as
            [`FixedK`][minispec.decoding.runner.FixedK]).
        forward: how both models run a step (a ``Forward``), instead of the one ``graphs`` names.
        verify: a chain verifier with the graders' signature, ``fn(draft_tokens, draft_probs,
            target_probs, generator) -> tokens``, run instead of
            [`verify`][minispec.core.speculative.verify] (chains only).

    Returns:
        A [`GenerationResult`][minispec.decoding.request.GenerationResult]; greedy output is
        token-for-token the target's greedy output, sampled output has the target's law.

    Raises:
        ValueError: for a bad request or configuration (the same checks as ``Engine.add_request``),
            or NaN logits.
    """
    # every check runs before a cache is made or a forward runs
    drafter, k, branching, extra = as_drafter_for(drafter, k, branching)  # k: 0 without one
    chosen = collaborators(adaptive, graphs, k, branching is None, target.device)
    policy, forward = policy or chosen[0], forward or chosen[1]
    seq = make_sequence("0", target, prompt_ids, sampling, max_new_tokens=max_new_tokens,
                        max_seq_len=context_limit(target, drafter, max_seq_len), k=k,
                        tokenizer=tokenizer, stop=stop, stop_token_ids=stop_token_ids,
                        eos_token_id=eos_token_id)
    cache = ContiguousKVCache.for_model(target, 1, seq.max_seq_len, extra)
    seq.slot = cache.allocate()
    runner = SpeculativeRunner(target, cache, drafter, branching, forward, verify)
    if keeps_cache(drafter):                # a draft model's or a head's cache; a tree's nodes too
        drafter.attach(ContiguousKVCache.for_model(drafter.model, 1, seq.max_seq_len, extra),
                       forward)
        seq.draft_slot = drafter.cache.allocate()
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
    return GenerationResult.of(seq, policy.choices)                      # one choice a round
