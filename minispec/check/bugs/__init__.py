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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minispec.check.bugs import components, samplers, verifiers
from minispec.check.caches import rollback
from minispec.check.chains import verifier
from minispec.check.drafting import drafter
from minispec.check.report import CheckReport
from minispec.check.sampling import residual, sampler
from minispec.check.trees import tree_verifier

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
        mirrors: URLs of the reported issues it is modelled on (empty for a classic mistake).
        options: keyword arguments for the check (e.g. greedy mode only).
    """

    name: str
    kind: str
    make: Callable[[], Any]
    doc: str
    mirrors: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)


def _bug(impl: Any, kind: str, *mirrors: str, **options) -> Bug:
    """The lab entry of ``impl``: a function, a class whose instances are the implementation
    (stateful verifiers, drafters), or a cache class (its ``for_model`` is the factory)."""
    if kind == "rollback":          # a paged cache gets small blocks: rollback crosses them
        blocks = {"block_size": 4} if issubclass(impl, components.PagedKVCache) else {}
        make = lambda: functools.partial(impl.for_model, **blocks)
    else:
        make = impl if isinstance(impl, type) else lambda: impl
    return Bug(impl.__name__, kind, make, (impl.__doc__ or "").strip(), mirrors, options)


_VLLM = "https://github.com/vllm-project/vllm/"
_EAGLE = "https://github.com/SafeAILab/EAGLE/issues/"
S, V, C = samplers, verifiers, components

#: Every bug of the lab, grouped by the check that catches it.
LAB: list[Bug] = [
    *[_bug(f, "sampler") for f in (S.sample_resample_from_p, S.sample_ratio_q_over_p,
                                   S.sample_residual_q_minus_p)],
    _bug(S.sample_top_p_on_draft_only, "sampler", _VLLM + "pull/10198"),
    _bug(S.sample_seed_ignored, "sampler", _VLLM + "issues/6038", _VLLM + "issues/13196"),
    *[_bug(f, "residual") for f in (S.residual_q_minus_p, S.residual_unnormalised,
                                    S.residual_nan_when_equal)],
    *[_bug(f, "verifier") for f in (V.verify_resample_from_p, V.verify_bonus_from_wrong_row,
                                    V.verify_one_uniform_for_all_positions)],
    _bug(V.UniformsSharedAcrossRows, "verifier", _VLLM + "issues/9441",
         "https://github.com/1CatAI/1Cat-vLLM/issues/656"),
    _bug(V.verify_continues_after_rejection, "verifier"),
    _bug(V.verify_seed_ignored, "verifier", _VLLM + "issues/13196"),
    _bug(V.verify_adjustment_on_bonus_row_only, "verifier", _VLLM + "issues/18902",
         "https://github.com/sgl-project/sglang/pull/28242",
         "https://github.com/NVIDIA/TensorRT-LLM/pull/17701"),
    _bug(V.verify_greedy_rows_shifted, "verifier", sampled=False),
    _bug(V.tree_siblings_against_p, "tree_verifier", _EAGLE + "221"),
    _bug(V.tree_bonus_from_parent_row, "tree_verifier"),
    _bug(C.ArgmaxDeclaredAsSampled, "drafter", _EAGLE + "183", _EAGLE + "221"),
    _bug(C.SampledDeclaredDeterministic, "drafter", _VLLM + "pull/16899", _VLLM + "issues/40149"),
    _bug(C.AdjustmentOnSampleOnly, "drafter", _VLLM + "pull/10198"),
    *[_bug(cls, "rollback") for cls in (C.OffByOneCache, C.LeakyPagedCache,
                                        C.PagedCacheFreesPartialBlock)],
]


def by_name(name: str) -> Bug:
    """The lab entry called ``name``."""
    for bug in LAB:
        if bug.name == name:
            return bug
    raise KeyError(f"no bug named {name!r}; the lab has {[b.name for b in LAB]}")


def run(bug: Bug, **options) -> CheckReport:
    """Grade ``bug`` with its check (a fresh implementation each time, so runs are independent)."""
    return CHECKS[bug.kind](bug.make(), **{**bug.options, **options})
