"""Grade a student's verifier (Algorithm 1's accept loop) by the law of the whole emitted stream,
and the walltime a round of such a chain saves (Theorem 3.8).

The function under test verifies one chain of drafts (Algorithm 1):

    fn(draft_tokens [k] int64, draft_probs [k, V] | None, target_probs [k+1, V], generator)
        -> the emitted tokens (a list, a tensor, or an object with ``.tokens``)

``draft_probs=None`` means the drafts came from a deterministic drafter (one-hot ``q``).
[`speedup`][minispec.check.chains.speedup] grades ``fn(alpha, gamma, c, r) -> float``, as
[`theory.walltime_speedup`][minispec.core.theory.walltime_speedup].
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from minispec.check.harness import TIMEOUT, Failure, call, every, exact, run_cases
from minispec.check.markov import GREEDY, Chain, emitted, grade_streams
from minispec.check.report import CheckReport, Counterexample
from minispec.core.theory import expected_tokens, walltime_speedup


def make_round(fn: Callable, chain: Chain, k: int, sampled: bool,
               generator: torch.Generator) -> Callable[[int], list[int]]:
    """The grader's speculative round: ``round_(last) -> emitted tokens``.

    Args:
        fn: the verifier under test.
        chain: the toy target and draft.
        k: drafts per round.
        sampled: draw the drafts from ``Q`` (else its argmax chain, ``draft_probs=None``).
        generator: draws the drafts and is handed to ``fn``.

    Returns:
        A function that drafts after ``last``, scores with the target, calls ``fn`` and returns
        its tokens after checking their form (raising ``Failure`` otherwise).
    """

    def round_(last: int) -> list[int]:
        drafts, q = chain.draft(last, k, generator, sampled)          # [k], (k, V) or None
        p = chain.rows(last, drafts)                                    # (k+1, V)
        inputs = {"draft_tokens": drafts, "draft_probs": q, "target_probs": p}
        out = call(fn, torch.tensor(drafts, dtype=torch.long), q, p, generator, inputs=inputs)
        return emitted(out, [drafts], chain.vocab, inputs)

    return round_


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
             timeout: float = TIMEOUT) -> CheckReport:
    """Check that ``fn`` is a lossless verifier: the emitted stream has the target's law.

    Each case decodes many independent streams of ``LENGTH = 4`` tokens, round after round, with a
    toy Markov target ``p`` and draft ``q`` over ``V = 3`` tokens
    ([`minispec.check.markov`][minispec.check.markov]); every round draws ``k`` drafts, builds the
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

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport]; a lossless verifier that never
        emits the bonus token passes with a ``hint`` saying so.
    """
    hints: list[str] = []
    report = grade_streams("verifier", functools.partial(make_round, fn),
                           [(1, True, 0), (3, True, 1), (4, False, 5)],
                           lambda k: (f"k={k}", {"k": k}), sampled=sampled, greedy=greedy,
                           seed=seed, timeout=timeout, extra=[_bonus(fn, hints)])
    report.hint = " ".join(hints) if report.passed else ""
    return report


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


def speedup(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT) -> CheckReport:
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

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    return run_cases("speedup", [(name, every(_speedup_case, fn, group,
                                              f"{len(group)} within a relative 1e-4"))
                                 for name, group in _speedup_cases(seed)], 0.0, timeout)
