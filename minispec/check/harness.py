"""How a check runs a student's code: calls that turn exceptions into verdicts, the case loop, and
a guard that proves a function draws its randomness from the generator it is given.

A function that raises ``NotImplementedError`` (an exercise's stub) gives a clean report with
``passed=False`` and ``not_implemented=True``; any other exception raised *by the student's code*
is a failure that names the exception and the inputs that provoked it. Exceptions raised by the
checker itself are not caught: they are the checker's bugs.
"""

from __future__ import annotations

import contextlib
import random
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from minispec.check.report import Case, CheckReport, Counterexample

__all__ = ["Failure", "StudentError", "as_tokens", "call", "perturbed_global_rng",
           "reproducible_case", "run_cases"]


class _Stub(Exception):
    """The student's function raised NotImplementedError."""


class StudentError(Exception):
    """The student's function raised; carries the exception and the inputs that provoked it."""

    def __init__(self, error: BaseException, inputs: dict[str, Any]) -> None:
        super().__init__(str(error))
        self.error, self.inputs = error, inputs


class Failure(Exception):
    """A case failed for certain (no statistics needed): carries its counterexample."""

    def __init__(self, counterexample: Counterexample) -> None:
        super().__init__(counterexample.what)
        self.counterexample = counterexample


def call(fn: Callable[..., Any], *args: Any, inputs: dict[str, Any] | None = None) -> Any:
    """Call the student's ``fn(*args)``, turning its exceptions into the check's verdicts."""
    try:
        return fn(*args)
    except NotImplementedError as error:
        raise _Stub(str(error)) from error
    except Exception as error:  # the student's bug, reported with its inputs
        raise StudentError(error, inputs or {}) from error


def as_tokens(out: Any, inputs: dict[str, Any]) -> list[int]:
    """The emitted tokens of a verifier's result: a list, a tensor or an object with ``.tokens``."""
    out = getattr(out, "tokens", out)
    try:
        if isinstance(out, torch.Tensor):
            out = out.flatten().tolist()
        return [int(x) for x in out]
    except (TypeError, ValueError) as error:
        raise Failure(Counterexample(
            f"the result is not a list of token ids: {type(out).__name__} ({error})", inputs)
        ) from error


@contextlib.contextmanager
def perturbed_global_rng(seed: int) -> Iterator[None]:
    """Reseed torch's, Python's and numpy's global generators inside the block; restore after.

    Two runs with the same explicit generator but differently seeded global generators emit the
    same tokens only if the function ignores the global ones, as it must (vLLM #13196).
    """
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    try:
        import numpy
        np_state = numpy.random.get_state()  # noqa: NPY002 - the legacy global RNG is the point
    except ImportError:  # pragma: no cover - numpy ships with torch in practice
        numpy, np_state = None, None
    torch.manual_seed(seed)
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed)  # noqa: NPY002
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        if numpy is not None:
            numpy.random.set_state(np_state)  # noqa: NPY002


def reproducible_case(name: str, run: Callable[[torch.Generator], list[int]], seed: int,
                      inputs: dict[str, Any]) -> Case:
    """Run ``run(generator)`` twice with generators seeded alike and the global generators seeded
    differently: the outputs must be identical (the seed is honoured, no other source is used)."""
    outs = []
    for perturb in (11, 12):
        with perturbed_global_rng(perturb):
            outs.append(run(torch.Generator().manual_seed(seed)))
    if outs[0] != outs[1]:
        raise Failure(Counterexample(
            "two runs with generators seeded alike emitted different tokens: the function draws "
            "random numbers from somewhere other than the generator it is given "
            "(the seed is ignored, as in vLLM #13196)",
            dict(inputs, seed=seed, run_1=outs[0][:16], run_2=outs[1][:16])))
    return Case(name, True, f"{len(outs[0])} tokens identical in two runs")


def _raised(check: str, cases: list[Case], err: StudentError, rate: float) -> CheckReport:
    frames = traceback.extract_tb(err.error.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    what = f"the function raised {type(err.error).__name__}: {err.error}{where}"
    cases.append(Case("the function runs", False, type(err.error).__name__))
    return CheckReport(check, False, cases, "the function raised an exception",
                       Counterexample(what, err.inputs), false_alarm_rate=rate)


def run_cases(check: str, cases: Sequence[tuple[str, Callable[[], Case]]],
              false_alarm_rate: float) -> CheckReport:
    """Run ``cases`` (name, thunk) in order; stop at the first failure; build the report.

    Args:
        check: the check's name, for the report.
        cases: each thunk returns a [`Case`][minispec.check.report.Case] or raises
            [`Failure`][minispec.check.harness.Failure].
        false_alarm_rate: the documented bound, copied into the report.
    """
    done: list[Case] = []
    for name, run in cases:
        try:
            case = run()
        except _Stub as stub:
            why = f": {stub}" if str(stub) else ""
            summary = f"not implemented yet (NotImplementedError{why})"
            return CheckReport(check, False, done, summary,
                               not_implemented=True, false_alarm_rate=false_alarm_rate)
        except StudentError as err:
            return _raised(check, done, err, false_alarm_rate)
        except Failure as failure:
            case = Case(name, False, "", failure.counterexample)
        done.append(case)
        if not case.passed:
            return CheckReport(check, False, done, f"failed: {case.name}", case.counterexample,
                               false_alarm_rate=false_alarm_rate)
    return CheckReport(check, True, done, f"all {len(done)} cases passed",
                       false_alarm_rate=false_alarm_rate)
