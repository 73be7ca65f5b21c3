"""How a check runs a student's code: calls under a deadline that turn exceptions and hangs into
verdicts, the reading of a result as token ids or numbers, the case loop with its budget, and a
guard that proves a function draws its randomness from the generator it is given (the law test
every statistical case runs is [`statistics.expect_law`][minispec.check.statistics.expect_law]).

A function that raises ``NotImplementedError`` (an exercise's stub) gives a clean report with
``passed=False`` and ``not_implemented=True``; any other exception raised *by the student's code*
(``SystemExit``, ``KeyboardInterrupt`` and every other ``BaseException`` included) is a failure
that names the exception and the inputs that provoked it, and so is a call that does not return
within the check's ``timeout`` (seconds per call, the reading of its result included). A result
the check cannot read (a wrong type, a float where a token id belongs, an endless generator) is a
failure too, and so is a grade that runs past its ``budget`` (seconds for the whole check): a
check never crashes, never exits and never hangs on what the student's code does.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy  # a dependency of transformers, so always installed with minispec
import torch
from torch import Tensor

from minispec.check.report import Case, CheckReport, Counterexample

#: Seconds one call of the student's function may take: every check's ``timeout`` default. A
#: correct call takes milliseconds; the margin covers a loaded machine.
TIMEOUT = 5.0
#: Seconds a whole check may take: every check's ``budget`` default. A correct implementation
#: grades in a few seconds (the verifier's 3,500 calls take milliseconds each); a slow one, each
#: call well under ``TIMEOUT``, would otherwise keep a grade running for many minutes.
GRADE_BUDGET = 60.0
_case = threading.local()       # on a case's thread: ``watch``, the student's call running now


class StudentError(Exception):
    """The student's function raised (``NotImplementedError``: an exercise's stub); carries the
    exception and the inputs that provoked it."""

    def __init__(self, error: BaseException, inputs: dict[str, Any]) -> None:
        super().__init__(str(error))
        self.error, self.inputs = error, inputs


class Failure(Exception):
    """A case failed: carries its counterexample, and a short note for the case's line."""

    def __init__(self, counterexample: Counterexample, note: str = "") -> None:
        super().__init__(counterexample.what)
        self.counterexample, self.note = counterexample, note


class _Abandoned(BaseException):
    """Ends a case's thread at its next ``call`` once its case has failed (a timeout, the budget,
    Ctrl-C): nobody waits for it any more."""


def call(fn: Callable[..., Any], *args: Any, inputs: dict[str, Any] | None = None) -> Any:
    """Call the student's ``fn(*args)``, turning its exceptions into the check's verdicts.

    Every grader calls the student's code through here. Whatever ``fn`` raises, ``SystemExit`` and
    ``KeyboardInterrupt`` included, comes out as a ``StudentError``. On a case's thread (see
    ``run_cases``) the call is watched: its deadline, the check's ``timeout``, runs from the call
    until the next one (or the end of the case), so that it covers the reading of what ``fn``
    returned too: an ``__index__``, a ``.tokens`` or a ``__repr__`` of the student's that never
    returns fails the case like a call that never returns.
    """
    watch = getattr(_case, "watch", {})     # off a case's thread: a dict that nobody reads
    if watch.get("abandoned"):              # its case has failed already: end its thread here
        raise _Abandoned
    watch["call"] = (time.monotonic(), inputs or {})
    watch["calls"] = watch.get("calls", 0) + 1
    try:
        return fn(*args)
    except BaseException as error:  # the student's bug (or exit), reported with its inputs
        raise StudentError(error, inputs or {}) from error


