"""The statistics of every check and lesson, in one place: one pooled Pearson chi-square test
([`fit`][minispec.check.statistics.fit]), a one-sided Hoeffding bound, a total-variation
tolerance, the Bonferroni split of a check's false-alarm budget, and the exact laws of a model's
first tokens that lessons 04 and 06 test a decoder against. Nothing here needs scipy.

**Why these tests.** Every sampled case of a check compares observed counts with an *exact* law
(computed by enumeration, never estimated), so the counts are multinomial under the null
hypothesis "the implementation is correct". Pearson's ``X^2 = sum (O - E)^2 / E`` is then
asymptotically chi-square with ``bins - 1`` degrees of freedom; cells expected fewer than
``min_expected`` times are pooled into one bin so that the approximation holds (Cochran's rule asks
for 5, which the lessons use; the graders pool below 10, and grow the pooled bin to 10, because
their tails are far out, at ``alpha ~ 1e-4``). A cell the exact law gives probability 0 is not
tested statistically: one observation there is a certain failure.

**The false-alarm budget.** A check runs ``m`` tests; each gets ``alpha = budget / (4 m)`` with
``budget = 1e-3`` (Bonferroni, valid whatever the dependence between the tests; the factor 4:
[`per_test_alpha`][minispec.check.statistics.per_test_alpha]).

**The lessons** call the same test through two adapters:
[`chi_square`][minispec.check.statistics.chi_square] (outcomes against a mapping, lessons 04 and
06) and [`law_test`][minispec.check.statistics.law_test] (a table of counts against a table of
probabilities, lessons 03 and 09), with [`tv_tolerance`][minispec.check.statistics.tv_tolerance];
their exact laws come from [`next_token_probs`][minispec.check.statistics.next_token_probs] and
[`first_tokens_law`][minispec.check.statistics.first_tokens_law].
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from minispec.check.harness import Failure
from minispec.check.report import Counterexample
from minispec.core.sampling import SamplingParams, probs_from_logits
from minispec.models.llama import Llama

#: The documented false-alarm rate of every check, for a correct implementation.
BUDGET = 1e-3


def per_test_alpha(num_tests: int) -> float:
    """The level of each of ``num_tests`` tests of one check: ``BUDGET / (4 * num_tests)``.

    The factor 4 is slack for the chi-square approximation itself, which is anti-conservative in
    the far tail of discrete counts: simulating exact multinomial counts of the verifier's
    81-outcome stream law (600 and 400 streams, 500 000 simulations each) gave a real tail 1.6
    times the nominal one at ``alpha = 8.3e-5``; ``tests/test_check.py`` repeats a cheaper version
    of that simulation."""
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
        threshold: the critical value at the test's level (``inf`` without a level).
        pvalue: ``P(chi-square(df) >= statistic)`` (0 for an impossible outcome).
        impossible: indices of observed outcomes whose exact probability is 0.
        worst: indices of the cells with the largest standardised residuals, worst first (the
            impossible ones first of all), at most 5.
    """

    passed: bool
    statistic: float
    df: int
    threshold: float
    pvalue: float
    impossible: list[int]
    worst: list[int]


def pool_bins(expected: Tensor, min_expected: float, grow: bool = True) -> Tensor:
    """A bin id per cell ``(C,)``: cells with expected count < ``min_expected`` share bin 0.

    With ``grow`` the next smallest cells join the pooled bin until it expects ``min_expected``
    itself; bin 0 is empty when no cell is pooled.
    """
    order = torch.argsort(expected)
    pooled = int((expected < min_expected).sum())
    while grow and 0 < pooled < len(order) and float(expected[order[:pooled]].sum()) < min_expected:
        pooled += 1
    bins = torch.zeros_like(order)
    bins[order[pooled:]] = torch.arange(1, len(order) - pooled + 1)
    return bins


