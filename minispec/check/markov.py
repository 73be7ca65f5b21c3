"""Grade a student's verifier -- a chain's (Algorithm 1's accept loop) or a draft tree's walk
(SpecInfer, Stratos §2) -- by the law of the whole emitted stream, on toy Markov models:

    verifier:       fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k+1, V], g)
    tree_verifier:  fn(tree, target_probs [N, V], draft_probs list of [depth_j, V] | None, g)

Each returns the emitted tokens (a list, a tensor, or an object with ``.tokens``);
``draft_probs=None`` means deterministic drafts (one-hot ``q``). ``tree`` is a
[`DraftTree`][minispec.core.tree.DraftTree]; row ``i`` of its ``target_probs`` is the target's law
after the path to node ``i`` (row 0: the root, after the context).

The target ``p`` and draft ``q`` are *Markov chains*: ``p(. | context) = P[last token]``, ``q(. |
context) = Q[last token]``. The target's law over the first ``L`` emitted tokens is a product,
``prod_t P[x_{t-1}, x_t]``, enumerable over all ``V^L`` sequences, and a lossless decoder must
reproduce it over *several rounds*: a bug in the bonus token, in uniforms shared between positions
or rounds, or after a rejection changes this joint law even when the first token's law is right.
``V = 3`` and ``L = 4`` keep the table small (81 sequences) with 2 to 4 rounds per stream; ``P``
has a zero (token 2 is never followed by 0), so an impossible token is caught outright.

Both graders share one harness: [`make_round`][minispec.check.markov.make_round] (a chain is a
tree of one draft), [`grade_streams`][minispec.check.markov.grade_streams] (the law of whole
streams, reproducibility, greedy mode) and [`emitted`][minispec.check.markov.emitted] (the form
of every round's output).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from minispec.check import harness
from minispec.check.harness import TIMEOUT, Failure, as_tokens, call, run_cases, same_seed
from minispec.check.report import CheckReport, Counterexample, fmt
from minispec.check.statistics import BUDGET, expect_law, per_test_alpha
from minispec.core.tree import DraftTree

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
    for _ in range(n):
        tokens = stream(round_fn, chain.start, length)[:length]
        joint[encode(tokens, chain.vocab)] += 1
    # the first token is the most significant digit of a sequence's index: one row per token
    return joint, joint.view(chain.vocab, -1).sum(dim=1)


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


def _drafts(chain: Chain, last: int, width: int, depth: int, g: torch.Generator,
            sampled: bool) -> tuple[list[list[int]], list | None]:
    """``width`` drafts of ``depth`` tokens: independent samples from ``Q``, or deterministic:
    the ``j``-th most likely first token, then the argmax chain (one-hot proposals)."""
    if sampled:
        pairs = [chain.draft(last, depth, g, True) for _ in range(width)]
        return [t for t, _ in pairs], [q for _, q in pairs]
    firsts = torch.argsort(chain.Q[last], descending=True, stable=True)[:width].tolist()
    return [[x] + chain.draft(x, depth - 1, g, False)[0] for x in firsts], None


def make_round(fn: Callable, chain: Chain, size: int, sampled: bool, g: torch.Generator,
               tree: bool = False) -> Callable[[int], list[int]]:
    """The grader's speculative round: ``round_(last) -> emitted tokens``.

    A chain of ``k`` drafts is a tree of one draft of depth ``k``: either way the round drafts
    after ``last``, builds the tree, scores every node with the target (row ``i``: ``P`` after
    node ``i``'s token), calls ``fn`` with its grader's arguments and checks the form of what it
    returns (``emitted``; a ``Failure`` otherwise).

    Args:
        fn: the verifier under test.
        chain: the toy target and draft.
        size: drafts per round in a chain (``k``), or, with ``tree``, drafts of depth 2.
        sampled: draw the drafts from ``Q`` (else deterministic: the top-``size`` first tokens of
            ``Q``, then its argmax chain, ``draft_probs=None``).
        g: draws the drafts and is handed to ``fn``.
        tree: call ``fn`` as a tree verifier (else as a chain verifier).
    """
    width, depth = (size, 2) if tree else (1, size)

    def round_(last: int) -> list[int]:
        drafts, qs = _drafts(chain, last, width, depth, g, sampled)
        nodes = DraftTree.from_drafts(drafts)
        p = chain.rows(last, nodes.tokens[1:])             # (N, V): row i = P[token of node i]
        if tree:
            inputs = {"drafts": drafts, "draft_probs": qs, "target_probs": p,
                      "tree_parents": nodes.parents}
            args = (nodes, p, qs, g)
        else:                                               # one draft: its tokens and q rows
            q = None if qs is None else qs[0]
            inputs = {"draft_tokens": drafts[0], "draft_probs": q, "target_probs": p}
            args = (torch.tensor(drafts[0], dtype=torch.long), q, p, g)
        return emitted(call(fn, *args, inputs=inputs), drafts, chain.vocab, inputs)

    return round_


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


def grade_streams(check: str, fn: Callable, tree: bool, sampled_plan: list[tuple[int, bool, int]],
                  *, sampled: bool, greedy: bool, seed: int, timeout: float,
                  budget: float = harness.GRADE_BUDGET, extra: Sequence = ()) -> CheckReport:
    """Run a verifier check: the stream-law cases of the chain and tree graders, then ``extra``.

    Sampled mode: a law case on ``SAMPLED`` per entry of ``sampled_plan`` (600 streams with drafts
    sampled from ``q``, 400 with deterministic drafts), then the reproducibility case (size 3,
    sampled drafts, 24 tokens, seed ``seed + 2``); greedy mode: ``GREEDY`` with size 3 sampled and
    size 2 deterministic drafts, 60 streams each (seeds ``seed + 3`` and ``seed + 4``): exact.

    Args:
        check: the check's name, for the report.
        fn: the verifier under test, called by ``make_round``.
        tree: ``fn`` is a tree verifier (else a chain verifier).
        sampled_plan: ``(size, sampled drafts, seed offset)`` of each sampled-mode law case; each
            runs two tests (first token, whole stream), all sharing the false-alarm budget.
        sampled: run the sampled-mode cases.
        greedy: run the greedy-mode cases.
        seed: the grader's seed.
        timeout: seconds each call of the student's function may take.
        budget: seconds the whole check may take.
        extra: more ``(name, thunk)`` cases, run last.
    """
    alpha = per_test_alpha(2 * len(sampled_plan))
    plan = [(SAMPLED, size, drafted, alpha, seed + offset)
            for size, drafted, offset in sampled_plan] if sampled else []
    plan += [(GREEDY, 3, True, 1.0, seed + 3), (GREEDY, 2, False, 1.0, seed + 4)] if greedy else []
    if not plan:
        raise ValueError("nothing to check: sampled and greedy are both False")
    cases = [_law(fn, tree, *entry) for entry in plan]
    if sampled:
        run = lambda g: stream(make_round(fn, SAMPLED, 3, True, g, tree), SAMPLED.start, 24)
        cases.insert(len(sampled_plan), same_seed(run, seed + 2, _describe(3, tree)[1]))
    return run_cases(check, [*cases, *extra], BUDGET if sampled else 0.0, timeout, budget)


def _describe(size: int, tree: bool) -> tuple[str, dict]:
    """A case's name and inputs for its round size: ``k`` drafts, or ``size`` of depth 2."""
    if tree:
        return f"{size} drafts of depth 2", {"drafts per round": size, "depth": 2}
    return f"k={size}", {"k": size}


def _law(fn: Callable, tree: bool, chain: Chain, size: int, drafted: bool, alpha: float,
         seed: int) -> tuple[str, Callable[[], str]]:
    """The law case of ``grade_streams`` for one chain, size and kind of drafts.

    It decodes ``n`` streams of ``LENGTH`` tokens and runs two tests at level ``alpha`` each: the
    first token's law (the smallest counterexample: one row ``p``, one row ``q``), then the joint
    law of the whole stream (bugs that show only across positions or rounds). Frequencies in the
    counterexample are per stream.
    """
    name, inputs = _describe(size, tree)
    name = (f"{'greedy (one-hot p), ' if chain is GREEDY else ''}{name}, "
            f"{'drafts sampled from q' if drafted else 'deterministic drafts (draft_probs=None)'}")
    inputs = dict(inputs, drafts="sampled from Q" if drafted else "deterministic, q one-hot")
    n = STREAMS["greedy" if chain is GREEDY else "sampled" if drafted else "deterministic"]
    p0, q0 = chain.P[chain.start], chain.Q[chain.start]

    def case() -> str:
        round_ = make_round(fn, chain, size, drafted, torch.Generator().manual_seed(seed), tree)
        joint, first = run_streams(round_, chain, n, LENGTH)
        first_fit = expect_law(first, p0, alpha, "the first emitted token does not have the "
                               "target's law p", dict(inputs, p=p0, q=q0,
                                                      last_context_token=chain.start))
        what = (f"the first token is fine, but the law of the {LENGTH}-token stream differs from "
                f"the target's (p(x_t | x_(t-1)) = P[x_(t-1), x_t], context ends with "
                f"{chain.start})")
        joint_fit = expect_law(joint, chain.law(LENGTH), alpha, what,
                               dict(inputs, P=chain.P, Q=chain.Q),
                               lambda i: "stream " + decode(i, chain.vocab, LENGTH))
        pvalue = min(first_fit.pvalue, joint_fit.pvalue)
        return f"{n} streams of {LENGTH} tokens; smallest p-value {fmt(pvalue)}"

    return name, case


def _bonus(fn: Callable, hints: list[str]) -> tuple[str, Callable[[], str]]:
    """An exact case: drafts that follow a one-hot target's chain; a hint without the bonus."""
    name = "every draft right: the target's chain (and the bonus token)"

    def case() -> str:
        oracle = Chain(GREEDY.P, GREEDY.P, GREEDY.start)    # its drafts: GREEDY's chain, 2 1 2
        round_ = make_round(fn, oracle, 3, False, torch.Generator().manual_seed(0))
        tokens = round_(GREEDY.start)
        if tokens != [2, 1, 2, 1][:len(tokens)]:
            raise Failure(Counterexample(
                "with one-hot target rows the emitted tokens must be the target's greedy chain",
                {"draft_tokens": [2, 1, 2], "target_chain": [2, 1, 2, 1], "emitted": tokens}))
        if len(tokens) < 4:
            hints.append(f"no bonus token: all k = 3 drafts were right and the function emitted "
                         f"{len(tokens)} tokens, not k+1 = 4 tokens; after accepting every draft, "
                         "Algorithm 1 adds one from the last target row (lossless without it, "
                         "but it is a free token per round)")
        return f"{len(tokens)} tokens"

    return name, case


def verifier(fn: Callable, *, sampled: bool = True, greedy: bool = True, seed: int = 0,
             timeout: float = TIMEOUT, budget: float = harness.GRADE_BUDGET) -> CheckReport:
    """Check that ``fn`` is a lossless verifier: the emitted stream has the target's law.

    Each case decodes many independent streams of ``LENGTH = 4`` tokens, round after round, with a
    toy Markov target ``p`` and draft ``q`` over ``V = 3`` tokens
    (the module docstring); every round draws ``k`` drafts, builds the
    target rows ``[k+1, V]`` and calls ``fn``. The counts of the 81 possible streams are compared
    with the target's exact law, computed by enumeration. Cases:

    * sampled mode: ``k = 1`` and ``k = 3`` with drafts sampled from ``q`` (600 streams each),
      ``k = 4`` with deterministic drafts, ``draft_probs=None`` (400 streams); then a
      reproducibility case: two runs with generators seeded alike (and the global generators
      seeded differently) must emit identical tokens;
    * greedy mode: one-hot target rows (temperature 0), ``k = 3`` sampled and ``k = 2``
      deterministic drafts (60 streams each): every stream must be the target's greedy chain.

    Every round's output must also have the shape of Algorithm 1's: ``1..k+1`` integer token ids,
    all but the last equal to the drafts at their positions. A last, exact case hands ``fn`` three
    drafts that follow a one-hot target's chain: the report carries a ``hint`` when it does not
    emit the bonus token after them (lossless, so not a failure). The check does not ask *how*
    tokens are chosen: any lossless rule passes (e.g. accepting ``x`` with probability ``p(x)``
    and resampling from ``p`` without ``x``), and minispec's
    [`verify`][minispec.core.speculative.verify] passes (``lambda d, q, p, g:
    ms.verify(ms.Proposal.chain(d, q), p, g)``).

    **False alarms.** Each sampled law case runs two Pearson tests, first token (2 df) and whole
    stream (pooled to about 30 df); the 6 tests share a budget of ``1e-3`` by Bonferroni, each at
    ``alpha = 4.2e-5`` (a quarter share: the rest covers the chi-square approximation, see
    [`minispec.check.statistics`][minispec.check.statistics]). The greedy and structural cases are
    exact (no false alarms). So a correct verifier fails for at most 1 seed in 1000; with the fixed
    ``seed`` the verdict is the same on every run.

    **Sample sizes.** Measured effect sizes (noncentrality per stream) set them: the smallest
    among the lab's verifier bugs is about 0.06 per stream for the first token (an adjustment on
    one side) and 0.16 for the whole stream, so 600 streams give a noncentrality near 100 against
    a critical value near 70 at 30 df; the shared-uniform bug is strongest with deterministic
    drafts and large ``k`` (11 per stream at ``k = 4``), and the bonus-row bug emits impossible
    streams at ``k = 1``. About 3500 calls in all: two to four seconds on a loaded core.

    Args:
        fn: the verifier under test (signature in the module docstring).
        sampled: run the sampled-mode cases.
        greedy: run the greedy-mode cases.
        seed: seeds the drafts and the generator handed to ``fn``.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport]; a lossless verifier that never
        emits the bonus token passes with a ``hint`` saying so.
    """
    hints: list[str] = []
    report = grade_streams("verifier", fn, False, [(1, True, 0), (3, True, 1), (4, False, 5)],
                           sampled=sampled, greedy=greedy, seed=seed, timeout=timeout,
                           budget=budget, extra=[_bonus(fn, hints)])
    report.hint = " ".join(hints) if report.passed else ""
    return report


def tree_verifier(fn: Callable, *, sampled: bool = True, greedy: bool = True, seed: int = 0,
                  timeout: float = TIMEOUT, budget: float = harness.GRADE_BUDGET) -> CheckReport:
    """Check that ``fn`` is a lossless tree verifier: the emitted stream has the target's law.

    As [`verifier`][minispec.check.markov.verifier], on draft trees: every round
    builds a tree from several drafts of depth 2 after the last token, scores every node with the
    toy Markov target, and calls ``fn``; streams of 4 tokens are compared with the target's exact
    law (81 outcomes). Cases: 3 drafts sampled from ``q`` (600 streams; siblings may repeat a
    token), 2 deterministic drafts with ``draft_probs=None`` (400 streams: the first two tokens
    by ``q``, as top-k tree drafting does), reproducibility under a fixed seed, and greedy mode
    (one-hot target rows: every stream must be the target's greedy chain). The emitted tokens
    before the last must follow a path of the tree from its root. Any lossless walk passes:
    SpecInfer's iterative rule does (``lambda tree, p, q, g: ms.verify(ms.Proposal.from_tree(tree,
    q), p, g)``).

    **False alarms.** 4 Pearson tests (first token and whole stream for each sampled case), each
    at ``alpha = 6.25e-5``: at most ``1e-3`` for a correct walk, by the same argument as the chain
    verifier's; the greedy and path cases are exact.

    **Sample sizes.** 600 and 400 streams: the tree bugs of the lab fail with their statistic
    several times the threshold (testing siblings against ``p`` instead of the residual) or with
    an impossible stream (the bonus from the parent's row); about 2500 calls, a few seconds.

    Args:
        fn: the tree verifier under test (signature in the module docstring).
        sampled: run the sampled-mode cases.
        greedy: run the greedy-mode cases.
        seed: seeds the drafts and the generator handed to ``fn``.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    return grade_streams("tree_verifier", fn, True, [(3, True, 0), (2, False, 1)],
                         sampled=sampled, greedy=greedy, seed=seed, timeout=timeout, budget=budget)
