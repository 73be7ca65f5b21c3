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
    "sampler": sampler, "residual": residual, "verifier": verifier,
    "tree_verifier": tree_verifier, "drafter": drafter, "rollback": rollback,
}


@dataclass(frozen=True)
class Bug:
    """One buggy implementation of the lab.

    Attributes:
        name: short name (the implementation's ``__name__``).
        kind: which check grades it (a key of ``CHECKS``).
        make: returns the implementation (a function, a drafter, or a cache factory).
        mirrors: URLs of the reported issues it is modelled on (empty for a classic mistake).
        options: keyword arguments for the check (e.g. greedy mode only).
    """

    name: str
    kind: str
    make: Callable[[], Any]
    mirrors: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)

    @property
    def doc(self) -> str:
        """The implementation's docstring: what the bug is and why it breaks the law."""
        obj = self.make()
        return (getattr(obj, "__doc__", None) or getattr(self.make, "__doc__", "") or "").strip()


_VLLM = "https://github.com/vllm-project/vllm/"


def _bug(impl: Any, kind: str, *mirrors: str, make: Callable | None = None, **options) -> Bug:
    return Bug(impl.__name__, kind, make or (lambda: impl), tuple(mirrors), options)


def _factory(cls: type) -> Callable:
    def make() -> Callable:
        def factory(model, num_slots, max_seq_len):
            kwargs = {"block_size": 4} if issubclass(cls, components.PagedKVCache) else {}
            return cls.for_model(model, num_slots, max_seq_len, **kwargs)
        factory.__doc__ = cls.__doc__
        return factory
    return make


S, V, C = samplers, verifiers, components

#: Every bug of the lab, grouped by the check that catches it.
LAB: list[Bug] = [
    _bug(S.sample_resample_from_p, "sampler"),
    _bug(S.sample_ratio_q_over_p, "sampler"),
    _bug(S.sample_residual_q_minus_p, "sampler"),
    _bug(S.sample_top_p_on_draft_only, "sampler", _VLLM + "pull/10198"),
    _bug(S.sample_seed_ignored, "sampler", _VLLM + "issues/6038", _VLLM + "issues/13196"),
    _bug(S.residual_q_minus_p, "residual"),
    _bug(S.residual_unnormalised, "residual"),
    _bug(S.residual_nan_when_equal, "residual"),
    _bug(V.verify_resample_from_p, "verifier"),
    _bug(V.verify_bonus_from_wrong_row, "verifier"),
    _bug(V.verify_one_uniform_for_all_positions, "verifier"),
    _bug(V.UniformsSharedAcrossRows, "verifier", _VLLM + "issues/9441",
         "https://github.com/1CatAI/1Cat-vLLM/issues/656", make=V.UniformsSharedAcrossRows),
    _bug(V.verify_continues_after_rejection, "verifier"),
    _bug(V.verify_seed_ignored, "verifier", _VLLM + "issues/13196"),
    _bug(V.verify_adjustment_on_bonus_row_only, "verifier", _VLLM + "issues/18902",
         "https://github.com/sgl-project/sglang/pull/28242",
         "https://github.com/NVIDIA/TensorRT-LLM/pull/17701"),
    _bug(V.verify_greedy_rows_shifted, "verifier", sampled=False),
    _bug(V.tree_siblings_against_p, "tree_verifier",
         "https://github.com/SafeAILab/EAGLE/issues/221"),
    _bug(V.tree_bonus_from_parent_row, "tree_verifier"),
    _bug(C.ArgmaxDeclaredAsSampled, "drafter", "https://github.com/SafeAILab/EAGLE/issues/183",
         "https://github.com/SafeAILab/EAGLE/issues/221", make=C.ArgmaxDeclaredAsSampled),
    _bug(C.SampledDeclaredDeterministic, "drafter", _VLLM + "pull/16899", _VLLM + "issues/40149",
         make=C.SampledDeclaredDeterministic),
    _bug(C.AdjustmentOnSampleOnly, "drafter", _VLLM + "pull/10198", make=C.AdjustmentOnSampleOnly),
    _bug(C.OffByOneCache, "rollback", make=_factory(C.OffByOneCache)),
    _bug(C.LeakyPagedCache, "rollback", make=_factory(C.LeakyPagedCache)),
    _bug(C.PagedCacheFreesPartialBlock, "rollback", make=_factory(C.PagedCacheFreesPartialBlock)),
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
