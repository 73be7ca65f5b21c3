"""minispec.check: every correct implementation passes, every bug of the lab fails.

Correct implementations are minispec's own (the package graded by its own graders) and a lossless
scheme that is not Leviathan's: accept a proposal ``x`` with probability ``p(x)`` and otherwise
draw from ``p`` with ``x`` removed. It is exact for *any* proposal drawn independently of the
accept test: ``P(y) = q(y) p(y) + sum_{x != y} q(x) (1 - p(x)) p(y) / (1 - p(x)) = p(y)``. Its
acceptance ``sum q p`` is lower than ``sum min(p, q)``: the graders test losslessness, not a
formula.
"""

from __future__ import annotations

import functools
import inspect
import threading

import pytest
import torch

import minispec as ms
from minispec import check
from minispec.check import bugs
from minispec.check.markov import SAMPLED
from minispec.check.models import tiny_llama
from minispec.check.statistics import (
    chi_square_critical,
    hoeffding_excess,
    per_test_alpha,
    pool_bins,
)

# ---------------------------------------------------------------- the alternative lossless scheme

def _without(p: torch.Tensor, x: int) -> torch.Tensor:
    """``p`` with token ``x`` removed, renormalised (``p`` itself when nothing is left)."""
    rest = p.clone()
    rest[x] = 0
    return rest / rest.sum() if rest.sum() > 0 else p


def _accept_with_p(p: torch.Tensor, x: int, g: torch.Generator) -> bool:
    return bool(torch.rand((), generator=g, dtype=torch.float64) < float(p[x]))


def alt_sample(p, q, generator):
    """Accept ``x ~ q`` with probability ``p(x)``, else draw from ``p`` without ``x``."""
    x = int(torch.multinomial(q, 1, generator=generator))
    if _accept_with_p(p, x, generator):
        return x, True
    return int(torch.multinomial(_without(p, x), 1, generator=generator)), False


def alt_residual(p, q):
    """``max(0, p - q) / D_LK(p, q)``: the same residual, normalised by ``1 - sum min(p, q)``."""
    excess = (p - q).clamp_min(0)
    mass = 1 - torch.minimum(p, q).sum()
    return excess / mass if mass > 1e-6 else p.clone()


def alt_verify(draft_tokens, draft_probs, target_probs, generator):
    """Algorithm 1 with the one-hot rule at every position (``draft_probs`` is not needed)."""
    drafts = draft_tokens.tolist()
    for i, x in enumerate(drafts):
        if not _accept_with_p(target_probs[i], x, generator):
            rest = _without(target_probs[i], x)
            return drafts[:i] + [int(torch.multinomial(rest, 1, generator=generator))]
    return drafts + [int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator))]


def alt_verify_tree(tree, target_probs, draft_probs, generator):
    """The tree walk with one-hot proposals: try each child in turn against what is left."""
    node, out = 0, []
    while True:
        p = target_probs[node]
        for child in tree.children(node):
            x = tree.tokens[child]
            if _accept_with_p(p, x, generator):
                out.append(x)
                node = child
                break
            p = _without(p, x)
        else:
            return out + [int(torch.multinomial(p, 1, generator=generator))]


def ms_verify(draft_tokens, draft_probs, target_probs, generator):
    """minispec's one accept walk on the chain of the student's signature."""
    return ms.verify(ms.Proposal.chain(draft_tokens, draft_probs), target_probs, generator)


def ms_verify_argmax(draft_tokens, draft_probs, target_probs, generator):
    """minispec's walk given the target's argmaxes only (the runner's plain greedy rows)."""
    return ms.verify(ms.Proposal.chain(draft_tokens, draft_probs),
                     target_probs.argmax(dim=-1).tolist())


def ms_verify_tree(tree, target_probs, draft_probs, generator):
    """minispec's one accept walk on the tree of the student's signature."""
    return ms.verify(ms.Proposal.from_tree(tree, draft_probs), target_probs, generator)