def fit(observed: Tensor, probs: Tensor, alpha: float | None = None, min_expected: float = 10.0,
        grow: bool = True) -> Fit:
    """Pearson's goodness of fit of ``observed`` counts ``(C,)`` to the exact law ``probs``.

    Args:
        observed: counts of each outcome.
        probs: the exact probability of each outcome (sums to 1).
        alpha: the test's level (``None``: no threshold, only the p-value).
        min_expected: cells expecting fewer counts are pooled into one bin.
        grow: grow the pooled bin until it expects ``min_expected`` too (see ``pool_bins``).
    """
    observed, probs = observed.double(), probs.double()
    expected = probs * float(observed.sum())                                      # (C,)
    possible = probs > 0                                                          # (C,)
    impossible = (~possible & (observed > 0)).nonzero().flatten().tolist()
    residuals = (observed - expected).abs() / expected.clamp_min(1e-12).sqrt()
    shown = ((observed > 0) | possible).nonzero().flatten()                      # (S,)
    worst = shown[torch.argsort(torch.where(possible, residuals, math.inf)[shown],
                                descending=True)[:5]].tolist()
    if impossible:
        return Fit(False, math.inf, 0, 0.0, 0.0, impossible, worst)
    bins = pool_bins(expected[possible], min_expected, grow)
    o = torch.zeros(int(bins.max()) + 1, dtype=torch.float64)
    o.index_add_(0, bins, observed[possible])
    e = torch.zeros_like(o).index_add_(0, bins, expected[possible])
    keep = e > 0                        # bin 0 is empty when nothing was pooled
    statistic = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1            # one bin (df 0): nothing to test beyond impossibility
    threshold = math.inf if alpha is None or df < 1 else chi_square_critical(alpha, df)
    return Fit(statistic <= threshold, statistic, df, threshold, chi_square_sf(statistic, df),
               [], worst)


