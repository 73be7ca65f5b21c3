"""Speculative sampling and verification: the maths, with no model in sight.

Notation (Leviathan et al. 2023): ``p`` is the target distribution, ``q`` the draft distribution,
both over a vocabulary of ``V`` tokens and both *after* the same sampling adjustments
([`minispec.core.sampling.probs_from_logits`][minispec.core.sampling.probs_from_logits]). ``k``
(gamma in the paper) is the number of draft tokens checked in one round.

The one rule everything here is built from (Leviathan §2.3, Stratos §1):

* draw ``x ~ q``; accept it iff ``u < p(x) / q(x)`` for ``u ~ U[0, 1)``;
* on rejection, draw from the residual ``norm(max(0, p - q))``.

The accepted-or-resampled token is distributed exactly as ``p`` (Leviathan App. A.1).
[`verify`][minispec.core.speculative.verify] applies the rule to ``k`` drafts in a row
(Algorithm 1), [`verify_batch`][minispec.core.speculative.verify_batch] to a batch of rows at once,
and ``minispec.core.tree`` generalises it to several proposals and draft trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from minispec.core.sampling import one_hot, sample

__all__ = ["Draft", "GreedyVerdict", "Verdict", "accepts", "check_probs", "residual",
           "speculative_sample", "speculative_sample_batch", "verify", "verify_batch",
           "verify_greedy"]

Generators = torch.Generator | Sequence[torch.Generator] | None  # one shared, or one per row


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distributions they were drawn from: what a drafter hands to verify.

    Attributes:
        tokens: ``[n]`` int64, ``0 <= n <= k`` guesses.
        probs: ``[n, V]`` row ``i`` is the ``q`` token ``i`` was drawn from, or ``None`` when the
            drafter is deterministic (one-hot ``q``).
    """

    tokens: Tensor
    probs: Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


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


def residual(p: Tensor, q: Tensor) -> Tensor:
    """The residual distribution ``norm(max(0, p - q))`` used after a rejection.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities (broadcastable to ``p``).

    Returns:
        The normalised excess of ``p`` over ``q``, ``[..., V]``. Where ``p == q`` the excess is all
        zeros; there a rejection has probability 0 (every ``x`` with ``q(x) > 0`` is accepted), so
        the row is never used and we return ``p`` itself instead of dividing by zero.

    Raises:
        ValueError: when ``p`` or ``q`` is not a distribution (NaN, negative, rows not summing
            to 1).
    """
    check_probs(p, "p")
    check_probs(q, "q")
    return _residual(p, q)


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """[`residual`][minispec.core.speculative.residual] on inputs already checked (the verify loop's
    inner step)."""
    excess = (p - q).clamp_min(0)                                     # (..., V)
    mass = excess.sum(dim=-1, keepdim=True)                           # (..., 1)
    safe_mass = mass.clamp_min(torch.finfo(excess.dtype).tiny)
    return torch.where(mass > 0, excess / safe_mass, p.expand_as(excess))


def accepts(u: Tensor, p_x: Tensor, q_x: Tensor) -> Tensor:
    """The acceptance test ``u < p(x) / q(x)``, strict, written without a division.

    Strictness matters: with ``u = 0`` a token the target gives probability 0 must be rejected.
    """
    return u * q_x < p_x


def speculative_sample(p: Tensor, q: Tensor, generator: torch.Generator | None = None
                       ) -> tuple[int, bool]:
    """One token of speculative sampling: propose from ``q``, keep it or resample (Stratos §1).

    Args:
        p: ``[V]`` target distribution.
        q: ``[V]`` draft distribution.
        generator: random stream (``None``: torch's global one).

    Returns:
        The token, distributed exactly as ``p``, and whether it was the draft's proposal
        (``P(accepted) = sum_x min(p(x), q(x))``, Leviathan Thm 3.5).
    """
    _check_pair(p, q)
    x = int(sample(q, generator))
    u = torch.rand((), generator=generator, device=q.device)
    if accepts(u, p[x], q[x]):
        return x, True
    return int(sample(_residual(p, q), generator)), False