def bigram_propose(context, k):
    """A plain-function n-gram proposer: follow the latest continuation of the last token."""
    out, ctx = [], list(context)
    for _ in range(k):
        later = [ctx[i + 1] for i in range(len(ctx) - 1) if ctx[i] == ctx[-1]]
        if not later:
            break
        out.append(later[-1])
        ctx.append(later[-1])
    return out


CORRECT = [
    ("sampler", ms.speculative_sample, {}),
    ("sampler", alt_sample, {}),
    ("residual", ms.residual, {}),
    ("residual", alt_residual, {}),
    ("verifier", ms_verify, {}),
    ("verifier", alt_verify, {}),
    ("verifier", ms_verify_argmax, {"sampled": False}),
    ("tree_verifier", ms_verify_tree, {}),
    ("tree_verifier", alt_verify_tree, {}),
]


@pytest.mark.parametrize("kind, fn, options", CORRECT,
                         ids=[f"{k}-{f.__name__}" for k, f, _ in CORRECT])
def test_correct_implementations_pass(kind, fn, options):
    report = bugs.CHECKS[kind](fn, **options)
    assert report.passed, str(report)
    assert not report.not_implemented and report.counterexample is None
    assert "PASSED" in str(report)


@pytest.mark.parametrize("make, options", [
    (lambda: ms.NGramDrafter(), {"continues_patterns": True}),
    (lambda: ms.PromptLookupDrafter(), {"continues_patterns": True}),
    (lambda: bigram_propose, {"continues_patterns": True}),
    (lambda: ms.ModelDrafter(tiny_llama(64, seed=3, scale=0.2)), {}),
], ids=["ngram", "prompt-lookup", "function", "model"])
def test_minispec_drafters_pass(make, options):
    report = check.drafter(make(), **options)
    assert report.passed, str(report)


@pytest.mark.parametrize("factory", [
    ms.ContiguousKVCache.for_model,
    lambda model, slots, n: ms.PagedKVCache.for_model(model, slots, n, block_size=4),
    lambda model, slots, n: ms.PagedKVCache.for_model(model, slots, n, block_size=16),
], ids=["contiguous", "paged-4", "paged-16"])
def test_minispec_caches_pass(factory):
    for grade in (check.rollback, check.kv_cache):
        report = grade(factory)
        assert report.passed, str(report)


# ---------------------------------------------------------------- the deterministic graders

def adjust_by_hand(logits, temperature, top_k, top_p):
    """Temperature, top-k, top-p in float64, token by token: another correct adjustment."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), len(logits)).double()
    x = logits.double() / temperature
    if 0 < top_k < len(x):
        x = x.masked_fill(x < x.sort(descending=True).values[top_k - 1], float("-inf"))
    probs, kept, before = x.softmax(-1), torch.zeros(len(x), dtype=torch.bool), 0.0
    for i in probs.argsort(descending=True).tolist():
        if before >= top_p:
            break
        kept[i], before = True, before + float(probs[i])
    return probs.where(kept, 0.0) / probs.where(kept, 0.0).sum()


def adjust_top_k_by_index(logits, temperature, top_k, top_p):
    """Wrong: top-k keeps exactly k indices (``torch.topk``), dropping ties with the k-th."""
    if temperature == 0 or not 0 < top_k < len(logits):
        return ms.probs_from_logits(logits, ms.SamplingParams(temperature, top_k, top_p))
    kept = torch.full_like(logits, float("-inf"))
    index = torch.topk(logits, top_k).indices
    kept[index] = logits[index]
    return ms.probs_from_logits(kept, ms.SamplingParams(temperature, 0, top_p))


def adjust_top_p_inclusive(logits, temperature, top_k, top_p):
    """Wrong: a token is kept only while the mass *including* it stays within top_p."""
    probs = ms.probs_from_logits(logits, ms.SamplingParams(temperature, top_k))
    if top_p >= 1:
        return probs
    ordered, order = probs.sort(descending=True)
    kept = ordered.cumsum(0) <= top_p
    kept[0] = True
    out = torch.zeros_like(probs).index_put_((order[kept],), ordered[kept])
    return out / out.sum()


def adjust_top_p_before_top_k(logits, temperature, top_k, top_p):
    """Wrong: the nucleus is cut from the whole distribution, before top-k."""
    if temperature == 0:
        return ms.probs_from_logits(logits, ms.SamplingParams(0.0))
    nucleus = ms.probs_from_logits(logits, ms.SamplingParams(temperature, 0, top_p)) > 0
    kept = logits.masked_fill(~nucleus, float("-inf"))
    return ms.probs_from_logits(kept, ms.SamplingParams(temperature, top_k))


def speedup_closed_form(alpha, gamma, c, r):
    """Theorem 3.8's closed form, with ``alpha = 1`` apart."""
    tokens = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + r)


