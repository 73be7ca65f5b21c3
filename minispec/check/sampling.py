"""Grade a student's single-token speculative sampler and residual.

* ``fn(p [V], q [V], generator) -> (token, accepted)``, as
  [`minispec.speculative_sample`][minispec.core.speculative.speculative_sample]: draw a proposal
  from ``q``, keep it or replace it; the token must have law ``p`` (Leviathan App. A.1);
* ``fn(p [V], q [V]) -> [V]``, as [`minispec.residual`][minispec.core.speculative.residual]:
  ``norm(max(0, p - q))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.check.harness import TIMEOUT, Failure, as_int, call, expect_law, run_cases, same_seed
from minispec.check.report import CheckReport, Counterexample, fmt
from minispec.check.statistics import BUDGET, hoeffding_excess, per_test_alpha


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
        token, accepted = as_int(token), bool(accepted)
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


def sampler(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT) -> CheckReport:
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

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    alpha = per_test_alpha(2 * len(PAIRS))
    cases = [_law_case(fn, name, p, q, n, alpha, seed + i)
             for i, (name, p, q, n) in enumerate(PAIRS)]
    _, p, q, _ = PAIRS[0]
    cases.append(same_seed(lambda g: [_draw(fn, p, q, g)[0] for _ in range(40)], seed,
                           {"p": p, "q": q}))
    return run_cases("sampler", cases, BUDGET, timeout)


def _residual_pairs(seed: int) -> list[tuple[Tensor, Tensor]]:
    """The sampler's pairs, one-hot corner cases, and random pairs over 6 tokens with zeros."""
    pairs = [(p, q) for _, p, q, _ in PAIRS]
    pairs += [(_t([0, 1, 0]), _t([0, 1, 0])), (_t([0, 1, 0]), _t([1, 0, 0])),
              (_t([0.5, 0.5, 0]), _t([0, 0, 1]))]
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, 2, 6, generator=g) * 1.5                   # 12 pairs (p, q)
    logits[torch.rand(12, 2, 6, generator=g) < 0.25] = float("-inf")
    logits[..., 0] = logits[..., 0].nan_to_num(neginf=0.0)             # keep a token in each
    return pairs + [(p, q) for p, q in torch.softmax(logits, dim=-1)]


def _residual_case(fn: Callable, p: Tensor, q: Tensor) -> None:
    inputs: dict[str, Any] = {"p": p, "q": q}
    p_in, q_in = p.clone(), q.clone()
    out = call(fn, p_in, q_in, inputs=inputs)
    if not torch.equal(p_in, p) or not torch.equal(q_in, q):
        raise Failure(Counterexample("the function changed its inputs in place", inputs))
    if not isinstance(out, Tensor) or out.shape != p.shape or not out.is_floating_point():
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise Failure(Counterexample(f"the result must be a real floating-point [V] = "
                                     f"[{p.shape[0]}] tensor, got {got}", inputs))
    out, excess = out.double(), (p.double() - q.double()).clamp_min(0)
    inputs["returned"] = out
    if excess.sum() == 0:           # p == q: never used, but must still be a distribution
        if not (out.isfinite().all() and (out >= 0).all() and abs(float(out.sum()) - 1) < 1e-4):
            raise Failure(Counterexample(
                "when p == q there is no excess (a rejection never happens), but the result must "
                "still be a distribution: no NaN (never divide by zero), >= 0, summing to 1",
                inputs))
        return
    expected = excess / excess.sum()
    if not out.isfinite().all() or (out - expected).abs().max() > 1e-5:
        table = [(f"token {i}", float(expected[i]), float(out[i])) for i in range(p.shape[0])]
        raise Failure(Counterexample("the result is not norm(max(0, p - q))", inputs, table))


def residual(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT) -> CheckReport:
    """Check that ``fn(p, q)`` returns the residual ``norm(max(0, p - q))`` ``[V]``.

    Deterministic: 20 pairs (the sampler's, one-hot corners, 12 random pairs with zeros) are
    compared with the exact residual within ``1e-5``. When ``p == q`` the residual is never used
    (no rejection can happen), so any distribution is accepted there, but not NaN. The inputs must
    not be modified. There is no randomness, hence no false alarm.

    Args:
        fn: the residual under test.
        seed: seeds the random pairs.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    pairs = _residual_pairs(seed)

    def case() -> str:
        for p, q in pairs:
            _residual_case(fn, p, q)
        return "exact within 1e-5"

    return run_cases("residual", [(f"the residual of {len(pairs)} (p, q) pairs", case)], 0.0,
                     timeout)
