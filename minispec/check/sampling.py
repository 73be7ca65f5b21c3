"""Grade a student's single-token speculative sampler and residual, the acceptance rate, the
adjusted distribution and the walltime speedup of a round.

* ``fn(p [V], q [V], generator) -> (token, accepted)``, as
  [`minispec.speculative_sample`][minispec.core.speculative.speculative_sample]: draw a proposal
  from ``q``, keep it or replace it; the token must have law ``p`` (Leviathan App. A.1);
* ``fn(p [V], q [V]) -> [V]``, as [`minispec.residual`][minispec.core.speculative.residual]:
  ``norm(max(0, p - q))``;
* ``fn(p [..., V], q [..., V]) -> [...]``, as
  [`theory.acceptance_rate`][minispec.core.theory.acceptance_rate]: ``beta = sum min(p, q)``;
* ``fn(logits [V], temperature, top_k, top_p) -> [V]``, as
  [`minispec.probs_from_logits`][minispec.core.sampling.probs_from_logits]: the distribution a
  decoding mode samples from (Leviathan §2.2);
* ``fn(alpha, gamma, c, r) -> float``, as
  [`theory.walltime_speedup`][minispec.core.theory.walltime_speedup]: the expected tokens of a
  round over its cost (Theorem 3.8).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.check import harness
from minispec.check.harness import GRADE_BUDGET, TIMEOUT, Failure, call, exact, run_cases, run_table
from minispec.check.report import CheckReport, Counterexample, fmt
from minispec.check.statistics import BUDGET, expect_law, hoeffding_excess, per_test_alpha
from minispec.core.sampling import SamplingParams, probs_from_logits
from minispec.core.theory import acceptance_rate, expected_tokens, walltime_speedup


def _t(values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float32)


#: The (name, p, q, samples) cases of the sampler check: every regime of the accept rule.
PAIRS: list[tuple[str, Tensor, Tensor, int]] = [
    ("p and q overlap; p(3) = 0 < q(3)", _t([0.5, 0.3, 0.2, 0.0]), _t([0.1, 0.2, 0.3, 0.4]), 3000),
    ("q piled on one token", _t([0.25, 0.25, 0.25, 0.25]), _t([0.7, 0.1, 0.1, 0.1]), 2000),
    ("p == q: every proposal kept", _t([0.4, 0.3, 0.2, 0.1]), _t([0.4, 0.3, 0.2, 0.1]), 1000),
    ("disjoint supports: every proposal replaced", _t([0.6, 0.4, 0.0, 0.0]),
     _t([0.0, 0.0, 0.5, 0.5]), 1000),
    ("one-hot p (temperature 0)", _t([0.0, 0.0, 1.0, 0.0]), _t([0.3, 0.3, 0.2, 0.2]), 300),
]


def _draw(fn: Callable, p: Tensor, q: Tensor, g: torch.Generator) -> tuple[int, bool]:
    inputs = {"p": p, "q": q}
    out = call(fn, p.clone(), q.clone(), g, inputs=inputs)
    try:
        token, accepted = out if isinstance(out, (tuple, list)) else ()   # never a generator
        token, accepted = harness.as_int(token), bool(accepted)
    except (TypeError, ValueError, RuntimeError):   # RuntimeError: bool of a many-element tensor
        token = None
    if token is None:
        raise Failure(Counterexample("the result must be (token, accepted) with an integer token "
                                     f"id and one flag, got {out!r}", inputs))
    if not 0 <= token < p.shape[0]:
        raise Failure(Counterexample(f"token {token} is not in [0, V = {p.shape[0]})", inputs))
    return token, accepted


def _law_case(fn: Callable, name: str, p: Tensor, q: Tensor, n: int, alpha: float, seed: int):
    def case() -> str:
        g = torch.Generator().manual_seed(seed)
        counts, accepted = torch.zeros(p.shape[0]), 0
        for _ in range(n):
            token, acc = _draw(fn, p, q, g)
            counts[token] += 1
            accepted += acc
        inputs = {"p": p, "q": q, "samples": n}
        fitted = expect_law(counts, p, alpha, "the emitted token does not have the target's law p",
                            inputs)
        beta = float(torch.minimum(p, q).sum())
        bound = 0.0 if beta == 0 else n * beta + hoeffding_excess(n, alpha)
        if beta < 1 and accepted > bound:
            raise Failure(Counterexample(
                "'accepted' is True more often than any lossless rule allows: a proposal can be "
                "kept with probability at most sum min(p, q) (Leviathan Thm 3.5)", inputs,
                [("P(accepted)", beta, accepted / n)], "accepted count", accepted, bound))
        return f"{n} samples, p-value {fmt(fitted.pvalue)}"

    return name, case


def sampler(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
            budget: float = GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(p, q, generator) -> (token, accepted)`` emits tokens with law ``p``.

    Five ``(p, q)`` pairs over ``V = 4`` tokens (``PAIRS``) cover every regime of the accept rule:
    partial overlap with a zero of ``p`` where ``q > 0``, ``q`` piled on one token, ``p == q``,
    disjoint supports, one-hot ``p``. For each, 300 to 3000 calls; the token counts are compared
    with ``p`` (Pearson chi-square), and the ``accepted`` flags with the largest acceptance any
    lossless rule can have, ``sum min(p, q)`` (Hoeffding bound). A last case runs the function
    twice with generators seeded alike: the tokens must be identical (the seed is honoured).
    Lossless rules other than Leviathan's pass (e.g. accept ``x`` with probability ``p(x)``).

    **False alarms.** 10 tests (a chi-square and an acceptance bound per pair) share the budget
    ``1e-3``: each runs at ``alpha = 2.5e-5`` (Bonferroni on a quarter of the budget; the
    Hoeffding bound is exact, the chi-square's approximation is covered by the rest, see
    [`minispec.check.statistics`][minispec.check.statistics]). Observing a token with ``p = 0``
    is a certain failure. So a correct sampler fails for at most 1 seed in 1000.

    **Sample sizes.** 3000 samples detect a change of 0.05 in one token's probability (the
    smallest effect among the lab's sampler bugs is several times larger) with the statistic far
    above its threshold; the whole check makes about 7300 calls (a few seconds).

    Args:
        fn: the sampler under test.
        seed: seeds the generator handed to ``fn``.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    alpha = per_test_alpha(2 * len(PAIRS))
    cases = [_law_case(fn, name, p, q, n, alpha, seed + i)
             for i, (name, p, q, n) in enumerate(PAIRS)]
    _, p, q, _ = PAIRS[0]
    cases.append(harness.same_seed(lambda g: [_draw(fn, p, q, g)[0] for _ in range(40)], seed,
                                   {"p": p, "q": q}))
    return run_cases("sampler", cases, BUDGET, timeout, budget)


#: The sampler's pairs and one-hot corners: every regime of one position, as ``(p, q)``.
CORNERS: list[tuple[Tensor, Tensor]] = [(p, q) for _, p, q, _ in PAIRS] + [
    (_t([0, 1, 0]), _t([0, 1, 0])), (_t([0, 1, 0]), _t([1, 0, 0])),
    (_t([0.5, 0.5, 0]), _t([0, 0, 1]))]


def _random_pairs(g: torch.Generator, *shape: int) -> tuple[Tensor, Tensor]:
    """Random ``p`` and ``q`` of shape ``[*shape]`` (the last is ``V``), about a quarter of their
    entries 0 (token 0 never is, so that every row is a distribution)."""
    logits = torch.randn(*shape[:-1], 2, shape[-1], generator=g) * 1.5
    logits[torch.rand(logits.shape, generator=g) < 0.25] = float("-inf")
    logits[..., 0] = logits[..., 0].nan_to_num(neginf=0.0)             # keep a token in each
    probs = torch.softmax(logits, dim=-1)
    return probs[..., 0, :], probs[..., 1, :]


def _residual_case(fn: Callable, p: Tensor, q: Tensor) -> None:
    excess = (p.double() - q.double()).clamp_min(0)
    none = excess.sum() == 0        # p == q: never used, but must still be a distribution
    inputs: dict[str, Any] = {"p": p, "q": q}
    got = exact(fn, (p, q), inputs, excess / excess.sum().clamp_min(1e-30),
                "the result is not norm(max(0, p - q))", f"a real floating-point [V] = "
                f"[{p.shape[0]}] tensor", math.inf if none else 1e-5, tensor=True)
    if none and not (got.isfinite().all() and (got >= 0).all() and abs(got.sum() - 1) < 1e-4):
        raise Failure(Counterexample(
            "when p == q there is no excess (a rejection never happens), but the result must "
            "still be a distribution: no NaN (never divide by zero), >= 0, summing to 1",
            dict(inputs, returned=got)))


def residual(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
             budget: float = GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(p, q)`` returns the residual ``norm(max(0, p - q))`` ``[V]``.

    Deterministic: 20 pairs (the sampler's, one-hot corners, 12 random pairs with zeros) are
    compared with the exact residual within ``1e-5``. When ``p == q`` the residual is never used
    (no rejection can happen), so any distribution is accepted there, but not NaN. The inputs must
    not be modified. There is no randomness, hence no false alarm.

    Args:
        fn: the residual under test.
        seed: seeds the random pairs.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    p, q = _random_pairs(torch.Generator().manual_seed(seed), 12, 6)
    pairs = CORNERS + list(zip(p, q, strict=True))
    return run_table("residual", _residual_case, fn,
                     [(f"the residual of {len(pairs)} (p, q) pairs", pairs)], "exact within 1e-5",
                     timeout, budget)


def _acceptance_case(fn: Callable, p: Tensor, q: Tensor) -> None:
    inputs: dict[str, Any] = {"p": p, "q": q} if p.ndim == 1 else {"p, q": f"{list(p.shape)} "
                                                                    "tensors (seeded)"}
    want = acceptance_rate(p.double(), q.double())                           # [...]
    exact(fn, (p, q), inputs, want, "the result is not beta = sum_x min(p(x), q(x))",
          f"one number per pair of rows, of shape {list(want.shape)} (the last dimension "
          "summed)", label=lambda i: "beta" if p.ndim == 1 else f"beta of row {i}")


def acceptance(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
               budget: float = GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(p, q)`` returns the acceptance probability ``beta = sum_x min(p(x), q(x))``.

    Leviathan et al.'s Theorem 3.5 (``1 - beta`` is ``D_LK``, Lemma 3.3). Deterministic, against
    [`theory.acceptance_rate`][minispec.core.theory.acceptance_rate]:

    1. the 8 pairs of ``CORNERS`` (``p == q`` gives 1, disjoint supports 0, a one-hot ``p``
       gives ``q`` at its token; overlap, zeros of ``p`` where ``q > 0``), one ``[V]`` pair each;
    2. seeded batches ``[16, 6]`` and ``[2, 3, 5]`` with zeros: one ``beta`` per row, over the
       last dimension only (the result has shape ``[16]``, ``[2, 3]``).

    A result within ``1e-5`` of the exact value passes: the inputs are float32, whose rounding
    over 6 terms is below ``1e-6``, while a wrong formula (``sum p q``, ``max``, ``1 - beta``, a
    sum over the whole batch) is off by more than ``0.01`` on some case. Any correct formula
    passes (``1 - sum |p - q| / 2`` too). The inputs must not be modified. No randomness in the
    verdict, hence no false alarm.

    Args:
        fn: the acceptance rate under test.
        seed: seeds the random batches.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    g = torch.Generator().manual_seed(seed)
    groups = {f"{len(CORNERS)} pairs of [V] distributions: every regime": CORNERS,
              "batches [16, 6] and [2, 3, 5]: one beta per row": [_random_pairs(g, 16, 6),
                                                                  _random_pairs(g, 2, 3, 5)]}
    return run_table("acceptance", _acceptance_case, fn, list(groups.items()),
                     "exact within 1e-5", timeout, budget)


#: Logits with two tied maxima (3.0) and a tied pair (2.0): top-k keeps every logit tied with the
#: k-th largest, temperature 0 picks the first of the maxima.
TIED = _t([1.0, 3.0, 0.5, 3.0, 2.0, 2.0, -1.0, 0.0])
#: Logits with a heavy tail: top-p after top-k (on the 3 largest, renormalised) keeps fewer tokens
#: than top-p before it (on all 8) would.
TAIL = _t([3.0, 2.5, 2.0, 1.5, 1.5, 1.5, 1.5, 1.5])


def _nucleus(logits: Tensor, temperature: float, top_k: int, j: int) -> float:
    """A ``top_p`` that keeps exactly the ``j + 1`` likeliest tokens (after temperature and top-k):
    halfway between the mass of the ``j`` and of the ``j + 1`` likeliest, far from both edges."""
    probs = probs_from_logits(logits, SamplingParams(temperature, top_k)).double()
    mass = torch.cat([torch.zeros(1, dtype=torch.float64), probs.sort(descending=True).values
                      .cumsum(0)])
    return float(mass[j] + mass[j + 1]) / 2


def _adjust_cases(seed: int) -> list[tuple[str, list[tuple[Tensor, float, int, float]]]]:
    """Named groups of ``(logits [8], temperature, top_k, top_p)``, from seeded logits, ``TIED``
    and ``TAIL``; no ``top_p`` lies near an edge of the nucleus (ties there would be ambiguous)."""
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(8, generator=g) * 2 for _ in range(8)]
    mixed = [(x[5], 0.7, 5, 2), (x[6], 1.8, 6, 3), (x[7], 0.5, 4, 1), (TAIL, 1.0, 3, 1)]
    return [
        ("temperature: softmax(logits / T)", [(x[0], t, 0, 1.0) for t in (0.3, 1.0, 2.5)]),
        ("temperature 0: one-hot at the argmax, the first of tied maxima",
         [(TIED, 0.0, 0, 1.0), (x[1], 0.0, 3, 0.5)]),
        ("top-k: the k largest logits and every logit tied with the k-th",
         [(TIED, 1.0, k, 1.0) for k in (1, 2, 3, 5, 8, 12)] + [(x[2], 0.8, 3, 1.0)]),
        ("top-p: the smallest prefix of the sorted tokens whose mass reaches top_p",
         [(x[3], 1.0, 0, 1e-9), (x[3], 1.0, 0, 1.0)]
         + [(x[4], 1.0, 0, _nucleus(x[4], 1.0, 0, j)) for j in range(1, 6)]),
        ("all three, in order: temperature, then top-k, then top-p",
         [(z, t, k, _nucleus(z, t, k, j)) for z, t, k, j in mixed]),
    ]


def _adjust_case(fn: Callable, logits: Tensor, temperature: float, top_k: int,
                 top_p: float) -> None:
    inputs = {"logits": logits, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    exact(fn, (logits, temperature, top_k, top_p), inputs,
          probs_from_logits(logits, SamplingParams(temperature, top_k, top_p)).double(),
          "the result is not the adjusted distribution (temperature, then top-k, then "
          "top-p, then softmax)", f"a [V] = [{len(logits)}] tensor of probabilities")


def adjustment(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
               budget: float = GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(logits, temperature, top_k, top_p)`` returns the adjusted distribution.

    Standardized sampling (Leviathan §2.2): every decoding mode samples from an adjusted
    distribution, computed as [`probs_from_logits`][minispec.core.sampling.probs_from_logits] does:
    divide by the temperature (0: one-hot at the first argmax); keep the ``top_k`` largest logits
    and every logit tied with the ``k``-th (0, or ``k >= V``: all); sort, and drop each token once
    the mass strictly before it reaches ``top_p`` (1: none); softmax. Deterministic: 23 cases
    over 8 tokens in five groups (``_adjust_cases``): temperature alone; temperature 0 with
    tied maxima; top-k through ties and past ``V``; top-p from ``1e-9`` (the top token) to 1;
    the three together, where their order matters.

    Each token's probability must be within ``1e-5`` of the exact one: float32 rounding of a
    softmax over 8 tokens is below ``1e-6``, and every ``top_p`` keeps a fixed number of tokens
    with a margin of at least half a token's mass, so a correct computation in float32 or float64
    cannot drop or keep another token; a wrong rule moves a token by far more. The logits must not
    be modified. No randomness in the verdict, hence no false alarm.

    Args:
        fn: the adjustment under test.
        seed: seeds the random logits.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    return run_table("adjustment", _adjust_case, fn, _adjust_cases(seed),
                     "{n} cases within 1e-5", timeout, budget)


def _speedup_cases(seed: int) -> list[tuple[str, list[tuple[float, int, float, float]]]]:
    """Named groups of ``(alpha, gamma, c, r)``: the edges of the formula, then a seeded grid
    (``alpha`` in ``[0, 0.99)``, ``gamma`` in ``0..12``, ``c`` in ``[0, 0.5)``, ``r`` in
    ``[1, 3)``)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(200, 3, generator=g, dtype=torch.float64).tolist()
    gammas = torch.randint(0, 13, (200,), generator=g).tolist()
    grid = [(0.99 * a, k, 0.5 * c, 1 + 2 * r) for (a, c, r), k in zip(u, gammas, strict=True)]
    return [
        ("Equation (1): c = 0 and r = 1 leave the expected tokens per round",
         [(a, k, 0.0, 1.0) for a in (0.2, 0.6, 0.9) for k in (1, 3, 8)]),
        ("alpha = 1: every draft is accepted, gamma + 1 tokens a round",
         [(1.0, 0, 0.1, 1.0), (1.0, 1, 0.05, 1.2), (1.0, 4, 0.0, 1.0), (1.0, 10, 0.2, 2.0)]),
        ("alpha = 0: one token a round", [(0.0, k, 0.1, 1.3) for k in (0, 1, 5)]),
        ("gamma = 0: plain decoding, one token per verify, 1 / r",
         [(0.5, 0, 0.3, 1.0), (0.9, 0, 0.3, 1.7)]),
        (f"{len(grid)} seeded (alpha, gamma, c, r)", grid),
    ]