def reserve_by_hand(held, needs, block_size, free_blocks, *, give_back=True, ceil=True):
    """The scheduler's reservation as a plain loop; ``give_back=False``: a preempted request's
    blocks are lost (wrong), ``ceil=False``: blocks counted by floor division (wrong)."""
    running, preempted, i = list(range(len(held))), [], 0
    while i < len(running):
        blocks = -(-needs[i] // block_size) if ceil else needs[i] // block_size
        lacking = max(0, blocks - held[i])
        while lacking > free_blocks and i < len(running):
            preempted.append(running.pop())
            free_blocks += held[preempted[-1]] if give_back else 0
        if i < len(running):
            free_blocks -= lacking
            i += 1
    return preempted


TABLES = [   # (grader, correct implementations, (wrong implementation, what the report says))
    (check.acceptance, [ms.theory.acceptance_rate, lambda p, q: 1 - (p - q).abs().sum(-1) / 2],
     [(lambda p, q: (p * q).sum(-1), "not beta"), (lambda p, q: torch.maximum(p, q).sum(-1),
                                                   "not beta"),
      (lambda p, q: 1 - torch.minimum(p, q).sum(-1), "not beta"),
      (lambda p, q: torch.minimum(p, q).sum(), "one number per pair of rows")]),
    (check.adjustment, [lambda x, t, k, p: ms.probs_from_logits(x, ms.SamplingParams(t, k, p)),
                        adjust_by_hand],
     [(adjust_top_k_by_index, "top-k"), (adjust_top_p_inclusive, "top-p"),
      (adjust_top_p_before_top_k, "in order")]),
    (check.speedup, [ms.theory.walltime_speedup, speedup_closed_form],
     [(lambda a, g, c, r: (1 - a ** (g + 1)) / ((1 - a) * (g * c + r)), "ZeroDivisionError"),
      (lambda a, g, c, r: speedup_closed_form(a, g, c, r) * r, "not the expected tokens"),
      (lambda a, g, c, r: speedup_closed_form(a, g - 1, c, r) if g else 1 / r, "Equation (1)")]),
    (check.reservation, [reserve_by_hand, lambda *a: torch.tensor(reserve_by_hand(*a))],
     [(functools.partial(reserve_by_hand, give_back=False), "preempted requests differ"),
      (functools.partial(reserve_by_hand, ceil=False), "preempted requests differ"),
      (lambda *a: reserve_by_hand(*a)[::-1], "preempted requests differ")]),
]


@pytest.mark.parametrize("grade, right, wrong", TABLES, ids=[t[0].__name__ for t in TABLES])
def test_the_deterministic_graders_pass_every_correct_rule_and_fail_wrong_ones(grade, right,
                                                                               wrong):
    for fn in right:
        report = grade(fn)
        assert report.passed and report.false_alarm_rate == 0, str(report)
        assert "deterministic check" in str(report)
    for fn, needle in wrong:
        report = grade(fn)
        assert not report.passed and not report.not_implemented, str(report)
        assert report.counterexample is not None and needle in str(report), str(report)
        assert str(grade(fn)) == str(report)                                # the same verdict


@pytest.mark.parametrize("grade", [t[0] for t in TABLES], ids=[t[0].__name__ for t in TABLES])
def test_the_deterministic_graders_report_a_stub_a_crash_a_hang_and_a_changed_input(grade):
    assert grade(_stub).not_implemented and "fill me in" in str(grade(_stub))
    crashed = grade(_crash)
    assert not crashed.passed and "KeyError" in str(crashed) and crashed.counterexample.inputs
    hung = grade(lambda *args: threading.Event().wait(), timeout=0.5)
    assert not hung.passed and "did not return within 0.5 s" in str(hung)
    assert inspect.signature(grade).parameters["timeout"].default == check.harness.TIMEOUT


def test_a_grader_fails_a_function_that_changes_its_inputs():
    def zeroing(fn):
        def changed(x, *rest):
            out = fn(x, *rest)
            x.zero_()
            return out
        return changed

    for grade, right, _ in TABLES[:2]:
        assert "changed its inputs in place" in str(grade(zeroing(right[0])))


# ---------------------------------------------------------------- the lab

def test_the_lab_is_large_and_documented():
    assert len(bugs.LAB) >= 10
    assert len({bug.name for bug in bugs.LAB}) == len(bugs.LAB)
    for bug in bugs.LAB:
        assert bug.kind in bugs.CHECKS
        assert len(bug.doc) > 40, bug.name
        assert all(url.startswith("https://github.com/") for url in bug.mirrors)
        for url in bug.mirrors:       # an issue it mirrors is named in its docstring
            assert url.rstrip("/").rsplit("/", 1)[-1] in bug.doc, (bug.name, url)


@pytest.mark.parametrize("bug", bugs.LAB, ids=[bug.name for bug in bugs.LAB])
def test_every_lab_bug_fails_its_check(bug):
    report = bugs.run(bug)
    assert not report.passed, f"{bug.name} passed its check:\n{report}"
    assert not report.not_implemented
    assert report.counterexample is not None and report.counterexample.what
    assert "FAILED" in str(report)


def test_a_failure_names_p_q_k_and_the_statistic():
    text = str(bugs.run(bugs.by_name("verify_resample_from_p")))
    for needle in ("p =", "q =", "k =", "expected", "observed", "chi-square", "threshold"):
        assert needle in text, (needle, text)


def test_the_verdict_is_the_same_on_every_run():
    for name in ("sample_top_p_on_draft_only", "verify_adjustment_on_bonus_row_only"):
        bug = bugs.by_name(name)
        assert str(bugs.run(bug)) == str(bugs.run(bug))


def test_checks_leave_the_global_generators_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check.verifier(ms_verify, greedy=False)
    check.drafter(ms.NGramDrafter())
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- stubs and crashes

def _stub(*args):
    raise NotImplementedError("fill me in")


def _crash(*args):
    raise KeyError("oops")


@pytest.mark.parametrize("kind", ["sampler", "residual", "verifier", "tree_verifier", "drafter"])
def test_a_stub_is_reported_as_not_implemented(kind):
    report = bugs.CHECKS[kind](_stub)
    assert not report.passed and report.not_implemented
    assert "NOT IMPLEMENTED" in str(report) and "fill me in" in str(report)


def test_a_stub_cache_is_reported_as_not_implemented():
    class StubCache(ms.ContiguousKVCache):
        def truncate_to(self, slot, n):
            raise NotImplementedError

    report = check.rollback(StubCache.for_model)
    assert report.not_implemented and not report.passed


@pytest.mark.parametrize("kind", ["sampler", "residual", "verifier", "tree_verifier"])
def test_an_exception_is_reported_with_its_inputs(kind):
    report = bugs.CHECKS[kind](_crash)
    assert not report.passed and not report.not_implemented
    text = str(report)
    assert "KeyError" in text and ("p =" in text or "target_probs =" in text), text


# ---------------------------------------------------------------- the statistics

def test_chi_square_critical_values_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 9, 40, 80):
        for alpha in (1e-2, 1e-4, 5e-5):
            ours, theirs = chi_square_critical(alpha, df), stats.chi2.isf(alpha, df)
            assert abs(ours - theirs) < 1e-6 * theirs, (df, alpha)



