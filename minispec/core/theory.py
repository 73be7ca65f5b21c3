"""Closed forms from the analysis of speculative decoding (Leviathan et al. 2023, §3).

Notation: ``alpha`` is the expected acceptance rate ``E[beta]``, with
``beta = sum_x min(p(x), q(x))`` at one position; ``gamma`` is the number of drafts per round (``k``
in code); ``c`` is the cost of one draft step divided by the cost of one target step; ``c_hat`` the
same ratio for arithmetic operations.

The paper assumes that verifying ``gamma + 1`` tokens in one target forward costs the same as one
target step. That holds when the target is memory-bound (large models on GPUs) but not for tiny
models on a CPU, where the verify forward costs ``r`` target steps with ``r > 1``. Every walltime
formula here therefore takes an optional ``r`` (a number, or a function of ``gamma``); ``r = 1``
recovers the paper exactly.

Tensors in, tensors out for the divergence functions; plain floats for the scalar formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

import torch
from torch import Tensor

__all__ = ["acceptance_rate", "best_tree_size", "expected_accepted", "expected_tokens",
           "lk_divergence", "min_speedup_gamma1", "ops_factor", "optimal_gamma", "walltime_speedup"]

VerifyCost = float | Callable[[int], float]


def lk_divergence(p: Tensor, q: Tensor) -> Tensor:
    """``D_LK(p, q) = sum_x |p(x) - M(x)|`` with ``M = (p + q) / 2`` (Definition 3.2).

    Computed from the definition, so that Lemma 3.3 (``D_LK = 1 - sum min(p, q)``) is something a
    test or a lesson can check rather than assume.

    Args:
        p: ``[..., V]`` target distribution.
        q: ``[..., V]`` draft distribution, same shape.

    Returns:
        ``[...]`` divergences in ``[0, 1]``.
    """
    m = (p + q) / 2
    return (p - m).abs().sum(dim=-1)


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """``beta = sum_x min(p(x), q(x))``: the probability speculative sampling accepts ``x ~ q``.

    Theorem 3.5. Averaging over positions gives ``alpha`` (Corollary 3.6).

    Args:
        p: ``[..., V]`` target distribution.
        q: ``[..., V]`` draft distribution, same shape.

    Returns:
        ``[...]`` acceptance probabilities.
    """
    return torch.minimum(p, q).sum(dim=-1)


def _check(alpha: float, gamma: int) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0, got {gamma!r}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per round, ``(1 - alpha^(gamma+1)) / (1 - alpha)`` (Equation 1).

    Written as the finite sum ``1 + alpha + ... + alpha^gamma``, equal to Eq. (1) and fine at
    ``alpha = 1`` (where a round always yields ``gamma + 1`` tokens).
    """
    _check(alpha, gamma)
    return sum(alpha**i for i in range(gamma + 1))


def expected_accepted(alpha: float, gamma: int) -> float:
    """Expected accepted drafts per round, ``alpha + alpha^2 + ... + alpha^gamma``.

    Draft ``i`` survives only if drafts ``1..i`` all do, which has probability ``alpha^i`` under
    the i.i.d. assumption. It is ``expected_tokens - 1``: the last token of a round is the target's
    own (a correction or a bonus). Note the per-draft rate is ``expected_accepted / gamma``, which
    is *lower* than ``alpha`` for ``gamma > 1``.
    """
    _check(alpha, gamma)
    return sum(alpha**i for i in range(1, gamma + 1))


def walltime_speedup(alpha: float, gamma: int, c: float, r: VerifyCost = 1.0) -> float:
    """Expected walltime improvement over plain decoding (Theorem 3.8, extended with ``r``).

    A round costs ``gamma`` draft steps (``gamma * c`` target steps) plus one verify forward
    (``r`` target steps; the paper's ``r = 1``) and yields ``expected_tokens(alpha, gamma)``
    tokens, while plain decoding yields one token per target step::

        speedup = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + r))

    Args:
        alpha: acceptance rate in ``[0, 1]``.
        gamma: drafts per round (``>= 0``).
        c: draft step cost / target step cost (``>= 0``).
        r: verify cost in target steps, a number or a function ``gamma -> r``.
    """
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    cost = r(gamma) if callable(r) else r
    if cost <= 0:
        raise ValueError(f"verify cost r must be > 0, got {cost}")
    return expected_tokens(alpha, gamma) / (gamma * c + float(cost))


def optimal_gamma(alpha: float, c: float, r: VerifyCost = 1.0, max_gamma: int = 64) -> int:
    """The integer ``gamma >= 1`` maximising
    [`walltime_speedup`][minispec.core.theory.walltime_speedup].

    Leviathan et al. §3.5, Figure 3.

    Searched exhaustively over ``1..max_gamma`` (ties go to the smaller gamma).
    """
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
    return max(range(1, max_gamma + 1), key=lambda g: (walltime_speedup(alpha, g, c, r), -g))


def ops_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected factor of increase in arithmetic operations (Theorem 3.11).

    A round runs the draft ``gamma`` times (``gamma * c_hat``) and the target on ``gamma + 1``
    tokens, for ``expected_tokens`` tokens::

        ops = (1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))
    """
    if c_hat < 0:
        raise ValueError(f"c_hat must be >= 0, got {c_hat}")
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def min_speedup_gamma1(alpha: float, c: float) -> float:
    """Corollary 3.9: with ``alpha > c``, ``gamma = 1`` already gives
    ``(1 + alpha) / (1 + c) > 1``."""
    if not alpha > c:
        raise ValueError(f"Corollary 3.9 needs alpha > c, got alpha={alpha}, c={c}")
    return walltime_speedup(alpha, 1, c)


def best_tree_size(values: list[float], r: Sequence[float] | None, draft: float = 0.0) -> int:
    """How many of a tree's nodes to verify: ``n`` maximising expected tokens per unit of time.

    A node accepted with probability ``v_i`` adds ``v_i`` tokens on average, so verifying the
    ``n`` likeliest nodes (``values`` sorted in decreasing order, each node's parent before it)
    yields ``1 + v_1 + .. + v_n`` tokens for a round that costs ``draft + r(n + 1)`` target steps:
    the drafting, already spent, and one verify forward of ``n + 1`` tokens.

    Args:
        values: acceptance estimates of the candidate nodes, decreasing.
        r: ``r[T - 1]`` is the cost of verifying ``T`` tokens over one step; ``None``: free (every
            node is verified); a curve shorter than needed is extended by its last value.
        draft: the round's drafting cost, in target steps.
    """
    if r is None:
        return len(values)
    cost = lambda n: draft + r[min(n, len(r) - 1)]         # r(n + 1) = r[n]
    gains = list(accumulate(values, initial=1.0))            # gains[n] = 1 + v_1 + .. + v_n
    return max(range(len(values) + 1), key=lambda n: (gains[n] / cost(n), -n))

