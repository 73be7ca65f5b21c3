"""Graders for a student's own speculative decoder, and a lab of real bugs.

Each grader takes a student's code and returns a [`CheckReport`][minispec.check.report.CheckReport]:
``report.passed``, the cases run and, for a failure, a small counterexample that ``print(report)``
explains (a ``NotImplementedError`` stub: "not implemented").

    import minispec as ms
    report = ms.check.verifier(my_verify)   # my_verify(draft_tokens, draft_probs, target_probs, g)
    print(report)

* [`sampler`][minispec.check.sampling.sampler] -- one accept-or-resample step;
* [`residual`][minispec.check.sampling.residual] -- the residual ``norm(max(0, p - q))``;
* [`verifier`][minispec.check.chains.verifier] -- a chain verifier (Algorithm 1's loop);
* [`tree_verifier`][minispec.check.trees.tree_verifier] -- a draft tree's walk;
* [`drafter`][minispec.check.drafting.drafter] -- a drafter and the ``q`` it declares;
* [`rollback`][minispec.check.caches.rollback] (alias ``kv_cache``) -- a KV cache's rollback.

Every check is seeded (the same verdict on every run), runs in seconds, calls the student's code
under a deadline (``timeout=``; [`minispec.check.harness`][minispec.check.harness]) so that it never
crashes or hangs on it, and fails a correct implementation with probability at most ``1e-3`` (a
deterministic one: never; each docstring justifies its sample sizes). Any exact rule passes.

[`minispec.check.bugs`][minispec.check.bugs] is the lab: buggy samplers, verifiers, tree walks,
drafters and caches modelled on reported engine bugs, each caught by its check;
[`minispec.check.laws`][minispec.check.laws], the lessons' exact laws of a model's first tokens.
"""

from minispec.check import bugs
from minispec.check.caches import kv_cache, rollback
from minispec.check.chains import verifier
from minispec.check.drafting import drafter
from minispec.check.report import Case, CheckReport, Counterexample
from minispec.check.sampling import residual, sampler
from minispec.check.trees import tree_verifier

__all__ = ["Case", "CheckReport", "Counterexample", "bugs", "drafter", "kv_cache", "residual",
           "rollback", "sampler", "tree_verifier", "verifier"]