def test_law_test_is_scipys_pooled_chi_square_and_zero_for_impossible_outcomes():
    """``law_test`` (lessons 03 and 09): scipy's Pearson test on the pooled cells, the TV
    distance, and p = 0 when an outcome of probability 0 was observed; ``tv_tolerance`` holds."""
    stats = pytest.importorskip("scipy.stats")
    from minispec.check.statistics import law_test, tv_tolerance

    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        V = int(torch.randint(3, 30, (), generator=g))
        law = torch.softmax(3 * torch.randn(V, generator=g), 0)
        law[0] = 0.0
        law = law / law.sum()
        n = int(torch.randint(50, 3000, (), generator=g))
        counts = torch.bincount(torch.multinomial(law, n, replacement=True, generator=g),
                                minlength=V)
        expected = n * law.double() / law.double().sum()
        big, small = expected >= 5, (expected < 5) & (law > 0)
        observed = torch.cat([counts[big].double(), counts[small].sum()[None].double()])
        wanted = torch.cat([expected[big], expected[small].sum()[None]])
        keep = wanted > 0
        if keep.sum() < 2:
            continue
        reference = stats.chisquare(observed[keep].numpy(), wanted[keep].numpy()).pvalue
        pvalue, tv = law_test(counts, law)
        assert abs(pvalue - reference) < 1e-9, trial
        assert tv == pytest.approx(0.5 * float((counts / n - law).abs().sum()), abs=1e-6)
        assert tv < tv_tolerance(law, n)
        counts[0] += 1                                       # an impossible outcome, once
        assert law_test(counts, law)[0] == 0.0

