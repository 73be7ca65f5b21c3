"""Grade a student's verifier (Algorithm 1's accept loop) by the law of the whole emitted stream.

The function under test verifies one chain of drafts (Algorithm 1):

    fn(draft_tokens [k] int64, draft_probs [k, V] | None, target_probs [k+1, V], generator)
        -> the emitted tokens (a list, a tensor, or an object with ``.tokens``)

``draft_probs=None`` means the drafts came from a deterministic drafter (one-hot ``q``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from minispec.check.harness import TIMEOUT, Failure, call
from minispec.check.markov import GREEDY, Chain, emitted, grade_streams
from minispec.check.report import CheckReport, Counterexample


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
