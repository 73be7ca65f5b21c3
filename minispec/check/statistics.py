"""The statistics the graders use: a pooled Pearson chi-square test, a one-sided Hoeffding bound,
and the Bonferroni split of a check's false-alarm budget. Nothing here needs scipy.

**Why these tests.** Every sampled case of a check compares observed counts with an *exact* law
(computed by enumeration, never estimated), so the counts are multinomial under the null
hypothesis "the implementation is correct". Pearson's statistic
``X^2 = sum (O - E)^2 / E`` is then asymptotically chi-square with ``bins - 1`` degrees of freedom;
cells whose expected count is below ``min_expected`` are pooled into one bin so that the
approximation holds (Cochran's rule asks for 5; we pool below 10 because our tails are far out,
at ``alpha ~ 1e-4``). A cell the exact law gives probability 0 is not tested statistically: one
observation there is a certain failure.

**The false-alarm budget.** A check runs ``m`` tests; each gets ``alpha = budget / (4 m)`` with
``budget = 1e-3`` (Bonferroni, valid whatever the dependence between the tests). The factor 4 is
slack for the chi-square approximation itself, which is anti-conservative in the far tail of
discrete counts: simulating exact multinomial counts of the verifier's 81-outcome stream law (600
and 400 streams, 500 000 simulations each) gave a real tail 1.6 times the nominal one at
``alpha = 8.3e-5``; ``tests/test_check.py`` repeats a cheaper version of that simulation. So
``m`` tests at ``budget / (4 m)`` reject a correct implementation with probability well below
``budget``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BUDGET", "Fit", "chi_square_critical", "chi_square_sf", "fit", "hoeffding_excess",
           "per_test_alpha", "pool_bins"]

#: The documented false-alarm rate of every check, for a correct implementation.
BUDGET = 1e-3


def per_test_alpha(num_tests: int) -> float:
    """The level of each of ``num_tests`` tests of one check: ``BUDGET / (4 * num_tests)``."""
    return BUDGET / (4 * num_tests)


def chi_square_sf(x: float, df: int) -> float:
    """``P(X >= x)`` for ``X ~ chi-square(df)``: the regularised upper incomplete gamma."""
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def chi_square_critical(alpha: float, df: int) -> float:
    """The ``x`` with ``P(chi-square(df) >= x) = alpha`` (bisection; df >= 1)."""
    lo, hi = 0.0, float(df) + 40.0 + 20.0 * math.sqrt(df)
    while chi_square_sf(hi, df) > alpha:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi_square_sf(mid, df) > alpha else (lo, mid)
    return hi


@dataclass
class Fit:
    """The outcome of [`fit`][minispec.check.statistics.fit].

    Attributes:
        passed: no impossible outcome was observed and ``statistic <= threshold``.
        statistic: Pearson's ``X^2`` over the pooled bins (``inf`` for an impossible outcome).
        df: degrees of freedom (bins - 1).
        threshold: the critical value at the test's level.
        pvalue: ``P(chi-square(df) >= statistic)``.
        impossible: indices of observed outcomes whose exact probability is 0.
        worst: indices of the cells with the largest standardised residuals, worst first.
    """

    passed: bool
    statistic: float
    df: int
    threshold: float
    pvalue: float
    impossible: list[int]
    worst: list[int]


def pool_bins(expected: Tensor, min_expected: float) -> Tensor:
    """A bin id per cell ``(C,)``: cells with expected count < ``min_expected`` share bin 0."""
    order = torch.argsort(expected)
    small = expected[order] < min_expected
    pooled = int(small.sum())
    if 0 < pooled < len(order):         # make the pooled bin itself big enough
        while pooled < len(order) and float(expected[order[:pooled]].sum()) < min_expected:
            pooled += 1
    bins = torch.empty_like(order)
    bins[order[:pooled]] = 0
    bins[order[pooled:]] = torch.arange(1, len(order) - pooled + 1)
    return bins


def fit(observed: Tensor, probs: Tensor, alpha: float, min_expected: float = 10.0) -> Fit:
    """Pearson's goodness of fit of ``observed`` counts ``(C,)`` to the exact law ``probs``.

    Args:
        observed: counts of each outcome.
        probs: the exact probability of each outcome (sums to 1).
        alpha: the test's level.
        min_expected: cells expecting fewer counts are pooled into one bin.
    """
    observed, probs = observed.double(), probs.double()
    n = float(observed.sum())
    impossible = ((probs <= 1e-12) & (observed > 0)).nonzero().flatten().tolist()
    possible = probs > 1e-12                                                      # (C,)
    expected = probs * n                                                          # (C,)
    residuals = (observed - expected) / expected.clamp_min(1e-12).sqrt()
    residuals = torch.where(possible, residuals.abs(), torch.full_like(residuals, math.inf))
    worst = torch.argsort(residuals, descending=True)[:5]
    worst = [int(i) for i in worst if observed[i] > 0 or possible[i]]
    if impossible:
        return Fit(False, math.inf, 0, 0.0, 0.0, impossible, worst)
    bins = pool_bins(expected[possible], min_expected)
    num_bins = int(bins.max()) + 1
    o = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, observed[possible])
    e = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, expected[possible])
    keep = e > 0
    statistic = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1
    if df < 1:                          # one bin: nothing to test beyond impossibility
        return Fit(True, 0.0, 0, math.inf, 1.0, [], worst)
    threshold = chi_square_critical(alpha, df)
    return Fit(statistic <= threshold, statistic, df, threshold, chi_square_sf(statistic, df),
               [], worst)


def hoeffding_excess(n: int, alpha: float) -> float:
    """How far above its mean ``n * beta`` a Binomial(n, beta) count may lie at level ``alpha``.

    Hoeffding's inequality, ``P(X - n beta >= t) <= exp(-2 t^2 / n)``, holds for every ``beta``
    and ``n`` with no approximation, so ``t = sqrt(n ln(1/alpha) / 2)`` is a rigorous bound.
    """
    return math.sqrt(n * math.log(1 / alpha) / 2)