def test_the_graders_and_the_lessons_share_one_chi_square_test():
    """Both adapters the lessons call are ``fit``: one Pearson test, pooled the lessons' way
    (below 5, no growth)."""
    from minispec.check import statistics

    counts = torch.tensor([30.0, 52, 15, 3, 0])
    law = torch.tensor([0.3, 0.5, 0.15, 0.04, 0.01], dtype=torch.float64)
    pooled = statistics.fit(counts, law, min_expected=5.0, grow=False)       # 4 and 1 pooled
    assert pooled.df == 3 and 0 < pooled.pvalue < 1
    assert statistics.law_test(counts, law)[0] == pytest.approx(pooled.pvalue, rel=1e-9)
    outcomes = [i for i, n in enumerate(counts.long().tolist()) for _ in range(n)]
    mapping = dict(enumerate(law.tolist()))
    assert statistics.chi_square(outcomes, mapping)[0] == pytest.approx(pooled.pvalue, rel=1e-9)


def test_hoeffding_bound_holds():
    n, beta, alpha = 400, 0.3, 1e-3
    g = torch.Generator().manual_seed(0)
    counts = (torch.rand(20000, n, generator=g) < beta).sum(dim=1).double()
    assert (counts > n * beta + hoeffding_excess(n, alpha)).double().mean() <= alpha


def _pooled_false_alarms(probs, n, alpha, sims, seed):
    """Empirical rate at which the pooled Pearson test rejects exact multinomial counts."""
    probs = probs.double()
    bins = pool_bins(probs * n, 10.0)
    num_bins = int(bins.max()) + 1
    e = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, probs * n)
    threshold = chi_square_critical(alpha, num_bins - 1)
    g, rejected = torch.Generator().manual_seed(seed), 0
    for _ in range(sims // 10_000):
        draws = torch.multinomial(probs.float(), 10_000 * n, replacement=True, generator=g)
        counts = torch.zeros(10_000, len(probs), dtype=torch.float64).scatter_add_(
            1, draws.view(10_000, n), torch.ones(10_000, n, dtype=torch.float64))
        o = torch.zeros(10_000, num_bins, dtype=torch.float64).index_add_(1, bins, counts)
        rejected += int((((o - e) ** 2 / e).sum(1) > threshold).sum())
    return rejected / sims


@pytest.mark.parametrize("length, n", [(4, 600), (4, 400), (1, 600)])
def test_pooled_chi_square_is_not_anti_conservative(length, n):
    """Each test gets a quarter of its Bonferroni share: its real tail must stay below 2 alpha."""
    alpha = per_test_alpha(6)                       # the verifier's level, 4.2e-5
    law = SAMPLED.law(length)
    rate = _pooled_false_alarms(law, n, 100 * alpha, 100_000, seed=length + n)
    assert rate <= 2 * 100 * alpha, rate            # checked at 100x alpha, where 100k sims see it