def _speedup_case(fn: Callable, alpha: float, gamma: int, c: float, r: float) -> None:
    want = walltime_speedup(alpha, gamma, c, r)
    exact(fn, (alpha, gamma, c, r), {"alpha": alpha, "gamma": gamma, "c": c, "r": r},
          torch.tensor(want, dtype=torch.float64), "the result is not the expected tokens per "
          "round over the cost of a round in target steps, (1 - alpha^(gamma+1)) / ((1 - alpha) "
          f"(gamma c + r)): here {expected_tokens(alpha, gamma):.6g} tokens for "
          f"{gamma * c + r:.6g} steps", "a number", 1e-4 * want, lambda i: "speedup")


def speedup(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
            budget: float = GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(alpha, gamma, c, r)`` returns the expected walltime speedup of a round.

    Leviathan et al.'s Theorem 3.8 with the verify cost ``r`` (1 in the paper): a round of
    ``gamma`` drafts yields ``(1 - alpha^(gamma+1)) / (1 - alpha)`` tokens on average (Equation
    (1); ``gamma + 1`` at ``alpha = 1``) and costs ``gamma c + r`` target steps, where plain
    decoding makes one token per target step. Deterministic, against
    [`theory.walltime_speedup`][minispec.core.theory.walltime_speedup]: 18 edge cases (``c = 0``
    and ``r = 1``; ``alpha = 1``, where the closed form is ``0 / 0``; ``alpha = 0``;
    ``gamma = 0``) and a seeded grid of 200 (``_speedup_cases``).

    A result within a relative ``1e-4`` passes: the formula is computed in float64 to about
    ``1e-14`` on these cases and in float32, even as the closed form (``1 - alpha >= 0.01`` on
    the grid), to about ``1e-6``, while a wrong formula (``alpha^gamma``, no ``r``, ``gamma + 1``
    draft steps) is off by more than ``1e-2`` relative on some case. No randomness in the
    verdict, hence no false alarm.

    Args:
        fn: the speedup formula under test.
        seed: seeds the grid.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    return run_table("speedup", _speedup_case, fn, _speedup_cases(seed),
                     "{n} within a relative 1e-4", timeout, budget)
