"""The graders never trust the student's function: a hang, an endless result, a wrong type or value
is a failure report naming the case that showed it, never a hang, a crash or a false pass.

Deadlines here are short (0.5 s) to keep the file fast; a function that blocks forever waits on an
``Event`` nobody sets (a sleeping daemon thread is left behind, as the harness documents).
"""

from __future__ import annotations

import inspect
import math
import threading
import time

import pytest
import torch

import minispec as ms
from minispec import check
from minispec.check.harness import GRADE_BUDGET, TIMEOUT
from minispec.core.speculative import Draft

GRADERS = {"sampler": check.sampler, "residual": check.residual, "verifier": check.verifier,
           "tree_verifier": check.tree_verifier, "drafter": check.drafter,
           "rollback": check.rollback}


def _hang(*args):
    threading.Event().wait()


def _endless(*args):
    while True:
        yield 1


def _failed(report, needle: str) -> str:
    """The report's text, after asserting it is a failure (not a stub) that says ``needle``."""
    text = str(report)
    assert not report.passed and not report.not_implemented, text
    assert report.counterexample is not None and "FAILED" in text, text
    assert needle in text, (needle, text)
    return text


@pytest.mark.parametrize("kind", list(GRADERS))
def test_a_function_that_hangs_fails_with_its_case_instead_of_hanging(kind):
    start = time.monotonic()
    report = GRADERS[kind](_hang, timeout=0.5)
    assert time.monotonic() - start < 15
    _failed(report, "did not return within 0.5 s")
    assert report.summary == f"failed: {report.cases[-1].name}"        # names the case
    assert report.counterexample.inputs                                 # and the call's inputs


@pytest.mark.parametrize("kind", ["verifier", "tree_verifier", "drafter"])
def test_an_endless_generator_is_read_no_further_than_a_correct_answer_could_go(kind):
    _failed(GRADERS[kind](_endless, timeout=0.5), "more token ids than the")


def test_a_generator_that_blocks_is_read_under_the_deadline():
    def blocks_when_read(*args):
        threading.Event().wait()
        yield 1

    _failed(check.verifier(blocks_when_read, timeout=0.5), "did not return within 0.5 s")


def test_a_check_after_a_timeout_runs_as_usual():
    _failed(check.residual(_hang, timeout=0.5), "did not return within")
    assert check.residual(ms.residual).passed


def test_a_slow_call_fails_its_case_and_its_thread_ends_when_it_returns():
    def slow(p, q):
        time.sleep(0.3)
        return ms.residual(p, q)

    before = threading.active_count()
    _failed(check.residual(slow, timeout=0.1), "did not return within 0.1 s")
    deadline = time.monotonic() + 2
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before      # no case left running in the background


def test_a_check_runs_off_the_main_thread():
    reports = []
    worker = threading.Thread(target=lambda: reports.append(check.residual(_hang, timeout=0.5)))
    worker.start()
    worker.join(15)
    assert reports, "the check hung on a thread that is not the main one"
    _failed(reports[0], "did not return within")


def test_every_grader_takes_the_same_timeout_parameter():
    for grade in [*GRADERS.values(), check.kv_cache]:
        assert inspect.signature(grade).parameters["timeout"].default == TIMEOUT
    assert 1 <= TIMEOUT <= 30


class _RaisingTruncate(ms.ContiguousKVCache):
    def truncate_to(self, slot, n):
        raise RuntimeError("truncate broke")


class _WrongErrorPastLength(ms.ContiguousKVCache):
    def truncate_to(self, slot, n):
        if n > self.length(slot):
            raise RuntimeError("past the end")
        super().truncate_to(slot, n)


UNREADABLE = [
    ("sampler", lambda p, q, g: (math.inf, True), "integer token id"),
    ("sampler", lambda p, q, g: (0, torch.tensor([True, False])), "one flag"),
    ("sampler", lambda p, q, g: None, "(token, accepted)"),
    ("residual", lambda p, q: p.tolist(), "real floating-point"),
    ("verifier", lambda d, q, p, g: [math.inf], "not inf (float)"),
    ("verifier", lambda d, q, p, g: None, "not None (NoneType)"),
    ("tree_verifier", lambda t, p, q, g: [math.nan], "not nan (float)"),
    ("drafter", lambda context, k: [math.inf], "not inf (float)"),
    ("rollback", lambda model, slots, n: None, "must return a KV cache"),
    ("rollback", _RaisingTruncate.for_model, "RuntimeError: truncate broke"),
    ("rollback", _WrongErrorPastLength.for_model, "must raise ValueError"),
]


@pytest.mark.parametrize("kind, fn, needle", UNREADABLE,
                         ids=[f"{kind}-{i}" for i, (kind, _, _) in enumerate(UNREADABLE)])
def test_an_unreadable_result_is_a_failure_not_a_crash(kind, fn, needle):
    _failed(GRADERS[kind](fn, timeout=5), needle)


def test_a_student_exception_is_a_failure_of_its_case():
    def crash(*args):
        raise KeyError("oops")

    text = _failed(check.verifier(crash), "the function raised KeyError")
    assert "[FAIL] k=1, drafts sampled from q (raised KeyError)" in text


def test_a_complex_residual_fails():
    _failed(check.residual(lambda p, q: ms.residual(p, q).to(torch.complex64)),
            "real floating-point [V] = [4] tensor, got torch.complex64")


