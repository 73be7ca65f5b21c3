"""Standardized sampling: every decoding mode is sampling from an adjusted distribution.

Leviathan et al. (2023, §2.2) observe that argmax, top-k, nucleus (top-p) sampling and temperature
are all "sample from an adjusted distribution". That is what makes speculative decoding work for
every mode at once: apply the *same* adjustment to the target logits (giving ``p``) and to the draft
logits (giving ``q``), then run speculative sampling on ``p`` and ``q``.

The order of the adjustments follows common practice (Hugging Face's logits processors):

    repetition penalty -> temperature (0 means argmax) -> top-k -> top-p -> softmax

Every function here works on any number of leading dimensions: ``[..., V]`` in, ``[..., V]`` out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["MIN_TEMPERATURE", "SamplingParams", "check_args", "check_probs", "is_int", "is_real",
           "non_finite", "one_hot", "probs_for_rows", "probs_from_logits", "sample"]

#: The smallest positive temperature: float32's smallest positive number, ``2**-149`` (about
#: 1.4e-45). Logits are divided by ``T`` in float32, where a smaller ``T`` rounds to 0 (then
#: ``logits / T`` is ``0 / 0 = NaN``); use ``temperature=0`` for greedy decoding instead.
MIN_TEMPERATURE = 2.0**-149


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into a distribution, and the seed of the random stream.

    Args:
        temperature: divides the logits; ``0`` means greedy (a one-hot argmax distribution,
            computed without dividing by zero). Must be ``0`` or ``>= MIN_TEMPERATURE`` (about
            1.4e-45): a smaller positive value is refused rather than rounded to 0, since float32
            cannot divide by it.
        top_k: keep only the ``top_k`` largest logits (ties at the boundary are kept);
            ``0`` disables. Must be ``>= 0``.
        top_p: nucleus sampling: keep the smallest set of tokens whose probability reaches
            ``top_p``; ``1.0`` disables. Must satisfy ``0 < top_p <= 1``.
        repetition_penalty: CTRL-style penalty for tokens already in the context: a positive
            logit is divided by it, a negative one multiplied. ``1.0`` disables. Must be ``> 0``.
        seed: seed of the one ``torch.Generator`` a decoding call uses; ``None`` seeds it from
            the operating system's randomness (``Generator.seed()``), not ``torch.manual_seed``.
        json_schema: the output must be JSON meeting this schema (a dict or its JSON text; kept
            as JSON text, in its key order: properties come out in that order); compiled by the
            grammar wing ([`minispec.grammar`][minispec.grammar]), which masks ``p`` and ``q``
            alike.
        regex: the output must match this regular expression (the grammar wing too).

    Raises:
        ValueError: naming the field, when a value is out of range.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    json_schema: str | dict | None = None
    regex: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json_schema, dict):    # hashable; key order kept (it orders the output)
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        check_args("SamplingParams", [
            ("temperature", self.temperature, is_real(self.temperature) and (
                self.temperature == 0 or self.temperature >= MIN_TEMPERATURE),
             f"0 (greedy) or a real number >= {MIN_TEMPERATURE:.6g} (the smallest positive "
             f"float32)"),
            ("top_k", self.top_k, is_int(self.top_k) and self.top_k >= 0, "an integer >= 0"),
            ("top_p", self.top_p, is_real(self.top_p) and 0 < self.top_p <= 1,
             "a real number in (0, 1]"),
            ("repetition_penalty", self.repetition_penalty,
             is_real(self.repetition_penalty) and self.repetition_penalty > 0,
             "a real number > 0"),
            ("seed", self.seed,
             self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**64),
             "an integer in [0, 2**64) or None"),
            ("json_schema", self.json_schema, self.json_schema is None or (
                isinstance(self.json_schema, str) and self.json_schema.strip() != ""),
             "a dict, its JSON text or None"),
            ("regex", self.regex, self.regex is None or isinstance(self.regex, str),
             "a string or None"),
            ("json_schema", self.json_schema, self.json_schema is None or self.regex is None,
             "None when regex is given (one grammar a request)")])

    @property
    def greedy(self) -> bool:
        """True when the adjusted distribution is one-hot (temperature 0)."""
        return self.temperature == 0

    @property
    def raw_argmax(self) -> bool:
        """True when the argmax of the raw logits decides the token (greedy, no repetition penalty):
        the decoding loops then skip building distributions."""
        return self.temperature == 0 and self.repetition_penalty == 1

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """The one random stream of a decoding call, seeded from ``seed``.

        A generator is made once per request and never reseeded inside the loop: reseeding would
        correlate draws that the exactness proof needs independent.
        """
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def check_args(owner: str, checks: list[tuple[str, Any, bool, str]]) -> None:
    """``ValueError`` for the first ``(name, value, ok, allowed)`` that is not ``ok``, naming
    ``owner``'s argument, its value and what is allowed."""
    for name, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"{owner}: {name} must be {allowed}, got {value!r}")


