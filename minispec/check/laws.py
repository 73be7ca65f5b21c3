"""The exact laws a lesson tests a decoder's output against, and the test itself.

Lessons 04 and 06 ask the same question of two drafters: do the first tokens that
``speculative_generate`` emits follow the target's law? The law is computed exactly from the
target's logits (no sampling), the outcomes are counted over seeded runs, and Pearson's test
compares the two. These helpers are that harness, written once:

* [`next_token_probs`][minispec.check.laws.next_token_probs] -- the adjusted next-token
  distribution after each prefix, from one forward;
* [`first_tokens_law`][minispec.check.laws.first_tokens_law] -- the law of the first token and of
  the first two tokens, with rare pairs grouped so that every cell is testable;
* ``chi_square``, ``law_test`` and ``tv_tolerance`` -- Pearson's test of outcomes against a law
  (cells expected fewer than 5 times pooled into one, Cochran's rule), the same on a table of
  counts against a table of probabilities (lessons 03 and 09), and a total-variation tolerance:
  re-exported from [`minispec.check.statistics`][minispec.check.statistics], the one statistics
  module of the graders and the lessons.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from minispec.check.statistics import chi_square, law_test, tv_tolerance
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