def speculative_sample_batch(p: Tensor, q: Tensor, num_samples: int,
                             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``num_samples`` independent runs of
    [`speculative_sample`][minispec.core.speculative.speculative_sample], vectorised.

    Used for Monte Carlo checks. Every run draws its residual token up front, and keeps it only on
    rejection, which leaves the law of each run unchanged.

    Returns:
        ``(tokens, accepted)``, both ``[num_samples]`` (int64 and bool).
    """
    _check_pair(p, q)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    x = torch.multinomial(q, num_samples, replacement=True, generator=generator)      # (n,)
    u = torch.rand(num_samples, generator=generator, device=q.device)                 # (n,)
    accepted = accepts(u, p[x], q[x])                                                # (n,)
    fallback = torch.multinomial(_residual(p, q), num_samples, replacement=True,
                                 generator=generator)
    return torch.where(accepted, x, fallback), accepted


def _check_pair(p: Tensor, q: Tensor) -> None:
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [V] with the same V, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    check_probs(p, "p")
    check_probs(q, "q")


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one row of ``k`` draft tokens.

    Attributes:
        tokens: the tokens to append, ``num_accepted + 1`` of them: the accepted drafts, then either
            the correction drawn from the residual (a draft was rejected) or the bonus token drawn
            from the target at position ``k + 1`` (all drafts accepted).
        num_accepted: how many drafts were accepted (``0..k``).
        num_drafts: ``k``.
        final_probs: ``[V]`` the distribution the last token was drawn from (residual, bonus
            distribution, or one-hot in greedy mode) -- data for lessons and exactness checks.
    """

    tokens: list[int]
    num_accepted: int
    num_drafts: int
    final_probs: Tensor

    @property
    def bonus(self) -> bool:
        """True when every draft was accepted and the last token is the free bonus token."""
        return self.num_accepted == self.num_drafts


@dataclass(frozen=True)
class GreedyVerdict:
    """The outcome of [`verify_greedy`][minispec.core.speculative.verify_greedy]: the tokens to
    append and how many drafts were kept."""

    tokens: list[int]
    num_accepted: int


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> GreedyVerdict:
    """Greedy verification (Stratos App. A) on token ids alone, with no distributions.

    Args:
        draft_tokens: ``[k]`` the drafts ``d_1..d_k``.
        target_argmax: ``[k+1]`` the target's argmax after the context plus ``d_1..d_i``.

    Returns:
        The drafts up to the first one that differs from the target's argmax, then the target's
        argmax at that position (or the bonus argmax when all ``k`` match) -- exactly what
        [`verify`][minispec.core.speculative.verify] returns on one-hot target rows, without
        building them.
    """
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == target_argmax[accepted]:
        accepted += 1
    return GreedyVerdict(list(draft_tokens[:accepted]) + [target_argmax[accepted]], accepted)


def verify(draft_tokens: Sequence[int] | Tensor, draft_probs: Tensor | None, target_probs: Tensor,
           generator: torch.Generator | None = None, *, greedy: bool | None = None,
           uniforms: Tensor | None = None) -> Verdict:
    """Algorithm 1's accept loop for one sequence (Leviathan et al. 2023, §2.3), written as the
    loop.

    This is the scalar reference a student reads;
    [`verify_batch`][minispec.core.speculative.verify_batch] is the same rule on tensors for many
    rows at once and draws the same random numbers (``k`` uniforms first, then the last token), so
    the two agree token for token; the exact-law tests check both.

    Args:
        draft_tokens: ``[k]`` the drafted tokens ``d_1..d_k``.
        draft_probs: ``[k, V]`` row ``i`` is the distribution ``d_{i+1}`` was drawn from, or
            ``None`` for a deterministic drafter (n-gram, prompt lookup): then ``q`` is one-hot at
            each draft, and sampling stays exact.
        target_probs: ``[k+1, V]`` row ``i`` is ``p(. | context, d_1..d_i)``; the last row gives the
            bonus token.
        generator: random stream for the ``u``'s and the final draw.
        greedy: exact-match mode (accept ``d_i`` iff it is the target's argmax, then append the
            argmax); ``None`` picks it when every target row is one-hot (temperature 0).
        uniforms: ``[k]`` optional ``u`` values to use instead of drawing them (for teaching and
            for exact enumeration in tests).

    Returns:
        A [`Verdict`][minispec.core.speculative.Verdict] with ``1..k+1`` tokens.
    """
    if not isinstance(draft_tokens, Tensor):
        draft_tokens = torch.tensor(list(draft_tokens), dtype=torch.long,
                                    device=target_probs.device)
    if draft_tokens.ndim != 1 or target_probs.ndim != 2:
        raise ValueError(f"verify expects draft_tokens [k] and target_probs [k+1, V], got "
                         f"{tuple(draft_tokens.shape)} and {tuple(target_probs.shape)}")
    _check_verify_inputs(draft_tokens[None], None if draft_probs is None else draft_probs[None],
                         target_probs[None], None if uniforms is None else uniforms[None])
    p, q, drafts = target_probs, draft_probs, draft_tokens.tolist()              # p (k+1, V)
    k = len(drafts)
    if greedy is None:                  # temperature 0: every target row is one-hot
        greedy = bool((p.amax(dim=-1) == 1).all())
    u = uniforms if uniforms is not None else torch.rand(k, generator=generator, device=p.device)
    for i, x in enumerate(drafts):      # test d_1, d_2, ... in order; stop at the first rejection
        q_i = one_hot(draft_tokens[i], p.shape[-1]).to(p.dtype) if q is None else q[i]   # (V,)
        if not greedy and q_i[x] == 0:
            raise ValueError("a draft token has q(x) = 0: draft_probs must be the distribution "
                             "each draft token was actually drawn from")
        keep = x == int(p[i].argmax()) if greedy else bool(accepts(u[i], p[i, x], q_i[x]))
        if not keep:                    # rejected: the correction comes from norm(max(0, p - q))
            final = p[i] if greedy else _residual(p[i], q_i)
            break
    else:                               # all k accepted: the bonus token comes from p_{k+1}
        i, final = k, p[k]
    if greedy:                          # exact match: the target's argmax, drawn from nothing
        last = int(p[i].argmax())
        final = one_hot(torch.tensor(last), p.shape[-1]).to(p.dtype)
    else:
        last = int(sample(final[None], generator)[0])
    return Verdict(tokens=drafts[:i] + [last], num_accepted=i, num_drafts=k, final_probs=final)


def verify_batch(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                 generators: Generators = None, *, greedy: bool | Sequence[bool] | None = None,
                 uniforms: Tensor | None = None) -> list[Verdict]:
    """[`verify`][minispec.core.speculative.verify]'s loop for ``B`` rows at once, on tensors.

    The same steps, each on a ``(B, k)`` or ``(B, V)`` tensor: test every draft (``u_i <
    p_i(d_i) / q_i(d_i)``, or an argmax match for greedy rows); the accepted drafts are the prefix
    before the first failed test (a cumulative product); the last token comes from the bonus row
    ``p_{k+1}`` if all ``k`` passed, else from the residual at the first rejection. Row ``b`` with
    its own generator draws the same numbers as ``verify`` would (``k`` uniforms, then the last
    token), so the two agree token for token. Used for Monte Carlo checks in the lessons.

    Args:
        draft_tokens: ``[B, k]`` int64 drafts.
        draft_probs: ``[B, k, V]`` or ``None`` (one-hot ``q``, deterministic drafters).
        target_probs: ``[B, k+1, V]``.
        generators: one generator shared by all rows, one per row (a request keeps its own random
            stream in a batch), or ``None``.
        greedy: one flag for all rows, one per row, or ``None`` to detect one-hot target rows.
        uniforms: ``[B, k]`` optional acceptance uniforms.

    Returns:
        One [`Verdict`][minispec.core.speculative.Verdict] per row.
    """
    B, k = _check_verify_inputs(draft_tokens, draft_probs, target_probs, uniforms)
    p, V, rows = target_probs, target_probs.shape[-1], torch.arange(B, device=target_probs.device)
    per_row = generators is not None and not isinstance(generators, torch.Generator)
    if per_row and len(generators := list(generators)) != B:   # never share a row's stream
        raise ValueError(f"{len(generators)} generators for {B} rows: give one per row, or one "
                         "torch.Generator shared by all")
    if greedy is None:
        greedy_rows = (p.amax(dim=-1) == 1).all(dim=-1)                           # (B,)
    else:
        greedy_rows = torch.tensor([greedy] * B if isinstance(greedy, bool) else list(greedy),
                                   dtype=torch.bool, device=p.device)
    if uniforms is None:
        uniforms = (torch.stack([torch.rand(k, generator=g, device=p.device) for g in generators])
                    if per_row else torch.rand(B, k, generator=generators, device=p.device))
    q = one_hot(draft_tokens, V).to(p.dtype) if draft_probs is None else draft_probs  # (B, k, V)
    p_x = p[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)                # (B, k)
    q_x = q.gather(-1, draft_tokens[..., None]).squeeze(-1)                       # (B, k)
    if (q_x[~greedy_rows] == 0).any():
        raise ValueError("a draft token has q(x) = 0: draft_probs must be the distribution "
                         "each draft token was actually drawn from")
    exact = draft_tokens == p[:, :k].argmax(dim=-1)                               # (B, k)
    keep = torch.where(greedy_rows[:, None], exact, accepts(uniforms, p_x, q_x))  # (B, k)
    accepted = keep.long().cumprod(dim=-1).sum(dim=-1)       # (B,) stop at the first rejection
    p_n = p[rows, accepted]                                  # (B, V) the row of the last token
    final = p_n if k == 0 else torch.where(                  # bonus, or the residual
        (accepted == k)[:, None], p_n, _residual(p_n, q[rows, accepted.clamp(max=k - 1)]))
    best = p_n.argmax(dim=-1)                                                     # (B,)
    final = torch.where(greedy_rows[:, None], one_hot(best, V).to(p.dtype), final)
    if per_row:
        last = [int(best[b]) if greedy_rows[b] else int(sample(final[b], g))
                for b, g in enumerate(generators)]
    else:
        drawn = best if bool(greedy_rows.all()) else sample(final, generators)
        last = torch.where(greedy_rows, best, drawn).tolist()
    drafts, counts = draft_tokens.tolist(), accepted.tolist()
    return [Verdict(drafts[b][: counts[b]] + [last[b]], counts[b], k, final[b]) for b in range(B)]


def _check_verify_inputs(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                         uniforms: Tensor | None) -> tuple[int, int]:
    """Validate shapes and distributions of a batched verify; return ``(B, k)``."""
    if draft_tokens.ndim != 2 or target_probs.ndim != 3:
        raise ValueError(f"expected draft_tokens [B, k] and target_probs [B, k+1, V], got "
                         f"{tuple(draft_tokens.shape)} and {tuple(target_probs.shape)}")
    B, k = draft_tokens.shape
    V = target_probs.shape[-1]
    if target_probs.shape[:2] != (B, k + 1):
        raise ValueError(f"target_probs must be [B, k+1, V] = [{B}, {k + 1}, V], "
                         f"got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (B, k, V):
        raise ValueError(f"draft_probs must be [B, k, V] = [{B}, {k}, {V}], "
                         f"got {tuple(draft_probs.shape)}")
    if uniforms is not None and uniforms.shape != (B, k):
        raise ValueError(f"uniforms must be [B, k] = [{B}, {k}], got {tuple(uniforms.shape)}")
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if k > 0 and (draft_tokens.min() < 0 or draft_tokens.max() >= V):
        raise ValueError(f"draft tokens must lie in [0, {V})")
    check_probs(target_probs, "target_probs")
    if draft_probs is not None:
        check_probs(draft_probs, "draft_probs")
    return B, k