def is_real(x: object) -> bool:
    """Whether ``x`` is a finite real number (an int or a float, not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x: object) -> bool:
    """True for a true integer: an ``int`` that is not a ``bool`` (Python counts ``True`` as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def probs_from_logits(logits: Tensor, params: SamplingParams,
                      context_ids: Sequence[int] | Sequence[Sequence[int]] | Tensor | None = None
                      ) -> Tensor:
    """Leviathan §2.2's standardized sampling: the adjusted distribution for ``logits``.

    Args:
        logits: ``[..., V]`` raw scores (any float dtype; computed in float32).
        params: the adjustments to apply.
        context_ids: tokens already in the context, for the repetition penalty: one sequence
            shared by every row, or one sequence per row of ``logits.reshape(-1, V)`` (a list of
            lists, or a 2-D tensor). In a verify step row ``i`` sees the context plus drafts
            ``d_1..d_i``, exactly as the draft model did when it proposed ``d_{i+1}``.

    Returns:
        ``[..., V]`` float32 probabilities, each row summing to 1. With temperature 0 the row is
        one-hot at the argmax (first index on ties).

    Raises:
        ValueError: for NaN logits, a row that is all ``-inf``, or a mismatched context.
    """
    if logits.ndim == 0:
        raise ValueError("logits must have a vocabulary dimension [..., V]")
    logits = logits.float()
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if params.repetition_penalty != 1.0 and context_ids is not None:
        logits = apply_repetition_penalty(logits, context_ids, params.repetition_penalty)
    if params.temperature == 0:
        # Greedy is the limit T -> 0: all mass on the argmax. No division by T happens.
        return one_hot(logits.argmax(dim=-1), logits.shape[-1])          # (..., V)
    logits = _divide_by_temperature(logits, params.temperature)
    if 0 < params.top_k < logits.shape[-1]:   # below the k-th largest of its row: -inf (ties kept)
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]      # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:   # nucleus: sorted, a token is dropped once the mass strictly before it
        # reaches top_p: the smallest prefix reaching top_p is kept (the most likely token always)
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)    # (..., V)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs       # (..., V)
        kept = sorted_logits.masked_fill(mass_before >= params.top_p, float("-inf"))
        logits = torch.empty_like(kept).scatter_(-1, order, kept)   # back in vocabulary order
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("a row of logits is entirely -inf: no token can be sampled")
    return torch.softmax(logits, dim=-1)   # each row has a finite maximum: no NaN


