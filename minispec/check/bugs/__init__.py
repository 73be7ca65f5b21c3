"""A lab of real bugs: speculative decoders that are lossless in name only.

Each entry of ``LAB`` is one mistake, written as a student (or an
engine) would write the correct code with that one thing wrong, with the check that catches it
and the reported issue it mirrors. Lesson 12 ("how speculative decoders go wrong") shows what
each does to the law; ``tests/test_check.py`` asserts that every one fails its check.

    from minispec.check import bugs
    for bug in bugs.LAB:
        report = bugs.run(bug)          # the matching minispec.check function
        print(bug.name, report.passed)  # always False

The implementations live in [`samplers`][minispec.check.bugs.samplers],
[`verifiers`][minispec.check.bugs.verifiers] and [`components`][minispec.check.bugs.components].
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minispec.check.bugs import components, samplers, verifiers
from minispec.check.caches import rollback
from minispec.check.drafting import drafter
from minispec.check.markov import tree_verifier, verifier
from minispec.check.report import CheckReport
from minispec.check.sampling import residual, sampler

__all__ = ["CHECKS", "LAB", "Bug", "by_name", "components", "run", "samplers", "verifiers"]

#: The check each kind of implementation is graded by.
CHECKS: dict[str, Callable[..., CheckReport]] = {
    check.__name__: check for check in (sampler, residual, verifier, tree_verifier, drafter,
                                        rollback)}


@dataclass(frozen=True)
class Bug:
    """One buggy implementation of the lab.

    Attributes:
        name: short name (the implementation's ``__name__``).
        kind: which check grades it (a key of ``CHECKS``).
        make: returns the implementation (a function, a drafter, or a cache factory).
        doc: the implementation's docstring: what the bug is and why it breaks the law.
        mirrors: URLs of the reported issues it is modelled on, those its docstring links (empty
            for a classic mistake).
        options: keyword arguments for the check (greedy mode only for a greedy verifier).
    """

    name: str
    kind: str
    make: Callable[[], Any]
    doc: str
    mirrors: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)


def _bug(impl: Any, kind: str) -> Bug:
    """The lab entry of ``impl``: a function, a class whose instances are the implementation
    (stateful verifiers, drafters), or a cache class (its ``for_model`` is the factory). It mirrors
    the issues its docstring links; a greedy verifier is graded in greedy mode only."""
    if kind == "rollback":          # a paged cache gets small blocks: rollback crosses them
        blocks = {"block_size": 4} if issubclass(impl, components.PagedKVCache) else {}
        make = lambda: functools.partial(impl.for_model, **blocks)
    else:
        make = impl if isinstance(impl, type) else lambda: impl
    doc = (impl.__doc__ or "").strip()
    mirrors = tuple(re.findall(r"https://github\.com/[\w./-]+?(?=[),.;\s]|$)", doc))
    return Bug(impl.__name__, kind, make, doc, mirrors,
               {"sampled": False} if "greedy" in impl.__name__ else {})


S, V, C = samplers, verifiers, components

#: Every bug of the lab, grouped by the check that catches it.
LAB: list[Bug] = [_bug(impl, kind) for kind, impls in {
    "sampler": (S.sample_resample_from_p, S.sample_ratio_q_over_p, S.sample_residual_q_minus_p,
                S.sample_top_p_on_draft_only, S.sample_seed_ignored),
    "residual": (S.residual_q_minus_p, S.residual_unnormalised, S.residual_nan_when_equal),
    "verifier": (V.verify_resample_from_p, V.verify_bonus_from_wrong_row,
                 V.verify_one_uniform_for_all_positions, V.UniformsSharedAcrossRows,
                 V.verify_continues_after_rejection, V.verify_seed_ignored,
                 V.verify_adjustment_on_bonus_row_only, V.verify_greedy_rows_shifted),
    "tree_verifier": (V.tree_siblings_against_p, V.tree_bonus_from_parent_row),
    "drafter": (C.ArgmaxDeclaredAsSampled, C.SampledDeclaredDeterministic,
                C.AdjustmentOnSampleOnly),
    "rollback": (C.OffByOneCache, C.LeakyPagedCache, C.PagedCacheFreesPartialBlock),
}.items() for impl in impls]


def by_name(name: str) -> Bug:
    """The lab entry called ``name``."""
    for bug in LAB:
        if bug.name == name:
            return bug
    raise KeyError(f"no bug named {name!r}; the lab has {[b.name for b in LAB]}")


def run(bug: Bug, **options) -> CheckReport:
    """Grade ``bug`` with its check (a fresh implementation each time, so runs are independent)."""
    return CHECKS[bug.kind](bug.make(), **{**bug.options, **options})
