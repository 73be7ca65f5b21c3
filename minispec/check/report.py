"""What a check returns: a [`CheckReport`][minispec.check.report.CheckReport].

A check is a list of *cases* run in order. Each case either passes, or fails with a
[`Counterexample`][minispec.check.report.Counterexample]: the inputs that show the problem (``p``,
``q``, ``k``, ...), the expected and observed frequencies, and the statistic with its threshold.
The first failing case stops the check, so the report shows one small counterexample, not many.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch


def fmt(x: Any) -> str:
    """A short readable rendering of a tensor, a float or a list (4 decimals)."""
    x = x.tolist() if isinstance(x, torch.Tensor) else x
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(map(fmt, x)) + "]"
    return str(x)


@dataclass
class Counterexample:
    """The smallest evidence of a failure that a check found.

    Attributes:
        what: one sentence: which law or rule differs.
        inputs: the inputs of the failing case, e.g. ``{"p": ..., "q": ..., "k": 2}``.
        table: rows ``(outcome, expected, observed)``: frequencies (or values) side by side,
            the most discrepant first.
        statistic: name of the test statistic (``"Pearson chi-square, 5 df"``), if one was used.
        value: its value.
        threshold: the value above which the check fails (the critical value).
    """

    what: str
    inputs: dict[str, Any] = field(default_factory=dict)
    table: list[tuple[str, Any, Any]] = field(default_factory=list)
    statistic: str | None = None
    value: float | None = None
    threshold: float | None = None

    def __str__(self) -> str:
        lines = [self.what]
        lines += [f"  {name} = {fmt(value)}" for name, value in self.inputs.items()]
        if self.table:
            lines.append(f"  {'outcome':<22} {'expected':>10} {'observed':>10}")
            lines += [f"  {label:<22} {fmt(e):>10} {fmt(o):>10}" for label, e, o in self.table]
        if self.statistic is not None:
            lines.append(f"  {self.statistic}: {fmt(self.value)} > threshold {fmt(self.threshold)}")
        return "\n".join(lines)


@dataclass
class Case:
    """One case of a check: its name, whether it passed, and a short note (sample size, p-value)."""

    name: str
    passed: bool
    note: str = ""
    counterexample: Counterexample | None = None


@dataclass
class CheckReport:
    """The verdict of one ``minispec.check`` function.

    Attributes:
        check: which check ran (``"verifier"``, ``"sampler"``, ...).
        passed: True when every case passed.
        cases: the cases run, in order (a check stops at its first failing case).
        summary: one sentence for the whole verdict.
        counterexample: for a failure, the evidence (``None`` when passed).
        not_implemented: the function raised ``NotImplementedError`` (an unfinished exercise).
        false_alarm_rate: the probability, over the check's seed, that a *correct*
            implementation fails (the documented bound).
        hint: advice that is not a failure (e.g. a lossless verifier that never emits the
            bonus token), or ``""``.
    """

    check: str
    passed: bool
    cases: list[Case]
    summary: str
    counterexample: Counterexample | None = None
    not_implemented: bool = False
    false_alarm_rate: float = 0.0
    hint: str = ""

    def __str__(self) -> str:
        verdict = ("PASSED" if self.passed
                   else "NOT IMPLEMENTED" if self.not_implemented else "FAILED")
        lines = [f"check.{self.check}: {verdict} -- {self.summary}"]
        for case in self.cases:
            mark = "ok  " if case.passed else "FAIL"
            lines.append(f"  [{mark}] {case.name}" + (f" ({case.note})" if case.note else ""))
        if self.counterexample is not None:
            lines.append("Counterexample: " + str(self.counterexample).replace("\n", "\n  "))
        if self.hint:
            lines.append("hint: " + self.hint)
        if not self.not_implemented:
            lines.append("(deterministic check: a correct implementation always passes)"
                         if self.false_alarm_rate == 0 else "(false-alarm rate for a correct "
                         f"implementation <= {self.false_alarm_rate:g})")
        return "\n".join(_wrap(line) for text in lines for line in text.split("\n"))


def _wrap(line: str, width: int = 100) -> str:
    """A long report line folded at ``width``, continuation lines indented under it."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) if len(line) > width else line
