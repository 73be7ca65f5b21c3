"""Adaptive gamma: choose the draft length of every round from the acceptance seen so far.

Leviathan et al. (§3.5, Figure 3) pick one ``gamma`` from ``alpha`` and ``c`` before decoding
starts. ``alpha`` is not known in advance, though: it depends on the pair, on the text and on the
sampling settings, and it drifts within a request.
[`AdaptiveK`][minispec.decoding.adaptive.AdaptiveK] estimates it online and re-solves §3.5's
problem before each round::

    k = argmax_gamma  E[tokens](alpha_hat, gamma) / (gamma c + r(gamma))

The estimate is the posterior mean of a Beta prior updated with every *tested* draft (an accepted
draft is a success, the first rejection of a round a failure; drafts after it were never tested).
Optional exponential forgetting (``decay < 1``) lets the estimate follow a request whose
acceptance changes, e.g. when the text falls into a loop that the draft predicts perfectly.

Pass the policy as ``k`` of
[`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate]; the decoding loop
calls ``reset()`` once per request, ``next_k()`` before each round and
``update(drafted, accepted)`` after it. The chosen lengths are in ``out.stats.drafted_per_round``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from minispec.core.theory import optimal_gamma

__all__ = ["AdaptiveK", "KPolicy"]


@runtime_checkable
class KPolicy(Protocol):
    """What the decoding loop needs from a draft-length policy."""

    k_max: int

    def reset(self) -> None:
        """Forget everything: a new request starts."""

    def next_k(self) -> int:
        """Drafts to propose in the next round, in ``1..k_max``."""

    def update(self, drafted: int, accepted: int) -> None:
        """Record one round: ``drafted`` proposals, the first ``accepted`` of them kept."""


class AdaptiveK:
    """Per-round ``k = optimal_gamma(alpha_hat, c, r)`` with a Beta(a, b) prior on ``alpha``.

    Args:
        c: draft step cost / target step cost (``0`` for n-gram drafters: lookups are free).
        r: verify cost in target steps: a number, a function ``gamma -> r``, or a mapping
            ``{gamma: r}`` as measured by
            [`minispec.tools.bench.measure_costs`][minispec.tools.bench.measure_costs] (``1`` is the
            paper's assumption; a CPU needs the measured one).
        k_min: the smallest ``k`` chosen.
        k_max: the largest ``k`` chosen.
        prior: ``(a, b)`` of the Beta prior; its mean ``a / (a + b)`` is the first round's guess
            and ``a + b`` is how many tested drafts it weighs.
        decay: each round multiplies the running counts by ``decay`` before adding the new ones
            (``1``: plain running counts; ``0.9``: roughly the last ten rounds matter).

    Raises:
        ValueError: naming the argument: ``k_min``/``k_max`` not integers with
            ``1 <= k_min <= k_max``, ``c`` not a finite number >= 0 (NaN included), ``r`` not
            positive, a prior that is not two finite numbers > 0, ``decay`` outside ``(0, 1]``.
    """

    def __init__(self, c: float, r: float | Callable[[int], float] | Mapping[int, float] = 1.0,
                 k_min: int = 1, k_max: int = 8, prior: tuple[float, float] = (1.0, 1.0),
                 decay: float = 1.0) -> None:
        checks = [
            ("k_min", k_min, _is_int(k_min) and k_min >= 1, "an integer >= 1"),
            ("k_max", k_max, _is_int(k_max) and _is_int(k_min) and k_max >= k_min,
             f"an integer >= k_min ({k_min!r})"),
            ("c", c, _is_real(c) and c >= 0, "a finite number >= 0"),
            ("r", r, callable(r) or _positive_costs(r),
             "a finite number > 0, a function gamma -> r, or a mapping {gamma: r > 0}"),
            ("prior", prior, isinstance(prior, (tuple, list)) and len(prior) == 2
             and all(_is_real(x) and x > 0 for x in prior), "(a, b), finite numbers > 0"),
            ("decay", decay, _is_real(decay) and 0 < decay <= 1, "a number in (0, 1]"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"AdaptiveK: {name} must be {expected}, got {value!r}")
        self.c = c
        self.r = _verify_cost(r)
        self.k_min, self.k_max = k_min, k_max
        self.prior = prior
        self.decay = decay
        self.history: list[int] = []       # the k chosen in each round of the current request
        self.reset()

    def reset(self) -> None:
        """A new request: back to the prior."""
        self.successes = 0.0
        self.failures = 0.0
        self.history = []
        self._choices: dict[float, int] = {}

    @property
    def alpha_hat(self) -> float:
        """Posterior mean of ``alpha``: ``(a + accepted) / (a + b + tested)``."""
        a, b = self.prior
        return (a + self.successes) / (a + b + self.successes + self.failures)

    def next_k(self) -> int:
        """``optimal_gamma(alpha_hat, c, r)`` clipped to ``k_min..k_max``."""
        alpha = round(self.alpha_hat, 3)       # memoised: the search runs over k_max gammas
        if alpha not in self._choices:
            best = optimal_gamma(alpha, self.c, self.r, max_gamma=self.k_max)
            self._choices[alpha] = max(self.k_min, best)
        k = self._choices[alpha]
        self.history.append(k)
        return k

    def update(self, drafted: int, accepted: int) -> None:
        """Add one round's tested drafts: ``accepted`` successes and one failure if any was
        rejected."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted={accepted} must lie in [0, drafted={drafted}]")
        self.successes = self.decay * self.successes + accepted
        self.failures = self.decay * self.failures + (1 if accepted < drafted else 0)

    def __repr__(self) -> str:
        return (f"AdaptiveK(c={self.c:.3g}, k={self.k_min}..{self.k_max}, prior={self.prior}, "
                f"decay={self.decay}, alpha_hat={self.alpha_hat:.3f})")


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    """A finite real number (NaN, infinities and bools are not)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _positive_costs(r: object) -> bool:
    """``r`` is a finite number > 0, or a mapping of integer gammas >= 1 to such numbers."""
    if isinstance(r, Mapping):
        return all(_is_int(g) and g >= 1 and _is_real(v) and v > 0 for g, v in r.items())
    return _is_real(r) and r > 0


def _verify_cost(r: float | Callable[[int], float] | Mapping[int, float]
                 ) -> float | Callable[[int], float]:
    """A mapping ``{gamma: r}`` becomes a function; gammas beyond the table extrapolate linearly."""
    if not isinstance(r, Mapping):
        return r
    table = {int(g): float(v) for g, v in r.items()}
    if not table:
        raise ValueError("the table of verify costs r is empty")
    top = max(table)
    slope = (table[top] - table[min(table)]) / (top - min(table)) if top > min(table) else 0.0

    def cost(gamma: int) -> float:
        if gamma in table:
            return table[gamma]
        if gamma > top:
            return table[top] + slope * (gamma - top)
        return table[min(table, key=lambda g: abs(g - gamma))]

    return cost
