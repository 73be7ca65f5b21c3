"""Graders for a student's own speculative decoder, and a lab of real bugs.

Each grader returns a [`CheckReport`][minispec.check.report.CheckReport]: ``report.passed``, the
cases run, a failure's small counterexample.

    import minispec as ms
    print(ms.check.verifier(my_verify))   # my_verify(draft_tokens, draft_probs, target_probs, g)

* [`sampler`][minispec.check.sampling.sampler] -- one accept-or-resample step;
* [`residual`][minispec.check.sampling.residual] -- the residual ``norm(max(0, p - q))``;
* [`acceptance`][minispec.check.sampling.acceptance] -- the acceptance rate ``sum min(p, q)``;
* [`adjustment`][minispec.check.sampling.adjustment] -- temperature, top-k and top-p;
* [`verifier`][minispec.check.markov.verifier] -- a chain verifier (Algorithm 1's loop);
* [`speedup`][minispec.check.sampling.speedup] -- the walltime speedup of a round (Theorem 3.8);
* [`tree_verifier`][minispec.check.markov.tree_verifier] -- a draft tree's walk;
* [`drafter`][minispec.check.drafting.drafter] -- a drafter and the ``q`` it declares;
* [`rollback`][minispec.check.caches.rollback] (alias ``kv_cache``) -- a KV cache's rollback;
* [`reservation`][minispec.check.caches.reservation] -- reserving blocks for a batch's rounds.

Every check is seeded (the same verdict on every run), runs in seconds within its ``budget`` (a
parameter: a slower implementation fails, the report saying how many cases ran), calls the
student's code under a deadline ([`harness`][minispec.check.harness]: it never crashes, exits or
hangs on it, nor on the reading of a result) and fails a correct implementation with probability at
most ``1e-3`` (a deterministic one: never; each docstring justifies its sample sizes). Any exact
rule passes; [`bugs`][minispec.check.bugs] is the lab of real engine bugs.
"""

from minispec.check import bugs
from minispec.check.caches import kv_cache, reservation, rollback
from minispec.check.drafting import drafter
from minispec.check.grammar import masked_verifier
from minispec.check.markov import tree_verifier, verifier
from minispec.check.report import Case, CheckReport, Counterexample
from minispec.check.sampling import acceptance, adjustment, residual, sampler, speedup

__all__ = ["Case", "CheckReport", "Counterexample", "acceptance", "adjustment", "bugs", "drafter",
           "kv_cache", "masked_verifier", "reservation", "residual", "rollback", "sampler",
           "speedup", "tree_verifier", "verifier"]