def test_a_drafter_proposing_non_integer_ids_fails():
    _failed(check.drafter(lambda context, k: [1.5]), "not 1.5 (float)")

    class FloatDraft:
        def draft(self, context, k, sampling=None, generator=None):
            return Draft(torch.tensor([1.5]))

    _failed(check.drafter(FloatDraft()), "not 1.5 (float)")


def test_declared_probs_must_be_real_distributions():
    class ComplexQ:
        def draft(self, context, k, sampling=None, generator=None):
            return Draft(torch.tensor([1]), torch.full((1, 64), 1 / 64, dtype=torch.complex64))

    _failed(check.drafter(ComplexQ()), "real floating-point [n, V] tensor")


def _verify_argmax(draft_tokens, draft_probs, target_probs, generator):
    """minispec's walk on the target's argmaxes (greedy), in the student's signature."""
    return ms.verify(ms.Proposal.chain(draft_tokens), target_probs.argmax(dim=-1).tolist())


def _greedy_without_bonus(draft_tokens, draft_probs, target_probs, generator):
    tokens = _verify_argmax(draft_tokens, draft_probs, target_probs, generator).tokens
    return tokens[:len(draft_tokens)] if len(tokens) > len(draft_tokens) else tokens


def test_a_verifier_that_never_emits_the_bonus_token_passes_with_a_hint():
    report = check.verifier(_greedy_without_bonus, sampled=False)
    assert report.passed, str(report)
    assert "hint: no bonus token" in str(report) and "k+1 = 4 tokens" in report.hint


def test_a_verifier_with_the_bonus_token_gets_no_hint():
    report = check.verifier(_verify_argmax, sampled=False)
    assert report.passed and report.hint == "" and "hint" not in str(report), str(report)


# --------------------------------------------------- issue 53: every failure stays with its request


class _Escape(BaseException):
    """An exception outside ``Exception``, as a student may raise."""


def _raising(error: BaseException):
    def fn(*args):
        raise error

    return fn


@pytest.mark.parametrize("error, name", [(SystemExit(3), "SystemExit"),
                                         (KeyboardInterrupt(), "KeyboardInterrupt"),
                                         (_Escape("out"), "_Escape")])
@pytest.mark.parametrize("kind", ["verifier", "sampler", "residual", "drafter", "rollback"])
def test_a_student_system_exit_or_interrupt_is_a_failure_of_its_case(kind, error, name):
    report = GRADERS[kind](_raising(error), timeout=5)
    text = _failed(report, f"the function raised {name}")
    assert report.summary == f"failed: {report.cases[-1].name}", text


def test_a_base_exception_raised_while_reading_the_result_is_a_failure():
    class ExitsWhenRead:
        def __index__(self):
            raise SystemExit(4)

    _failed(check.verifier(lambda d, q, p, g: [ExitsWhenRead()]), "SystemExit")


class _BlocksWhenRead:
    """A token id whose ``__index__`` never returns."""

    def __index__(self):
        threading.Event().wait()


class _TokensBlock:
    """A result whose ``.tokens`` never returns; as a drafter, its draft."""

    @property
    def tokens(self):
        threading.Event().wait()

    def draft(self, context, k, sampling=None, generator=None):
        return self


@pytest.mark.parametrize("grade, fn", [
    (check.verifier, lambda d, q, p, g: [_BlocksWhenRead()]),
    (check.verifier, lambda d, q, p, g: _TokensBlock()),
    (check.tree_verifier, lambda t, p, q, g: [_BlocksWhenRead()]),
    (check.drafter, _TokensBlock()),
    (check.reservation, lambda held, needs, size, free: [_BlocksWhenRead()]),
    (check.reservation, lambda held, needs, size, free: _TokensBlock()),
    (check.sampler, lambda p, q, g: (_BlocksWhenRead(), True)),
], ids=["verifier-index", "verifier-tokens", "tree-index", "drafter-tokens", "reservation-index",
        "reservation-tokens", "sampler-index"])
def test_reading_a_result_runs_under_the_deadline(grade, fn):
    start = time.monotonic()
    _failed(grade(fn, timeout=0.5), "did not return within 0.5 s")
    assert time.monotonic() - start < 15


def test_a_grade_that_runs_out_of_its_budget_fails_saying_how_far_it_got():
    def slow(draft_tokens, draft_probs, target_probs, generator):
        time.sleep(0.02)
        return ms.verify(ms.Proposal.chain(draft_tokens, draft_probs), target_probs, generator)

    start = time.monotonic()
    report = check.verifier(slow, budget=1.0)
    assert time.monotonic() - start < 10
    text = _failed(report, "ran 0 of 7 cases in 1 s")
    assert "budget" in report.counterexample.what and "calls" in report.counterexample.what
    assert report.summary.startswith("failed: ran 0 of 7 cases in 1 s"), text


def test_every_grader_takes_the_same_budget_parameter():
    graders = [*GRADERS.values(), check.kv_cache, check.reservation, check.acceptance,
               check.adjustment, check.speedup]
    for grade in graders:
        assert inspect.signature(grade).parameters["budget"].default == GRADE_BUDGET
    assert 10 <= GRADE_BUDGET <= 600


@pytest.mark.parametrize("value", [0, -1.0, math.nan, "5", True])
@pytest.mark.parametrize("name", ["timeout", "budget"])
def test_a_limit_that_is_not_a_positive_number_is_refused(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a number > 0"):
        check.residual(ms.residual, **{name: value})