def _verdict(name: str, run: Callable[[], str]) -> tuple[Case, str]:
    """Case ``name`` run and judged, on its own thread: ``(case, stub)``, ``stub`` the summary of
    a function not implemented yet (else ``""``). The judging reads the student's exception (its
    message): under the deadline, as the case is."""
    try:
        return Case(name, True, run()), ""
    except StudentError as err:
        if isinstance(err.error, NotImplementedError):
            why = f": {err.error}" if str(err.error) else ""
            return Case(name, False), f"not implemented yet (NotImplementedError{why})"
        return _raised(name, err.error, err.inputs, "the function raised"), ""
    except Failure as failure:
        return Case(name, False, failure.note, failure.counterexample), ""
    except BaseException as error:  # a result of a form no check foresaw (its SystemExit too)
        return _raised(name, error, {}, "the check cannot read the function's result (if it "
                       "looks right, this is a bug of the check):"), ""


def _watched(name: str, run: Callable[[], str], timeout: float, deadline: float,
             budget: str) -> tuple[Case, str]:
    """``_verdict(name, run)`` on a new thread; ``(case, how)``, ``how`` a stub's summary, or
    ``budget`` when the grade ran out of time in this case, else ``""``.

    Meanwhile this thread checks twenty times a second whether a call of the student's code
    (through ``call``, the reading of its result included) has been running for more than
    ``timeout`` seconds, or the clock has passed ``deadline`` (``time.monotonic()``, the grade's
    budget), and then fails the case (``budget`` says why in the latter's counterexample). That
    case is abandoned, not stopped (should its call return, its thread ends at its next ``call``):
    its thread is a daemon, so it never holds up the interpreter's exit, but until then it stays,
    with its memory (and a busy loop keeps using a core: restart the Jupyter kernel to stop it).
    No signals: this works off the main thread too (Jupyter). The caller's grad and inference
    modes, which are per-thread, are carried over.
    """
    watch: dict[str, Any] = {"call": None, "calls": 0}
    outcome: list[tuple[Case, str]] = []
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def job() -> None:
        _case.watch = watch
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            outcome.append(_verdict(name, run))     # abandoned: a verdict nobody reads

    thread, started = threading.Thread(target=job, daemon=True), time.monotonic()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.05)
            running, now = watch["call"], time.monotonic()
            if thread.is_alive() and running is not None and now - running[0] > timeout:
                return Case(name, False, counterexample=Counterexample(
                    f"the function did not return within {timeout:g} s: it hangs or is far too "
                    "slow (a call takes milliseconds here; the check's timeout= sets the limit)",
                    running[1])), ""
            if thread.is_alive() and now > deadline:
                calls = watch["calls"]
                what = budget.format(calls=calls, each=(now - started) / max(calls, 1))
                return Case(name, False, "out of time", Counterexample(
                    what, running[1] if running else {})), "budget"
    finally:
        watch["abandoned"] = True       # a case left behind (a timeout, Ctrl-C) stops at its call
    return outcome[0]


def as_int(x: Any) -> int | None:
    """``x`` as an ``int`` if it is a true integer (a Python or numpy integer, or an integer
    tensor of one element), else ``None``: ``1.5``, ``inf``, ``True`` are not token ids."""
    if isinstance(x, torch.Tensor):
        x = x.item() if x.numel() == 1 and not (x.is_floating_point() or x.is_complex()) else None
    try:
        return None if isinstance(x, bool) else operator.index(x)
    except TypeError:
        return None


def as_real(out: Any, shape: tuple[int, ...], inputs: dict[str, Any], what: str,
            tensor: bool = False) -> Tensor:
    """The result as a float64 tensor of ``shape`` (a plain number for ``()``: a float, an int, a
    one-element tensor of that shape), else a ``Failure`` saying it must be ``what``. A bool or a
    complex number is not a real number here; with ``tensor`` only a floating-point tensor is."""
    try:
        ok = not (isinstance(out, bool) or torch.is_tensor(out) and out.is_complex())
        ok = ok and (not tensor or torch.is_tensor(out) and out.is_floating_point())
        got = torch.as_tensor(out, dtype=torch.float64) if ok else None   # complex: no cast
    except Exception:  # anything that is not numbers: the failure below
        got, ok = None, False
    if not ok or got.shape != shape:
        seen = f"{out.dtype} {list(out.shape)}" if torch.is_tensor(out) else repr(out)
        raise Failure(Counterexample(f"the result must be {what}, got {seen}", inputs))
    return got


