"""Toy language models whose output law is known exactly: Markov chains over a few tokens.

The verifier graders run a student's accept rule for many rounds on a target ``p`` and a draft
``q`` that are *Markov chains*: ``p(. | context) = P[last token]``, ``q(. | context) =
Q[last token]``. The target's law over the first ``L`` emitted tokens is then a product,
``prod_t P[x_{t-1}, x_t]``, enumerable over all ``V^L`` sequences. A lossless speculative
decoder must reproduce it exactly, whatever ``q`` is, over *several rounds*: a bug in the bonus
token, in the uniforms shared between positions or rounds, or in what happens after a rejection
changes this joint law even when the first token's law is right.

``V = 3`` tokens and ``L = 4`` keep the table small (81 sequences) while still needing 2 to 4
rounds per stream (a round emits 1 to ``k + 1`` tokens). ``P`` has a zero (token 2 is never
followed by 0) so an implementation that can emit an impossible token is caught outright.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from minispec.check.report import Case, Counterexample, fmt
from minispec.check.statistics import Fit, fit

__all__ = ["GREEDY", "SAMPLED", "Chain", "decode", "encode", "law_case", "run_streams"]


@dataclass(frozen=True)
class Chain:
    """A Markov target ``P`` and draft ``Q`` (both ``(V, V)``, row ``x`` = next-token law after
    ``x``), and the token the context ends with."""

    P: Tensor
    Q: Tensor
    start: int = 0

    @property
    def vocab(self) -> int:
        """``V``, the number of tokens."""
        return self.P.shape[-1]

    def law(self, length: int) -> Tensor:
        """The target's exact law of the first ``length`` tokens, ``(V**length,)`` float64,
        indexed by [`encode`][minispec.check.markov.encode]."""
        V = self.vocab
        probs = torch.zeros(V ** length, dtype=torch.float64)
        for seq in itertools.product(range(V), repeat=length):
            prob, last = 1.0, self.start
            for x in seq:
                prob, last = prob * float(self.P[last, x]), x
            probs[encode(seq, V)] = prob
        return probs

    def rows(self, last: int, tokens: list[int]) -> Tensor:
        """Target rows ``(len(tokens) + 1, V)`` float32: ``p`` after ``last``, after each token."""
        return self._p32[[last] + list(tokens)]

    @functools.cached_property
    def _p32(self) -> Tensor:
        return self.P.float()

    @functools.cached_property
    def _cdf(self) -> list[list[float]]:
        return torch.cumsum(self.Q, dim=-1).tolist()

    def draft(self, last: int, k: int, generator: torch.Generator,
              sampled: bool) -> tuple[list[int], Tensor | None]:
        """``k`` drafts after ``last``: sampled from ``Q`` (with their rows ``(k, V)``), or the
        deterministic argmax chain of ``Q`` (rows ``None``: one-hot ``q``)."""
        before, tokens = [last], []
        if sampled:             # inverse CDF: one generator call per round, not one per draft
            cdf = self._cdf
            for u in torch.rand(k, generator=generator, dtype=torch.float64).tolist():
                x = next((v for v, c in enumerate(cdf[before[-1]]) if u < c), self.vocab - 1)
                while self.Q[before[-1], x] == 0:     # never a token q excludes (rounding)
                    x -= 1
                tokens.append(x)
                before.append(x)
        else:
            for _ in range(k):
                tokens.append(int(self.Q[before[-1]].argmax()))
                before.append(tokens[-1])
        return tokens, (self.Q[before[:-1]].float() if sampled else None)


def encode(seq, vocab: int) -> int:
    """Index of a token sequence in a ``(V**L,)`` law (first token most significant)."""
    index = 0
    for x in seq:
        index = index * vocab + int(x)
    return index


def decode(index: int, vocab: int, length: int) -> str:
    """The sequence at ``index`` of a ``(V**length,)`` law, as ``"0 2 1 1"``."""
    seq = []
    for _ in range(length):
        index, x = divmod(index, vocab)
        seq.append(x)
    return " ".join(str(x) for x in reversed(seq))


def run_streams(round_fn: Callable[[int], list[int]], chain: Chain, n: int,
                length: int) -> tuple[Tensor, Tensor]:
    """Decode ``n`` streams of ``length`` tokens, one speculative round after another.

    Args:
        round_fn: one round after the given last token; returns the emitted tokens.
        chain: the toy models (its ``start`` is the last context token).
        n: how many independent streams.
        length: tokens kept per stream (the last round's extra tokens are dropped).

    Returns:
        ``(joint, first)``: counts over the ``V**length`` sequences and over the first token.
    """
    V = chain.vocab
    joint = torch.zeros(V ** length, dtype=torch.float64)
    first = torch.zeros(V, dtype=torch.float64)
    for _ in range(n):
        tokens: list[int] = []
        while len(tokens) < length:
            tokens += round_fn(tokens[-1] if tokens else chain.start)
        joint[encode(tokens[:length], V)] += 1
        first[tokens[0]] += 1
    return joint, first


SAMPLED = Chain(
    P=torch.tensor([[0.55, 0.30, 0.15],
                    [0.10, 0.30, 0.60],
                    [0.00, 0.45, 0.55]], dtype=torch.float64),
    Q=torch.tensor([[0.20, 0.50, 0.30],
                    [0.45, 0.35, 0.20],
                    [0.30, 0.30, 0.40]], dtype=torch.float64),
)
"""The sampled-mode pair: per-row acceptance ``sum min(p, q)`` of 0.65, 0.60 and 0.70."""

GREEDY = Chain(
    P=torch.eye(3, dtype=torch.float64)[[0, 2, 1]],   # temperature 0: 1 -> 2 -> 1 -> ...; 0 -> 0
    Q=SAMPLED.Q,
    start=1,
)
"""The greedy-mode pair: one-hot target rows (temperature 0), the same draft."""


def _table(fitted: Fit, observed: Tensor, probs: Tensor, label) -> list[tuple[str, float, float]]:
    n = float(observed.sum())
    cells = fitted.impossible + [i for i in fitted.worst if i not in fitted.impossible]
    return [(label(i), float(probs[i]), float(observed[i]) / n) for i in cells[:5]]


def _failed(name: str, what: str, fitted: Fit, inputs: dict, table) -> Case:
    if fitted.impossible:
        what += ": it emitted a sequence the target gives probability 0"
        return Case(name, False, "impossible outcome", Counterexample(what, inputs, table))
    stat = f"Pearson chi-square, {fitted.df} df (p-value {fitted.pvalue:.2g})"
    return Case(name, False, f"p-value {fitted.pvalue:.2g}",
                Counterexample(what, inputs, table, stat, fitted.statistic, fitted.threshold))


def law_case(name: str, chain: Chain, round_fn: Callable[[int], list[int]], n: int,
             length: int, alpha: float, inputs: dict) -> Case:
    """Decode ``n`` streams with ``round_fn`` and compare them with the target's exact law.

    Two tests at level ``alpha`` each: the first token's law (the smallest counterexample: one
    row ``p``, one row ``q``), then the joint law of all ``length`` tokens (bugs that show only
    across positions or rounds). Frequencies in the counterexample are per stream.
    """
    V = chain.vocab
    joint, first = run_streams(round_fn, chain, n, length)
    p0 = chain.P[chain.start]
    first_fit = fit(first, p0, alpha)
    if not first_fit.passed:
        where = dict(inputs, p=p0, q=chain.Q[chain.start], last_context_token=chain.start)
        return _failed(name, "the first emitted token does not have the target's law p",
                       first_fit, where, _table(first_fit, first, p0, lambda i: f"token {i}"))
    law = chain.law(length)
    joint_fit = fit(joint, law, alpha)
    if not joint_fit.passed:
        where = dict(inputs, P=chain.P, Q=chain.Q)
        what = (f"the first token is fine, but the law of the {length}-token stream differs from "
                f"the target's (p(x_t | x_(t-1)) = P[x_(t-1), x_t], context ends with "
                f"{chain.start})")
        return _failed(name, what, joint_fit, where,
                       _table(joint_fit, joint, law, lambda i: "stream " + decode(i, V, length)))
    pvalue = min(first_fit.pvalue, joint_fit.pvalue)
    return Case(name, True, f"{n} streams of {length} tokens; smallest p-value {fmt(pvalue)}")
