"""Buggy single-token samplers and residuals: each a classic mistake or a reported engine bug.

Every function has the signature its check expects: ``fn(p, q, generator) -> (token, accepted)``
for [`check.sampler`][minispec.check.sampling.sampler], ``fn(p, q) -> [V]`` for
[`check.residual`][minispec.check.sampling.residual]. Each is written as a student would write the
correct one, with the one mistake its docstring names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minispec.core.sampling import SamplingParams, probs_from_logits
from minispec.core.speculative import residual, speculative_sample


def _propose(q: Tensor, generator: torch.Generator, keep: Callable[[Tensor, int], bool],
             replacement: Tensor) -> tuple[int, bool]:
    """Draw ``x ~ q`` and ``u ~ U(0, 1)``: keep ``x`` when ``keep(u, x)``, else draw from
    ``replacement``. The right rule is ``keep = u q(x) < p(x)``, ``replacement = norm(max(0, p -
    q))``; each bug below gets one of the two wrong."""
    x = int(torch.multinomial(q, 1, generator=generator))
    if keep(torch.rand((), generator=generator), x):
        return x, True
    return int(torch.multinomial(replacement, 1, generator=generator)), False


def sample_resample_from_p(p: Tensor, q: Tensor, generator: torch.Generator) -> tuple[int, bool]:
    """Bug: after a rejection, draw the replacement from ``p`` instead of the residual.

    The classic first attempt. The output law becomes ``min(p, q) + (1 - beta) p``: tokens where
    ``q`` is generous are over-represented, since they are both accepted and resampled (lesson 01:
    "naive resampling from p is biased; the residual is the unique fix").
    """
    return _propose(q, generator, lambda u, x: u * q[x] < p[x], p)


def sample_ratio_q_over_p(p: Tensor, q: Tensor, generator: torch.Generator) -> tuple[int, bool]:
    """Bug: the acceptance ratio upside down, ``u < q(x) / p(x)``.

    Mirrors the p/q naming swap between papers and code (gpt-fast calls the draft ``p``): the
    drafts the target likes *less* are the ones kept.
    """
    return _propose(q, generator, lambda u, x: u * p[x] < q[x], residual(p, q))


def sample_residual_q_minus_p(p: Tensor, q: Tensor, generator: torch.Generator) -> tuple[int, bool]:
    """Bug: the residual taken the wrong way round, ``norm(max(0, q - p))``.

    After a rejection this draws where the *draft* had excess mass, including tokens the target
    gives probability 0: the check sees an impossible token.
    """
    return _propose(q, generator, lambda u, x: u * q[x] < p[x], residual(q, p))


def sample_top_p_on_draft_only(p: Tensor, q: Tensor, generator: torch.Generator,
                               top_p: float = 0.7) -> tuple[int, bool]:
    """Bug: a sampling adjustment (top-p) applied to one side of the ratio test only.

    The proposal is drawn from ``q``, but the ratio and the residual use ``q`` filtered to its
    top-p nucleus and renormalised: the ``q`` the verifier sees is not the one the token came
    from. Mirrors vLLM PR #10198 (https://github.com/vllm-project/vllm/pull/10198), where the
    draft probabilities went through top-p and the target probabilities did not.
    """
    q_seen = probs_from_logits(q.log(), SamplingParams(temperature=1.0, top_p=top_p))
    return _propose(q, generator, lambda u, x: u * q_seen[x] < p[x], residual(p, q_seen))


def sample_seed_ignored(p: Tensor, q: Tensor, generator: torch.Generator) -> tuple[int, bool]:
    """Bug: correct maths, but random numbers from torch's global generator, not the one given.

    The law is right, so a law test alone cannot see it; the output just does not depend on the
    request's seed. Mirrors vLLM #6038 (https://github.com/vllm-project/vllm/issues/6038) and
    #13196 (https://github.com/vllm-project/vllm/issues/13196): speculative decoding ignored the
    per-request seed.
    """
    return speculative_sample(p, q, None)


def residual_q_minus_p(p: Tensor, q: Tensor) -> Tensor:
    """Bug: ``norm(max(0, q - p))``: the draft's excess instead of the target's."""
    return residual(q, p)


def residual_unnormalised(p: Tensor, q: Tensor) -> Tensor:
    """Bug: ``max(0, p - q)`` without the normalisation (its mass is ``1 - beta``, not 1)."""
    return (p - q).clamp_min(0)


def residual_nan_when_equal(p: Tensor, q: Tensor) -> Tensor:
    """Bug: divides by ``sum max(0, p - q)`` without a guard: NaN when ``p == q``.

    A DESIGN.md pitfall ("residual when p == q: never divide by zero"); in a batched verify the
    NaN row poisons the whole batch even though that row is never sampled.
    """
    excess = (p - q).clamp_min(0)
    return excess / excess.sum()
