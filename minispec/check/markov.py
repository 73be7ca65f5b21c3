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

The chain and tree graders share one harness, here:
[`grade_streams`][minispec.check.markov.grade_streams] builds and runs their cases from the
grader's round (the law of whole streams, reproducibility, greedy mode), and
[`emitted`][minispec.check.markov.emitted] checks the form of every round's output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from minispec.check.harness import Failure, as_tokens, expect_law, run_cases, same_seed
from minispec.check.report import CheckReport, Counterexample, fmt
from minispec.check.statistics import BUDGET, per_test_alpha

#: Tokens kept per stream; 2 to 4 rounds each.
LENGTH = 4
#: Streams per law case (the graders' docstrings say why these suffice).
STREAMS = {"sampled": 600, "deterministic": 400, "greedy": 60}


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
        indexed by [`encode`][minispec.check.markov.encode]: ``prob(seq + [x]) = prob(seq) *
        P[last token of seq, x]``, and the last token of sequence ``i`` is ``i % V``."""
        probs, last = torch.ones(1, dtype=torch.float64), torch.tensor([self.start])
        for _ in range(length):
            probs = (probs[:, None] * self.P[last]).flatten()                 # (V**t,)
            last = torch.arange(len(probs)) % self.vocab
        return probs

    def rows(self, last: int, tokens: list[int]) -> Tensor:
        """Target rows ``(len(tokens) + 1, V)`` float32: ``p`` after ``last``, after each token."""
        return self.P.float()[[last] + list(tokens)]

    @functools.cached_property
    def _cdf(self) -> list[list[float]]:
        """The rows' CDFs, set to exactly 1 from each row's last token of positive ``q`` on: a
        uniform below 1 never falls past it (no rounding gap, never a token ``q`` excludes)."""
        cdf = torch.cumsum(self.Q, dim=-1)
        return torch.where(cdf >= cdf[:, -1:], 1.0, cdf).tolist()

    def draft(self, last: int, k: int, generator: torch.Generator,
              sampled: bool) -> tuple[list[int], Tensor | None]:
        """``k`` drafts after ``last``: sampled from ``Q`` (with their rows ``(k, V)``), or the
        deterministic argmax chain of ``Q`` (rows ``None``: one-hot ``q``)."""
        tokens: list[int] = []
        if sampled:             # inverse CDF: one generator call per round, not one per draft
            for u in torch.rand(k, generator=generator, dtype=torch.float64).tolist():
                cdf = self._cdf[tokens[-1] if tokens else last]
                tokens.append(next(x for x, c in enumerate(cdf) if u < c))
            return tokens, self.Q[[last] + tokens[:-1]].float()
        for _ in range(k):
            tokens.append(int(self.Q[tokens[-1] if tokens else last].argmax()))
        return tokens, None


def encode(seq: Sequence[int], vocab: int) -> int:
    """Index of a token sequence in a ``(V**L,)`` law (first token most significant)."""
    return sum(int(x) * vocab ** i for i, x in enumerate(reversed(seq)))


def decode(index: int, vocab: int, length: int) -> str:
    """The sequence at ``index`` of a ``(V**length,)`` law, as ``"0 2 1 1"``."""
    return " ".join(str(index // vocab ** i % vocab) for i in reversed(range(length)))


def stream(round_fn: Callable[[int], list[int]], start: int, length: int) -> list[int]:
    """Rounds one after another, from the context's last token ``start``, until at least
    ``length`` tokens are emitted; all the tokens (the last round's extra ones too)."""
    tokens: list[int] = []
    while len(tokens) < length:
        tokens += round_fn(tokens[-1] if tokens else start)
    return tokens


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
    joint = torch.zeros(chain.vocab ** length, dtype=torch.float64)
    first = torch.zeros(chain.vocab, dtype=torch.float64)
    for _ in range(n):
        tokens = stream(round_fn, chain.start, length)[:length]
        joint[encode(tokens, chain.vocab)] += 1
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


def law_case(chain: Chain, round_fn: Callable[[int], list[int]], n: int, length: int,
             alpha: float, inputs: dict) -> str:
    """Decode ``n`` streams with ``round_fn`` and compare them with the target's exact law.

    Two tests at level ``alpha`` each: the first token's law (the smallest counterexample: one
    row ``p``, one row ``q``), then the joint law of all ``length`` tokens (bugs that show only
    across positions or rounds). Frequencies in the counterexample are per stream. Returns the
    case's note; raises ``Failure`` on a failed test.
    """
    joint, first = run_streams(round_fn, chain, n, length)
    p0 = chain.P[chain.start]
    first_fit = expect_law(first, p0, alpha, "the first emitted token does not have the target's "
                           "law p", dict(inputs, p=p0, q=chain.Q[chain.start],
                                         last_context_token=chain.start))
    what = (f"the first token is fine, but the law of the {length}-token stream differs from the "
            f"target's (p(x_t | x_(t-1)) = P[x_(t-1), x_t], context ends with {chain.start})")
    joint_fit = expect_law(joint, chain.law(length), alpha, what,
                           dict(inputs, P=chain.P, Q=chain.Q),
                           lambda i: "stream " + decode(i, chain.vocab, length))
    pvalue = min(first_fit.pvalue, joint_fit.pvalue)
    return f"{n} streams of {length} tokens; smallest p-value {fmt(pvalue)}"


def emitted(out: Any, drafts: Sequence[list[int]], vocab: int, inputs: dict) -> list[int]:
    """The tokens of one round, after checking the form every verifier's output must have.

    That is 1 to ``depth + 1`` integer token ids in ``[0, V)``, all but the last a prefix of one
    of the ``drafts``: the accepted drafts (Algorithm 1 stops at the first rejection; in a tree,
    they follow a path from the root), then one new token. Raises ``Failure`` otherwise.
    """
    most = max(len(draft) for draft in drafts) + 1
    tokens = as_tokens(out, inputs, most)
    inputs = dict(inputs, emitted=tokens)
    if not tokens or any(not 0 <= t < vocab for t in tokens):
        raise Failure(Counterexample(f"a round must emit 1 to {most} (the drafts' length + 1) "
                                     f"token ids in [0, V = {vocab})", inputs))
    accepted = tokens[:-1]
    if not any(draft[:len(accepted)] == accepted for draft in drafts):
        raise Failure(Counterexample(
            "the emitted tokens must be accepted drafts and then one new token; here a token "
            "before the last differs from every draft at its position (Algorithm 1 stops at the "
            "first rejection: nothing after it may be kept; in a tree, the accepted tokens follow "
            "a path from the root)", inputs))
    return tokens


def grade_streams(check: str, make_round: Callable, sampled_plan: list[tuple[int, bool, int]],
                  describe: Callable[[int], tuple[str, dict]], *, sampled: bool, greedy: bool,
                  seed: int, timeout: float, extra: Sequence = ()) -> CheckReport:
    """Run a verifier check: the stream-law cases of the chain and tree graders, then ``extra``.

    Sampled mode: a law case on ``SAMPLED`` per entry of ``sampled_plan`` (600 streams with drafts
    sampled from ``q``, 400 with deterministic drafts), then the reproducibility case (size 3,
    sampled drafts, 24 tokens, seed ``seed + 2``); greedy mode: ``GREEDY`` with size 3 sampled and
    size 2 deterministic drafts, 60 streams each (seeds ``seed + 3`` and ``seed + 4``): exact.

    Args:
        check: the check's name, for the report.
        make_round: ``make_round(chain, size, sampled, generator) -> round_``: the grader's
            round with the student's function (``size``: drafts per round, or tree width).
        sampled_plan: ``(size, sampled drafts, seed offset)`` of each sampled-mode law case; each
            runs two tests (first token, whole stream), all sharing the false-alarm budget.
        describe: ``describe(size) -> (name, inputs)`` for a case's name and counterexample.
        sampled: run the sampled-mode cases.
        greedy: run the greedy-mode cases.
        seed: the grader's seed.
        timeout: seconds each call of the student's function may take.
        extra: more ``(name, thunk)`` cases, run last.
    """
    alpha = per_test_alpha(2 * len(sampled_plan))
    plan = [(SAMPLED, size, drafted, alpha, seed + offset)
            for size, drafted, offset in sampled_plan] if sampled else []
    plan += [(GREEDY, 3, True, 1.0, seed + 3), (GREEDY, 2, False, 1.0, seed + 4)] if greedy else []
    if not plan:
        raise ValueError("nothing to check: sampled and greedy are both False")
    cases = [_law(make_round, describe, *entry) for entry in plan]
    if sampled:
        run = lambda g: stream(make_round(SAMPLED, 3, True, g), SAMPLED.start, 24)
        cases.insert(len(sampled_plan), same_seed(run, seed + 2, describe(3)[1]))
    return run_cases(check, [*cases, *extra], BUDGET if sampled else 0.0, timeout)


def _law(make_round: Callable, describe: Callable, chain: Chain, size: int, drafted: bool,
         alpha: float, seed: int) -> tuple[str, Callable[[], str]]:
    """The law case of ``grade_streams`` for one chain, size and kind of drafts."""
    name, inputs = describe(size)
    name = (f"{'greedy (one-hot p), ' if chain is GREEDY else ''}{name}, "
            f"{'drafts sampled from q' if drafted else 'deterministic drafts (draft_probs=None)'}")
    inputs = dict(inputs, drafts="sampled from Q" if drafted else "deterministic, q one-hot")
    n = STREAMS["greedy" if chain is GREEDY else "sampled" if drafted else "deterministic"]

    def case() -> str:
        round_ = make_round(chain, size, drafted, torch.Generator().manual_seed(seed))
        return law_case(chain, round_, n, LENGTH, alpha, inputs)

    return name, case