def exact(fn: Callable, args: tuple, inputs: dict[str, Any], want: Tensor, what: str, form: str,
          tol: float = 1e-5, label: Callable[[int], str] = "token {}".format,
          tensor: bool = False) -> Tensor:
    """Call ``fn`` on copies of ``args``; fail unless it left them unchanged and returned ``want``.

    The result is read by ``as_real`` (``form``: what it must be, ``tensor``: a floating-point
    tensor only) and must be within ``tol`` of ``want`` everywhere (NaN fails). Otherwise the
    ``Failure`` says ``what``, with the most discrepant entries (named by ``label``), expected
    against returned. Returns the result, as float64.
    """
    given = tuple(a.clone() if torch.is_tensor(a) else a for a in args)
    out = call(fn, *given, inputs=inputs)
    if not all(torch.equal(a, b) for a, b in zip(given, args, strict=True) if torch.is_tensor(a)):
        raise Failure(Counterexample("the function changed its inputs in place", inputs))
    got = as_real(out, tuple(want.shape), inputs, form, tensor)
    error = (got - want).abs().nan_to_num(nan=math.inf).flatten()
    if error.max() > tol:
        worst = error.argsort(descending=True, stable=True)[:8].tolist()
        raise Failure(Counterexample(what, inputs, [
            (label(i), float(want.flatten()[i]), float(got.flatten()[i])) for i in worst]))
    return got


def _first(out: Any, n: int) -> list | None:
    """The first ``n`` items of an iterable (a generator may never end), or ``None``."""
    return list(itertools.islice(out, n)) if isinstance(out, Iterable) else None


def as_tokens(out: Any, inputs: dict[str, Any], most: int, noun: str = "token ids") -> list[int]:
    """The token ids of a result: a list, a tensor, any iterable, or an object with ``.tokens``.

    At most ``most + 1`` items are read (reading a generator runs the student's code: under the
    deadline too). An item that is not an integer, or more than ``most`` of them, is a failure
    (``noun`` names the items in its message: ``"token ids"``, ``"request indices"``).
    """
    out = getattr(out, "tokens", out)
    items = (out.flatten()[: most + 1].tolist() if isinstance(out, torch.Tensor)
             else call(_first, out, most + 1, inputs=inputs))
    ids = [as_int(x) for x in items or ()]
    if items is None or None in ids:
        bad = out if items is None else items[ids.index(None)]
        raise Failure(Counterexample(f"the result must be a list of integer {noun}, not "
                                     f"{bad!r} ({type(bad).__name__})", inputs))
    if len(ids) > most:
        raise Failure(Counterexample(f"the result holds more {noun} than the {most} possible "
                                     "here", dict(inputs, first=ids)))
    return ids


@contextlib.contextmanager
def perturbed_global_rng(seed: int) -> Iterator[None]:
    """Reseed torch's, Python's and numpy's global generators inside the block; restore after.

    Two runs with the same explicit generator but differently seeded global generators emit the
    same tokens only if the function ignores the global ones, as it must (vLLM #13196).
    """
    py_state, np_state = random.getstate(), numpy.random.get_state()  # noqa: NPY002
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        numpy.random.seed(seed)  # noqa: NPY002 - the legacy global generator is the point
        try:
            yield
        finally:
            random.setstate(py_state)
            numpy.random.set_state(np_state)  # noqa: NPY002