def _divide_by_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``logits / T`` without overflow, and a defined answer for ``+inf`` logits.

    A tiny ``T`` (say 1e-38) overflows ``logits / T`` to ``inf`` (softmax: NaN), or a row of very
    negative logits to all ``-inf``; shifting by the row maximum first leaves the distribution
    unchanged and keeps the maximum at 0, every other entry finite or ``-inf``. A row with ``+inf``
    logits puts all its mass, uniformly, on those tokens (the limit of softmax).
    """
    infinite = torch.isposinf(logits)                                     # (..., V)
    if infinite.any():
        has_inf = infinite.any(dim=-1, keepdim=True)                      # (..., 1)
        logits = torch.where(has_inf, torch.where(infinite, 0.0, float("-inf")), logits)
    scaled = logits / temperature
    lost = torch.isneginf(scaled).all(dim=-1) & ~torch.isneginf(logits).all(dim=-1)   # (...)
    if torch.isposinf(scaled).any() or lost.any():                        # overflow: shift first
        top = logits.amax(dim=-1, keepdim=True)                           # (..., 1)
        scaled = (logits - top.nan_to_num(neginf=0.0)) / temperature      # all -inf rows stay so
    return scaled


def non_finite(logits: Tensor) -> Tensor:
    """Which rows of ``logits`` ``(..., V)`` hold NaN or +inf: ``(...)`` bool. ``-inf`` is a token
    ruled out, not a fault. The one check every phase makes before it trusts a row of logits (a
    row that fails it fails its request alone)."""
    return (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1)


def one_hot(tokens: Tensor, vocab_size: int) -> Tensor:
    """``[...]`` int64 token ids -> ``[..., V]`` float32 one-hot rows: the ``q`` of a deterministic
    drafter, and the adjusted distribution at temperature 0."""
    out = torch.zeros(*tokens.shape, vocab_size, device=tokens.device)  # (..., V)
    return out.scatter_(-1, tokens[..., None], 1.0)


def probs_for_rows(logits: Tensor, params: Sequence[SamplingParams],
                   contexts: Sequence[Sequence[int]] | None = None,
                   masks: Sequence[Tensor | None] | None = None) -> Tensor:
    """[`probs_from_logits`][minispec.core.sampling.probs_from_logits] with each row's own
    ``SamplingParams`` (rows of a batch).

    Args:
        logits: ``(N, V)`` raw scores.
        params: one ``SamplingParams`` per row; rows with equal adjustments are done together.
        contexts: row ``i``'s context for the repetition penalty (``None`` when no row uses one).
        masks: row ``i``'s ``(V,)`` bool mask of allowed tokens (a grammar's), or ``None`` (all
            allowed): the other tokens get logit ``-inf`` before every other adjustment, so the
            row's law is ``p`` restricted to the mask and renormalized.

    Returns:
        ``(N, V)`` float32 distributions.
    """
    if masks is not None and any(m is not None for m in masks):
        logits = logits.clone()
        for r, mask in enumerate(masks):
            if mask is not None:
                logits[r].masked_fill_(~mask.to(logits.device), float("-inf"))
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)   # (N, V)
    groups: dict[tuple, list[int]] = {}
    for r, sp in enumerate(params):
        groups.setdefault((sp.temperature, sp.top_k, sp.top_p, sp.repetition_penalty), []).append(r)
    for rows in groups.values():
        sp = params[rows[0]]
        ctx = None if contexts is None else [contexts[r] for r in rows]    # used with a penalty
        index = torch.tensor(rows, device=logits.device)
        out[index] = probs_from_logits(logits[index], sp, context_ids=ctx)
    return out


def apply_repetition_penalty(logits: Tensor,
                             context_ids: Sequence[int] | Sequence[Sequence[int]] | Tensor,
                             penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al., 2019) on ``[..., V]`` logits.

    A token seen in the context has its logit divided by ``penalty`` when positive and multiplied
    by it when negative, so ``penalty > 1`` always makes a seen token less likely.
    """
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)                                      # (N, V)
    seen = torch.zeros_like(rows, dtype=torch.bool)                       # (N, V)
    ids = context_ids.tolist() if isinstance(context_ids, Tensor) else list(context_ids)
    per_row = len(ids) > 0 and isinstance(ids[0], (list, tuple))
    if per_row and len(ids) != rows.shape[0]:
        raise ValueError(f"context_ids has {len(ids)} rows but logits have {rows.shape[0]}")
    for r, row_ids in enumerate(ids if per_row else [ids] * rows.shape[0]):
        if row_ids:
            index = torch.as_tensor(row_ids, dtype=torch.long, device=rows.device)
            if index.min() < 0 or index.max() >= vocab:
                raise ValueError(f"context_ids must lie in [0, {vocab}), got {row_ids}")
            seen[r, index] = True
    # logit 0 stays 0 (a huge penalty rounds to inf in float32, and 0 * inf would be NaN)
    penalized = torch.where(rows > 0, rows / penalty, torch.where(rows < 0, rows * penalty, rows))
    return torch.where(seen, penalized, rows).reshape(logits.shape)


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row of ``probs``.

    Args:
        probs: ``[..., V]`` probabilities (non-negative, rows with positive mass).
        generator: the random stream; ``None`` uses torch's global generator.

    Returns:
        ``[...]`` int64 token ids (a 0-d tensor for a single distribution).
    """
    flat = probs.reshape(-1, probs.shape[-1])                             # (N, V)
    tokens = torch.multinomial(flat, 1, generator=generator)              # (N, 1)
    return tokens.reshape(probs.shape[:-1])


def check_probs(probs: Tensor, name: str, atol: float = 1e-4) -> None:
    """Raise ``ValueError`` unless ``probs`` ``[..., V]`` holds distributions.

    Checks: floating dtype, no NaN, no negative entry, every row sums to 1 within ``atol``.
    All conditions are reduced on the device first so a valid input costs a single host sync.
    """
    if not torch.is_floating_point(probs):
        raise ValueError(f"{name} must be a floating-point tensor, got {probs.dtype}")
    if probs.ndim == 0 or probs.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty vocabulary dimension, "
                         f"got {tuple(probs.shape)}")
    row_error = (probs.sum(dim=-1) - 1).abs()
    bad = torch.isnan(probs).any() | (probs < 0).any() | (row_error > atol).any()
    if not bool(bad):
        return
    if torch.isnan(probs).any():
        raise ValueError(f"{name} contains NaN")
    if (probs < 0).any():
        raise ValueError(f"{name} has negative probabilities (min {probs.min().item():.3g})")
    raise ValueError(f"{name} rows must sum to 1; worst row is off by {row_error.max().item():.3g}")
