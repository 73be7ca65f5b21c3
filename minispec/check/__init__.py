"""Graders for a student's own speculative decoder, and a lab of real bugs.

Each function takes a student's implementation and returns a
[`CheckReport`][minispec.check.report.CheckReport]: ``report.passed``, the cases run, and for a
failure a small counterexample (``p``, ``q``, ``k``, expected against observed frequencies, the
statistic and its threshold); ``print(report)`` explains it. A function that raises
``NotImplementedError`` gets a clean "not implemented" report.

    import minispec as ms
    report = ms.check.verifier(my_verify)   # my_verify(draft_tokens, draft_probs, target_probs, g)
    print(report)

* [`sampler`][minispec.check.sampling.sampler] -- ``fn(p, q, generator) -> (token, accepted)``:
  the token's law is ``p`` on 5 pairs (chi-square), acceptance at most ``sum min(p, q)``, the
  seed honoured;
* [`residual`][minispec.check.sampling.residual] -- ``fn(p, q) -> [V]``: equals
  ``norm(max(0, p - q))`` on 20 pairs, no NaN when ``p == q``;
* [`verifier`][minispec.check.chains.verifier] --
  ``fn(draft_tokens, draft_probs, target_probs, generator) -> tokens``: the law of whole 4-token
  streams over several rounds (toy Markov target and draft, exact law by enumeration), greedy
  mode, the seed honoured, and a hint when it never emits the bonus token;
* [`tree_verifier`][minispec.check.trees.tree_verifier] --
  ``fn(tree, target_probs, draft_probs, generator) -> tokens``: the same for a draft tree's walk;
* [`drafter`][minispec.check.drafting.drafter] -- an object with ``propose``, or
  ``fn(context, k) -> ids``: proposals follow the declared ``q`` (one-hot: deterministic), greedy
  decoding with it equals plain greedy decoding;
* [`rollback`][minispec.check.caches.rollback] (alias ``kv_cache``) --
  ``cache_factory(model, num_slots, max_seq_len)``: after ``truncate_to`` the next logits equal a
  cache-free forward; lengths and paged blocks right.

Every call of the student's code runs under a deadline (``timeout=``, seconds per call, default
5): a function that hangs, or returns an endless generator, fails with the case that showed it,
and so does a result of the wrong type (a float where a token id belongs, a complex residual);
a check never crashes on what the student's code does.

Every check is seeded (the same verdict on every run), runs in seconds on two cores, and fails a
correct implementation with probability at most ``1e-3`` over the choice of seed (the statistical
ones) or never (the deterministic ones); each docstring justifies its sample sizes. The checks
test *losslessness*, not one formula: any exact rule passes.

[`minispec.check.bugs`][minispec.check.bugs] holds the lab: buggy samplers, verifiers, tree
walks, drafters and caches modelled on reported engine bugs, each caught by its check.
[`minispec.check.laws`][minispec.check.laws] is the harness the lessons test whole decoders with:
exact laws of the first tokens from a model's logits, and Pearson's test against them.
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