def same_seed(run: Callable[[torch.Generator], list[int]], seed: int,
              inputs: dict[str, Any]) -> tuple[str, Callable[[], str]]:
    """The reproducibility case of every check that hands ``fn`` a generator:
    ``run(generator)`` twice, with generators seeded alike and the global generators seeded
    differently, must give identical outputs (the seed is honoured, no other source of randomness
    is used)."""

    def case() -> str:
        outs = []
        for perturb in (11, 12):
            with perturbed_global_rng(perturb):
                outs.append(run(torch.Generator().manual_seed(seed)))
        if outs[0] != outs[1]:
            raise Failure(Counterexample(
                "two runs with generators seeded alike emitted different tokens: the function "
                "draws random numbers from somewhere other than the generator it is given "
                "(the seed is ignored, as in vLLM #13196)",
                dict(inputs, seed=seed, run_1=outs[0][:16], run_2=outs[1][:16])))
        return f"{len(outs[0])} tokens identical in two runs"

    return "same seed, same tokens (randomness comes from the generator only)", case


def _raised(name: str, error: BaseException, inputs: dict[str, Any], what: str) -> Case:
    """The failed case ``name``: ``what``, the exception, the line that raised it, the inputs."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return Case(name, False, f"raised {type(error).__name__}",
                Counterexample(f"{what} {type(error).__name__}: {error}{where}", inputs))


def run_table(check: str, compare: Callable[..., None], fn: Callable,
              groups: Sequence[tuple[str, Sequence[tuple]]], note: str,
              timeout: float = TIMEOUT, budget: float = GRADE_BUDGET) -> CheckReport:
    """Run a deterministic check: one case per named group of inputs, which calls
    ``compare(fn, *args)`` for each ``args`` of the group (it returns, or raises ``Failure``) and
    passes with ``note`` (``{n}``: the group's size). A table of inputs compared one by one with
    the package's own answer: no randomness in the verdict, hence no false alarm."""

    def case(group: Sequence[tuple]) -> Callable[[], str]:
        def run() -> str:
            for args in group:
                compare(fn, *args)
            return note.format(n=len(group))

        return run

    return run_cases(check, [(name, case(group)) for name, group in groups], 0.0, timeout, budget)


def run_cases(check: str, cases: Sequence[tuple[str, Callable[[], str]]],
              false_alarm_rate: float, timeout: float = TIMEOUT,
              budget: float = GRADE_BUDGET) -> CheckReport:
    """Run ``cases`` (name, thunk) in order; stop at the first failure; build the report.

    A grade that runs past ``budget`` seconds fails in the case it was running, its summary
    ``"failed: ran N of M cases in B s"``: the cases it did not run might have failed, so passing
    it would be a verdict on a part of the check only, and a correct implementation grades well
    within the budget (a few seconds).

    Args:
        check: the check's name, for the report.
        cases: each thunk returns the note of its passing case (sample size, p-value) or
            raises [`Failure`][minispec.check.harness.Failure].
        false_alarm_rate: the documented bound, copied into the report.
        timeout: seconds each call of the student's code may take, the reading of its result
            included (each case runs on its own thread, watched: see ``_watched``).
        budget: seconds the whole check may take.
    """
    for limit, value in (("timeout", timeout), ("budget", budget)):     # math.inf: no limit
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{limit} must be a number > 0 (seconds), got {value!r}")
    done: list[Case] = []
    deadline = time.monotonic() + budget
    for name, run in cases:
        ran = f"ran {len(done)} of {len(cases)} cases in {budget:g} s"
        what = (f"the check's budget of {budget:g} s (budget= sets it) ran out in this case: it "
                f"{ran}, and this case stopped after {{calls}} calls of the function, "
                "{each:.2g} s each. A correct implementation grades in a few seconds (a call "
                "takes milliseconds); the cases not run give no verdict, so the check fails")
        case, how = _watched(name, run, timeout, deadline, what)
        if how and how != "budget":                         # a stub: not implemented yet
            return CheckReport(check, False, done, how, not_implemented=True,
                               false_alarm_rate=false_alarm_rate)
        done.append(case)
        if not case.passed:
            summary = f"failed: {ran} (the check's budget)" if how else f"failed: {name}"
            return CheckReport(check, False, done, summary, case.counterexample,
                               false_alarm_rate=false_alarm_rate)
    return CheckReport(check, True, done, f"all {len(done)} cases passed",
                       false_alarm_rate=false_alarm_rate)
