"""Grade a student's verifier under a grammar, by the law of the emitted stream:

    masked_verifier:  fn(draft_tokens [k], draft_probs [k, V], target_probs [k+1, V],
                         masks [k+1, V] bool, g) -> the emitted tokens

``target_probs`` and ``draft_probs`` are the models' own (unmasked) laws; ``masks[i]`` says which
tokens the grammar allows after the context and the first ``i`` drafts. The drafts were drawn from
``q`` *masked* and renormalized, and the emitted stream must have the law of ``p`` masked and
renormalized at every position: mask both, then verify as usual.

The models are Markov chains over ``V = 4`` tokens (``p(. | context) = P[last token]``) and so is
the grammar (``masks`` follow the last token: token ``t`` may never follow itself, and token 3
never follows 0). The target's law over the first ``L = 3`` tokens is a product of masked rows,
enumerable over all 64 sequences. ``Q`` puts much of its mass on forbidden tokens, so a verifier
that masks ``p`` but not ``q`` accepts too often (a shifted law); one that masks ``q`` but not ``p``
resamples forbidden tokens (caught outright).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from minispec.check.harness import TIMEOUT, Failure, as_tokens, call, run_cases
from minispec.check.report import CheckReport, Counterexample
from minispec.check.statistics import BUDGET, expect_law

__all__ = ["masked_verifier"]

V, K, LENGTH = 4, 2, 3
#: Streams of the law test: a verifier that skips the mask on ``q`` shifts the law so far that
#: 1,000 streams reject it at p-values near 1e-70, far below the level ``BUDGET``; a correct one
#: fails with probability ``BUDGET``.
STREAMS = 1000
P = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.3, 0.1, 0.3, 0.3], [0.25, 0.25, 0.25, 0.25],
                  [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
Q = torch.tensor([[0.5, 0.1, 0.1, 0.3], [0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.6, 0.1],
                  [0.3, 0.3, 0.1, 0.3]], dtype=torch.float64)
#: ``MASKS[s, t]``: may token ``t`` follow token ``s``.
MASKS = ~torch.eye(V, dtype=torch.bool)
MASKS[0, 3] = False


def _masked(rows: Tensor, masks: Tensor) -> Tensor:
    out = rows * masks
    return out / out.sum(-1, keepdim=True)


def law() -> Tensor:
    """The masked target's law over the first ``LENGTH`` tokens after token 0, ``(V**LENGTH,)``."""
    p = _masked(P, MASKS)
    probs = torch.zeros(V**LENGTH, dtype=torch.float64)
    for i, seq in enumerate(itertools.product(range(V), repeat=LENGTH)):
        last, prob = 0, 1.0
        for t in seq:
            prob, last = prob * float(p[last, t]), t
        probs[i] = prob
    return probs


def _round(fn: Callable, last: int, g: torch.Generator) -> list[int]:
    """One round after token ``last``: ``K`` drafts from masked ``q``, the student's verdict."""
    q, drafts, context = _masked(Q, MASKS), [], last
    for _ in range(K):
        context = int(torch.multinomial(q[context], 1, generator=g))
        drafts.append(context)
    path = [last, *drafts]
    args = (torch.tensor(drafts), Q[path[:-1]].float(), P[path].float(), MASKS[path], g)
    inputs = {"last": last, "draft_tokens": drafts}
    out = as_tokens(call(fn, *args, inputs=inputs), inputs, K + 1)
    if not out:
        raise Failure(Counterexample("it emitted no token (a round emits at least one)", inputs))
    for before, token in zip([last, *out], out, strict=False):
        if not 0 <= token < V or not MASKS[before, token]:
            raise Failure(Counterexample(f"it emitted token {token} after {before}, which the "
                                         "grammar forbids", dict(inputs, emitted=out)),
                          "forbidden token")
    return out


def _law_case(fn: Callable, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V**LENGTH, dtype=torch.float64)
    for _ in range(STREAMS):
        stream: list[int] = []
        while len(stream) < LENGTH:
            stream += _round(fn, stream[-1] if stream else 0, g)
        counts[sum(t * V**(LENGTH - 1 - i) for i, t in enumerate(stream[:LENGTH]))] += 1
    fitted = expect_law(counts, law(), BUDGET, f"the law of the first {LENGTH} emitted tokens is "
                        "not the masked target's", {"streams": STREAMS, "k": K}, _name)
    return f"{STREAMS} streams, p-value {fitted.pvalue:.2g}"


def _name(index: int) -> str:
    digits = [(index // V**(LENGTH - 1 - i)) % V for i in range(LENGTH)]
    return "tokens " + " ".join(map(str, digits))


def masked_verifier(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT) -> CheckReport:
    """Grade ``fn(draft_tokens, draft_probs, target_probs, masks, g)`` (module docstring): it never
    emits a forbidden token, and the emitted stream has the masked target's law.

    Fails a correct verifier with probability at most ``BUDGET`` (one law test at that level).
    """
    return run_cases("masked_verifier", [("the masked target's law, never a forbidden token",
                                          lambda: _law_case(fn, seed))], BUDGET, timeout)
