"""Single-sequence decoding: plain ``generate`` and ``speculative_generate`` (Leviathan Algorithm 1).

Both loops share one shape. The prompt minus its last token is prefilled into the target's cache;
then every round feeds ``[last, d_1..d_k]`` at positions ``n-1..n-1+k`` (``k = 0`` for plain
decoding), turns the ``k + 1`` logits into target distributions ``p`` with the same adjustments
the drafter used, calls :func:`minispec.verify`, and rolls the cache back to the accepted length.
Plain decoding is the special case with no drafts, so the two loops cannot drift apart.

Stop conditions are checked token by token inside an accepted block: an EOS, a stop token id or a
stop string that completes in the middle of a block ends the sequence exactly there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minispec.drafters import Drafter, ModelDrafter
from minispec.kv_cache import ContiguousKVCache
from minispec.model import Llama
from minispec.sampling import SamplingParams, apply_repetition_penalty, probs_from_logits
from minispec.speculative import GreedyVerdict, verify, verify_greedy
from minispec.stats import SpecStats

if TYPE_CHECKING:
    from minispec.adaptive import KPolicy

__all__ = ["GenerationResult", "Round", "generate", "speculative_generate"]


@dataclass(frozen=True)
class Round:
    """One draft-verify round, for traces: the drafts, how many were accepted, what was emitted."""

    drafts: list[int]
    num_accepted: int
    emitted: list[int]


@dataclass
class GenerationResult:
    """What a decoding call returns.

    Attributes:
        tokens: the new tokens only (the prompt is not repeated).
        text: ``tokens`` decoded (and cut before a stop string), when a tokenizer was given.
        finish_reason: ``"length"`` (max_new_tokens), ``"eos"``, ``"stop"`` (stop token id or
            string) or ``"max_seq_len"`` (the context is full).
        stats: a :class:`minispec.stats.SpecStats`.
        rounds: every round's drafts and outcome (drawn by :mod:`minispec.viz`).
    """

    tokens: list[int]
    text: str | None
    finish_reason: str
    stats: SpecStats
    rounds: list[Round] = field(default_factory=list)


def generate(model: Llama, prompt_ids: Sequence[int] | str, max_new_tokens: int = 64,
             sampling: SamplingParams | None = None, **kwargs) -> GenerationResult:
    """Plain autoregressive decoding: one target forward per token.

    Args and keyword arguments: as :func:`speculative_generate`, without a drafter.
    """
    return speculative_generate(model, None, prompt_ids, max_new_tokens, k=0, sampling=sampling, **kwargs)


@torch.inference_mode()
def speculative_generate(
    target: Llama,
    drafter: Drafter | Llama | None,
    prompt_ids: Sequence[int] | str,
    max_new_tokens: int = 64,
    k: int | KPolicy = 4,
    sampling: SamplingParams | None = None,
    *,
    tokenizer=None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    eos_token_id: int | Sequence[int] | None = None,
    max_seq_len: int | None = None,
) -> GenerationResult:
    """Speculative decoding of one sequence (Leviathan et al. 2023, Algorithm 1).

    Args:
        target: the target model ``p``.
        drafter: a :class:`~minispec.drafters.Drafter` (``ModelDrafter``, ``NGramDrafter``,
            ``PromptLookupDrafter``), a draft :class:`~minispec.model.Llama` (wrapped in a
            ``ModelDrafter``), or ``None`` for plain decoding.
        prompt_ids: ``[n]`` prompt token ids (or a string, with ``tokenizer``).
        max_new_tokens: at most this many new tokens.
        k: drafts per round (gamma); shrunk near ``max_seq_len``. Or a draft-length policy such
            as :class:`minispec.adaptive.AdaptiveK`, asked before every round (``next_k()``) and
            told the outcome after it (``update(drafted, accepted)``); reset once per call.
        sampling: the adjustments applied to both models' logits and the seed of the one
            ``torch.Generator`` of this call (default: greedy).
        tokenizer: a Hugging Face tokenizer to encode a string prompt, decode the result and
            match stop strings.
        stop: stop strings (need ``tokenizer``); the text is cut before the first occurrence.
        stop_token_ids: extra token ids that end the sequence (kept in ``tokens``).
        eos_token_id: end-of-sequence id(s); default: the target config's.
        max_seq_len: limit on prompt + new tokens (``k`` shrinks near it, down to plain one-token
            steps); default and maximum: the target's ``max_position_embeddings``.

    Returns:
        A :class:`GenerationResult`; greedy output is token-for-token the target's greedy output,
        sampled output has the target's law.
    """
    started = time.perf_counter()
    sampling = sampling or SamplingParams(temperature=0.0)
    prompt = _encode(prompt_ids, tokenizer)
    if isinstance(drafter, Llama):
        drafter = ModelDrafter(drafter, max_seq_len=max_seq_len)
    policy = None if isinstance(k, int) else k
    if policy is not None:
        if drafter is None:
            raise ValueError("a draft-length policy needs a drafter")
        policy.reset()
        k = policy.k_max
    if k < (1 if drafter is not None else 0):
        raise ValueError(f"k must be >= 1 with a drafter, got {k}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer")
    if isinstance(drafter, ModelDrafter):
        drafter.check_compatible(target.config.vocab_size, target.config.eos_token_ids)

    limit = min(max_seq_len or target.config.max_position_embeddings, target.config.max_position_embeddings)
    if drafter is not None and hasattr(drafter, "max_seq_len"):
        limit = min(limit, drafter.max_seq_len)
    if len(prompt) > limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens but max_seq_len is {limit}")
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or target.config.eos_token_ids)
    stops = set(stop_token_ids)

    device = target.device
    draft_forwards_before = getattr(drafter, "forwards", 0)
    generator = sampling.make_generator(device)
    cache = ContiguousKVCache.for_model(target, num_slots=1, max_seq_len=limit)
    slot = cache.allocate()
    stats = SpecStats(k=k if drafter is not None else 0, prefill_tokens=len(prompt) - 1)
    if len(prompt) > 1:   # prefill all but the last prompt token; each round feeds the last one
        _forward(target, cache, slot, prompt[:-1], start=0)

    context = list(prompt)
    new: list[int] = []
    rounds: list[Round] = []
    finish = "length"
    while len(new) < max_new_tokens:
        n = len(context)
        if n >= limit:                     # the sequence is as long as the context allows
            finish = "max_seq_len"
            break
        # A round writes positions n-1..n-1+k and yields up to k+1 tokens: keep n + k + 1 <= limit.
        k_wanted = policy.next_k() if policy is not None else k
        k_round = min(k_wanted, limit - n - 1, max_new_tokens - len(new) - 1) if drafter is not None else 0
        t0 = time.perf_counter()
        draft = drafter.propose(context, k_round, sampling, generator) if k_round > 0 else None
        t1 = time.perf_counter()
        drafts = draft.tokens.tolist() if draft is not None else []
        logits = _forward(target, cache, slot, [context[-1]] + drafts, start=n - 1)   # (k+1, V)
        contexts = None
        if sampling.repetition_penalty != 1:      # row i has seen the context plus d_1..d_i
            contexts = [context + drafts[:i] for i in range(len(drafts) + 1)]
        if sampling.greedy:
            # Greedy verification needs only the target's argmax at each position: the same
            # tokens verify() picks from one-hot rows, without building [k+1, V] one-hot tensors.
            verdict = _verify_greedy(drafts, logits, sampling, contexts)
        else:
            p = probs_from_logits(logits, sampling, context_ids=contexts)
            draft_tokens = torch.tensor(drafts, dtype=torch.long, device=device)
            verdict = verify(draft_tokens, None if draft is None else draft.probs, p, generator)
        cache.truncate_to(slot, n + verdict.num_accepted)    # keep [last, accepted drafts]
        stats.verify_time += time.perf_counter() - t1
        stats.draft_time += t1 - t0
        stats.record_round(len(drafts), verdict.num_accepted)
        if policy is not None:
            policy.update(len(drafts), verdict.num_accepted)

        emitted = []
        for token in verdict.tokens:
            emitted.append(token)
            new.append(token)
            if token in eos or token in stops:
                finish = "eos" if token in eos else "stop"
            elif stop and _hits_stop(tokenizer, new, stop):
                finish = "stop"
            elif len(new) < max_new_tokens:
                continue
            break
        context.extend(emitted)
        rounds.append(Round(drafts, verdict.num_accepted, emitted))
        if finish != "length" or len(new) >= max_new_tokens:
            break

    stats.new_tokens = len(new)
    stats.draft_forwards = getattr(drafter, "forwards", 0) - draft_forwards_before
    stats.total_time = time.perf_counter() - started
    return GenerationResult(new, _decode(tokenizer, new, stop), finish, stats, rounds)


def _verify_greedy(drafts: list[int], logits: torch.Tensor, sampling: SamplingParams,
                   contexts: list[list[int]] | None) -> GreedyVerdict:
    """Greedy verify on raw logits ``[k+1, V]``: accept drafts while they equal the target's argmax.

    Token for token what ``verify(drafts, q, probs_from_logits(logits, sampling))`` returns at
    temperature 0 (same NaN check, same repetition penalty, same first-index tie-break), in one
    host sync instead of several full-vocabulary passes.
    """
    logits = logits.float()
    if sampling.repetition_penalty != 1 and contexts is not None:
        logits = apply_repetition_penalty(logits, contexts, sampling.repetition_penalty)
    argmax = logits.argmax(dim=-1)                                    # (k+1,)
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    return verify_greedy(drafts, argmax.tolist())


def _forward(model: Llama, cache: ContiguousKVCache, slot: int, ids: list[int], start: int) -> torch.Tensor:
    """Feed ``ids`` at positions ``start..``; return their logits ``[T, V]``."""
    device = model.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)                  # (1, T)
    positions = torch.arange(start, start + len(ids), device=device)[None]             # (1, T)
    return model(input_ids, positions, cache, [slot])[0]                               # (T, V)


def _encode(prompt_ids: Sequence[int] | str, tokenizer) -> list[int]:
    if isinstance(prompt_ids, str):
        if tokenizer is None:
            raise ValueError("a string prompt needs a tokenizer")
        prompt_ids = tokenizer.encode(prompt_ids)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    return prompt


def _hits_stop(tokenizer, tokens: list[int], stop: Sequence[str]) -> bool:
    """Did the last token complete a stop string? (Only the tail of the text is decoded.)"""
    longest = max(len(s) for s in stop)
    tail = tokenizer.decode(tokens[-(longest + 8):])
    before = tokenizer.decode(tokens[-(longest + 8):-1])
    return any(s in tail and s not in before for s in stop)


def _decode(tokenizer, tokens: list[int], stop: Sequence[str]) -> str | None:
    if tokenizer is None:
        return None
    text = tokenizer.decode(tokens)
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text
