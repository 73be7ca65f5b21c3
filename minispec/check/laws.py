"""The exact laws a lesson tests a decoder's output against, and the test itself.

Lessons 04 and 06 ask the same question of two drafters: do the first tokens that
``speculative_generate`` emits follow the target's law? The law is computed exactly from the
target's logits (no sampling), the outcomes are counted over seeded runs, and Pearson's test
compares the two. These helpers are that harness, written once:

* [`next_token_probs`][minispec.check.laws.next_token_probs] -- the adjusted next-token
  distribution after each prefix, from one forward;
* [`first_tokens_law`][minispec.check.laws.first_tokens_law] -- the law of the first token and of
  the first two tokens, with rare pairs grouped so that every cell is testable;
* [`chi_square`][minispec.check.laws.chi_square] -- Pearson's test of outcomes against a law, with
  cells expected fewer than 5 times pooled into one (Cochran's rule);
* [`law_test`][minispec.check.laws.law_test] and
  [`tv_tolerance`][minispec.check.laws.tv_tolerance] -- the same test on a table of counts against a
  table of probabilities (lessons 03 and 09), with the total-variation distance and its tolerance.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

import torch

from minispec.check.statistics import chi_square_sf
from minispec.core.sampling import SamplingParams, probs_from_logits
from minispec.models.llama import Llama

__all__ = ["chi_square", "first_tokens_law", "law_test", "next_token_probs", "tv_tolerance"]


@torch.inference_mode()
def next_token_probs(model: Llama, prefixes: Sequence[Sequence[int]],
                     sampling: SamplingParams | None = None) -> torch.Tensor:
    """The adjusted next-token distribution after each prefix (all of one length), ``(B, V)``
    float64; ``sampling`` defaults to temperature 1."""
    sampling = sampling or SamplingParams(temperature=1.0)
    ids = torch.tensor([list(p) for p in prefixes], device=model.device)           # (B, L)
    positions = torch.arange(ids.shape[1], device=model.device).expand_as(ids)     # (B, L)
    return probs_from_logits(model(ids, positions)[:, -1], sampling).double().cpu()


def first_tokens_law(model: Llama, prompt: Sequence[int], n: int, exclude: Sequence[int] = (),
                     sampling: SamplingParams | None = None
                     ) -> tuple[torch.Tensor, dict[Hashable, float], dict[Hashable, float]]:
    """The exact law of the first token and of the first two tokens after ``prompt``.

    Args:
        model: the target.
        prompt: the context.
        n: the number of runs the law will be tested against: a first token ``a`` expected at
            least once gets its second token's law, and a pair ``(a, b)`` expected at least 5
            times gets its own cell; the rest of ``a``'s mass is the cell ``(a, "other")``.
        exclude: first tokens not continued (e.g. EOS, after which nothing is emitted).
        sampling: the adjustment applied to the logits (default: temperature 1).

    Returns:
        ``(p1, first_law, pair_law)``: the first token's distribution ``(V,)``, its law as a
        mapping ``token -> probability``, and the pair law ``{(a, b) or (a, "other"): prob}``.
    """
    p1 = next_token_probs(model, [prompt], sampling)[0]                            # (V,)
    likely = [a for a in range(len(p1)) if n * p1[a] >= 1 and a not in exclude]
    joint = p1[likely, None] * next_token_probs(model, [list(prompt) + [a] for a in likely],
                                                sampling)                          # (A, V)
    top = {(likely[i], b): joint[i, b].item() for i, b in (n * joint >= 5).nonzero().tolist()}
    pairs: dict[Hashable, float] = dict(top)
    for a in likely:                                    # "a, then anything else"
        pairs[a, "other"] = p1[a].item() - sum(p for (x, _), p in top.items() if x == a)
    return p1, {a: p1[a].item() for a in range(len(p1))}, pairs


def chi_square(outcomes: Sequence[Hashable], law: Mapping[Hashable, float],
               min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's test of ``outcomes`` against ``law`` (outcome -> probability).

    Outcomes expected at least ``min_expected`` times get a cell each; all others share one pooled
    cell. Returns ``(p-value, number of cells, smallest expected count)``.
    """
    n = len(outcomes)
    kept = {key: prob for key, prob in law.items() if n * prob >= min_expected}
    counts = Counter(key if key in kept else "pooled" for key in outcomes)
    observed = [counts[key] for key in kept] + [counts["pooled"]]
    expected = [n * prob for prob in kept.values()] + [n * (1 - sum(kept.values()))]
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    cells = sum(e > 0 for e in expected)
    return chi_square_sf(statistic, cells - 1), len(observed), min(expected)


def law_test(counts: torch.Tensor, law: torch.Tensor,
             min_expected: float = 5.0) -> tuple[float, float]:
    """Pearson's test of observed ``counts`` against the exact ``law``, both tables of one shape.

    Cells expected fewer than ``min_expected`` times are pooled into one; the law is renormalised in
    float64 (float32 tables sum to 1 only up to rounding). An outcome of probability 0 that was
    observed at all gives ``p = 0``: no amount of luck explains it.

    Returns:
        ``(p-value, TV)``: the chi-square p-value and the total-variation distance between the
        empirical law and ``law``.
    """
    counts, law = counts.double().flatten(), law.double().flatten()
    law = law / law.sum()
    n = float(counts.sum())
    tv = 0.5 * float((counts / n - law).abs().sum())
    if counts[law == 0].sum() > 0:                      # a token of probability 0 was emitted
        return 0.0, tv
    expected = n * law
    big = expected >= min_expected
    small = ~big & (law > 0)
    observed = counts[big].tolist() + ([float(counts[small].sum())] if small.any() else [])
    wanted = expected[big].tolist() + ([float(expected[small].sum())] if small.any() else [])
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True))
    return chi_square_sf(statistic, len(wanted) - 1), tv


def tv_tolerance(law: torch.Tensor, n: int, delta: float = 1e-6) -> float:
    """A total-variation distance that ``n`` correct draws from ``law`` exceed with probability
    below ``delta``.

    ``E[TV] <= 1/2 sum_i sqrt(pi_i (1 - pi_i) / n)`` (Jensen), and one draw moves TV by at most
    ``1/n``, so McDiarmid's inequality adds ``sqrt(ln(1/delta) / (2n))``.
    """
    law = law.double().flatten()
    mean_bound = 0.5 * float(torch.sqrt(law * (1 - law) / n).sum())
    return mean_bound + (math.log(1 / delta) / (2 * n)) ** 0.5