def chi_square(outcomes: Sequence[Hashable], law: Mapping[Hashable, float],
               min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's test of ``outcomes`` against ``law`` (outcome -> probability): ``fit`` on a
    mapping.

    Outcomes expected at least ``min_expected`` times get a cell each; all others (those outside
    ``law`` too) share one pooled cell. Returns ``(p-value, number of cells, smallest expected
    count)``; an outcome of probability 0 that was observed gives ``p = 0``.
    """
    n = len(outcomes)
    kept = {key: prob for key, prob in law.items() if n * prob >= min_expected}
    counts = Counter(key if key in kept else "pooled" for key in outcomes)
    observed = torch.tensor([counts[key] for key in kept] + [counts["pooled"]], dtype=torch.float64)
    probs = torch.tensor([*kept.values(), 1 - sum(kept.values())], dtype=torch.float64)
    pvalue = fit(observed, probs.clamp_min(0), min_expected=0.0).pvalue
    return pvalue, len(observed), n * float(probs.min())


def law_test(counts: Tensor, law: Tensor, min_expected: float = 5.0) -> tuple[float, float]:
    """Pearson's test of observed ``counts`` against the exact ``law``, both tables of one shape:
    ``fit`` on tables.

    Cells expected fewer than ``min_expected`` times are pooled into one; the law is renormalised in
    float64 (float32 tables sum to 1 only up to rounding). An outcome of probability 0 that was
    observed at all gives ``p = 0``: no amount of luck explains it.

    Returns:
        ``(p-value, TV)``: the chi-square p-value and the total-variation distance between the
        empirical law and ``law``.
    """
    counts, law = counts.double().flatten(), law.double().flatten()
    law = law / law.sum()
    tv = 0.5 * float((counts / counts.sum() - law).abs().sum())
    return fit(counts, law, min_expected=min_expected, grow=False).pvalue, tv


def hoeffding_excess(n: int, alpha: float) -> float:
    """How far above its mean ``n * beta`` a Binomial(n, beta) count may lie at level ``alpha``.

    Hoeffding's inequality, ``P(X - n beta >= t) <= exp(-2 t^2 / n)``, holds for every ``beta``
    and ``n`` with no approximation, so ``t = sqrt(n ln(1/alpha) / 2)`` is a rigorous bound.
    """
    return math.sqrt(n * math.log(1 / alpha) / 2)


def tv_tolerance(law: Tensor, n: int, delta: float = 1e-6) -> float:
    """A total-variation distance that ``n`` correct draws from ``law`` exceed with probability
    below ``delta``.

    ``E[TV] <= 1/2 sum_i sqrt(pi_i (1 - pi_i) / n)`` (Jensen), and one draw moves TV by at most
    ``1/n``, so McDiarmid's inequality adds ``sqrt(ln(1/delta) / (2n))``.
    """
    law = law.double().flatten()
    mean_bound = 0.5 * float(torch.sqrt(law * (1 - law) / n).sum())
    return mean_bound + (math.log(1 / delta) / (2 * n)) ** 0.5


@torch.inference_mode()
def next_token_probs(model: Llama, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
    """The next-token distribution after each prefix (all of one length) at temperature 1,
    ``(B, V)`` float64."""
    ids = torch.tensor([list(p) for p in prefixes], device=model.device)           # (B, L)
    positions = torch.arange(ids.shape[1], device=model.device).expand_as(ids)     # (B, L)
    logits = model(ids, positions)[:, -1]                                          # (B, V)
    return probs_from_logits(logits, SamplingParams(temperature=1.0)).double().cpu()


def first_tokens_law(model: Llama, prompt: Sequence[int], n: int, exclude: Sequence[int] = ()
                     ) -> tuple[torch.Tensor, dict[Hashable, float], dict[Hashable, float]]:
    """The exact law of the first token and of the first two tokens after ``prompt``, computed from
    the target's logits at temperature 1 (no sampling): lessons 04 and 06 count the first tokens
    that ``speculative_generate`` emits over seeded runs and test them against it
    (``chi_square``).

    Args:
        model: the target.
        prompt: the context.
        n: the number of runs the law will be tested against: a first token ``a`` expected at
            least once gets its second token's law, and a pair ``(a, b)`` expected at least 5
            times gets its own cell; the rest of ``a``'s mass is the cell ``(a, "other")``.
        exclude: first tokens not continued (e.g. EOS, after which nothing is emitted).

    Returns:
        ``(p1, first_law, pair_law)``: the first token's distribution ``(V,)``, its law as a
        mapping ``token -> probability``, and the pair law ``{(a, b) or (a, "other"): prob}``.
    """
    p1 = next_token_probs(model, [prompt])[0]                                      # (V,)
    likely = [a for a in range(len(p1)) if n * p1[a] >= 1 and a not in exclude]
    joint = p1[likely, None] * next_token_probs(model, [list(prompt) + [a] for a in likely])
    top = {(likely[i], b): joint[i, b].item() for i, b in (n * joint >= 5).nonzero().tolist()}
    pairs: dict[Hashable, float] = dict(top)
    for a in likely:                                    # "a, then anything else"
        pairs[a, "other"] = p1[a].item() - sum(p for (x, _), p in top.items() if x == a)
    return p1, {a: p1[a].item() for a in range(len(p1))}, pairs


def expect_law(observed: Tensor, probs: Tensor, alpha: float, what: str, inputs: dict[str, Any],
               label: Callable[[int], str] = "token {}".format) -> Fit:
    """Pearson's test ([`fit`][minispec.check.statistics.fit]) of ``observed`` counts against the
    exact law ``probs`` at level ``alpha``; its ``Fit`` when it passes.

    Otherwise raises ``Failure``: ``what``, the ``inputs``, and the most discrepant outcomes
    (named by ``label``), expected probability against observed frequency, with the statistic and
    its threshold, or the outcome of probability 0 that was observed.
    """
    fitted = fit(observed, probs, alpha)
    if fitted.passed:
        return fitted
    n = float(observed.sum())
    table = [(label(i), float(probs[i]), float(observed[i]) / n) for i in fitted.worst]
    if fitted.impossible:
        raise Failure(Counterexample(f"{what}: it emitted {label(fitted.impossible[0])}, which "
                                     "has probability 0", inputs, table), "impossible outcome")
    stat = f"Pearson chi-square, {fitted.df} df (p-value {fitted.pvalue:.2g})"
    raise Failure(Counterexample(what, inputs, table, stat, fitted.statistic, fitted.threshold),
                  f"p-value {fitted.pvalue:.2g}")
