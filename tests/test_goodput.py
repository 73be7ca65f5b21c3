"""Batch-aware k: the goodput choice on synthetic costs, the cost bookkeeping, and the engine with
``adaptive=True`` (same greedy tokens as the plain engine, choices recorded and within limits)."""

from __future__ import annotations

import inspect
import random

import pytest
import torch
from tinymodels import tiny_llama

import minispec as ms
from minispec.core.theory import expected_tokens
from minispec.speed.goodput import (
    HURDLE,
    GoodputK,
    StepCosts,
    alpha_estimates,
    bucket,
    choose_ks,
)


def costs_with(verify, draft: float, rows: int, k_max: int = 4) -> StepCosts:
    """Measured costs: ``verify(T)`` seconds for a forward of ``T`` tokens per row."""
    costs = StepCosts()
    for t in range(1, k_max + 2):
        costs.record_verify(rows, t, verify(t))
    costs.record_draft(1, 1, draft)
    return costs


def test_memory_bound_verify_drafts_the_most():
    """Verify costs the same for 1..5 tokens (the premise of Theorem 3.8): with a good acceptance
    and a cheap draft, the longest draft wins."""
    choice = choose_ks([0.9], [4], 4, costs_with(lambda t: 1.0, 0.02, rows=1))
    assert choice.ks == [4]
    # one request has no batch to refill: its four draft steps are charged as they are
    assert max(choice.goodput.values()) == pytest.approx(expected_tokens(0.9, 4) / 1.08)
    two = choose_ks([0.9] * 2, [4] * 2, 4, costs_with(lambda t: 1.0, 0.02, rows=2))
    assert two.ks == [4, 4]
    # with two, drafting's extra seconds (four draft steps) are charged 1 + margin times
    assert max(two.goodput.values()) == pytest.approx(2 * expected_tokens(0.9, 4)
                                                      / (1.0 + 1.3 * 4 * 0.02))


def test_a_small_predicted_gain_is_not_taken():
    """A plan that beats plain decoding by a few per cent on paper beats neither the margin on
    its extra cost nor the hurdle on its gain; each alone declines it."""
    costs = costs_with(lambda t: 1.0 + 0.8 * (t - 1), 0.0, rows=16)   # k = 1: verify 1.8
    alphas = [0.87] * 16                      # E = 1.87 tokens for 1.8 steps: +4 % on paper
    assert choose_ks(alphas, [1] * 16, 1, costs, margin=0.0, hurdle=0.0).ks == [1] * 16
    assert choose_ks(alphas, [1] * 16, 1, costs, margin=0.0).ks == [0] * 16     # the hurdle
    assert choose_ks(alphas, [1] * 16, 1, costs, hurdle=0.0).ks == [0] * 16     # the margin
    assert choose_ks(alphas, [1] * 16, 1, costs).ks == [0] * 16


def test_the_hurdle_is_a_least_predicted_gain():
    """A plan is taken exactly when it predicts more than ``1 + hurdle`` times plain's goodput."""
    costs = costs_with(lambda t: 1.0 + 0.5 * (t - 1), 0.0, rows=1)    # k = 1: verify 1.5
    choice = choose_ks([0.8], [1], 1, costs, margin=0.0, hurdle=0.0)  # 1.8 tokens / 1.5 s
    gain = max(choice.goodput.values()) / choice.goodput[0, 0] - 1
    assert gain == pytest.approx(0.2)
    assert choose_ks([0.8], [1], 1, costs, margin=0.0, hurdle=0.19).ks == [1]
    assert choose_ks([0.8], [1], 1, costs, margin=0.0, hurdle=0.21).ks == [0]


def test_a_catch_up_is_charged_to_the_tokens_it_buys():
    """A row whose draft cache lags by ``lag`` tokens, with ``left`` tokens still to generate,
    owes ``catch_up * lag / left`` seconds per token it emits (no margin on it): a step that
    expects ``t`` tokens from it pays ``t`` shares. Priced so, a plan worth 20 % more tokens per
    second than plain is declined when its share costs more than that, and a caught-up row
    (lag 0) still takes it; with two rows of equal acceptance, the one that owes less drafts."""
    costs = costs_with(lambda t: 1.0 + 0.5 * (t - 1), 0.0, rows=1)    # k = 1: verify 1.5
    costs.record_catch_up(tokens=180, seconds=1.0)                     # 1/180 s a token
    assert costs.catch_up == pytest.approx(1 / 180)
    args = ([0.8], [1], 1, costs)
    owes = choose_ks(*args, margin=0.0, hurdle=0.0, lags=[50 / 5])    # lag 50, 5 tokens left
    assert max(owes.goodput.values()) == pytest.approx(1.8 / 1.6)    # 1.8 tokens owe 0.1 s
    assert choose_ks(*args, margin=0.0, hurdle=0.0, lags=[40]).ks == [0]   # 1.8 / 1.9 s < 1
    assert choose_ks(*args, margin=0.0, hurdle=0.0, lags=[0]).ks == [1]
    two = costs_with(lambda t: 1.0 + 0.1 * (t - 1), 0.0, rows=2)  # both 3.6 / 1.5; one 2.8 / 1.1
    two.catch_up = 1 / 180
    assert choose_ks([0.8, 0.8], [1, 1], 1, two, margin=0.0, hurdle=0.0, lags=[40, 0]).ks == [0, 1]
    both = choose_ks([0.8, 0.8], [1, 1], 1, two, margin=0.2, hurdle=0.0, lags=[10, 10])
    assert both.ks == [1, 1]                                    # the margin is not on the shares
    assert max(both.goodput.values()) == pytest.approx(3.6 / (1 + 1.2 * 0.1 + 2 * 0.1))


@pytest.mark.parametrize("hurdle", [-0.1, float("nan")])
def test_a_hurdle_below_zero_or_nan_is_refused(hurdle):
    """A negative hurdle would take plans predicted to lose; NaN would compare False everywhere
    and silently never draft: both are refused where the policy is made."""
    with pytest.raises(ValueError, match="hurdle"):
        GoodputK(4, hurdle=hurdle)
    default = inspect.signature(choose_ks).parameters["hurdle"].default
    assert GoodputK(4).hurdle == default == HURDLE                  # one default, in one place


def test_a_drafter_that_rarely_proposes_is_priced_by_its_proposal_rate():
    """An n-gram table that proposes in one round of ten: in a big batch every round still pays
    the wide verify, so drafting loses; at batch size 1 a round without proposal costs a plain
    step, so drafting still pays."""
    wide = costs_with(lambda t: 1.0 + 0.3 * (t - 1), 0.0, rows=16)
    assert choose_ks([0.9] * 16, [4] * 16, 4, wide).ks == [4] * 16          # if it always proposed
    assert choose_ks([0.9] * 16, [4] * 16, 4, wide, proposal_rates=[0.1] * 16).ks == [0] * 16
    alone = costs_with(lambda t: 1.0 + 0.05 * (t - 1), 0.0, rows=1)
    assert choose_ks([0.9], [4], 4, alone, proposal_rates=[0.1]).ks == [4]


def test_a_choice_keeps_each_k_s_best_plan_only():
    """The record of a step is kept for its engine's life: the K x B plans it weighed (17 KB a
    step at B = 32, k = 4) are not; each K's best is, found by the full search."""
    rng = random.Random(0)
    alphas = [rng.random() for _ in range(32)]
    costs = costs_with(lambda t: 1.0 + 0.02 * (t - 1), 0.001, rows=32)
    choice = choose_ks(alphas, [4] * 32, 4, costs)
    assert len(choice.goodput) == 5 and (0, 0) in choice.goodput
    order = sorted(alphas, reverse=True)     # the plan (K, R): the best R rows draft K tokens
    for K in range(1, 5):
        plans = {(K, R): (sum(expected_tokens(a, K) for a in order[:R]) + 32 - R)
                 / (1.0 + 1.3 * (0.02 * K + K * 0.001)) for R in range(1, 33)}
        best = max(plans, key=plans.get)
        assert choice.goodput[best] == pytest.approx(plans[best])
    chosen = (max(choice.ks), sum(k > 0 for k in choice.ks))
    assert max(choice.goodput, key=choice.goodput.get) == chosen


def test_a_plain_plan_is_reused_until_its_inputs_change_or_a_recheck_is_due(monkeypatch):
    """A plan is a function of the requests' records, their caps and the costs: while no row has
    drafted and none has come or gone, a plain plan stands (the search costs about 1.5 % of a
    step at batch size 16 on the shipped pair) until the re-check is due, which one row makes:
    the one likeliest to accept, with one draft (a draft model then catches one row up, not B)."""
    import minispec.speed.goodput as goodput

    searches = []
    monkeypatch.setattr(goodput, "choose_ks", lambda *a, **kw: searches.append(1)
                        or choose_ks(*a, **kw))
    policy = GoodputK(4)
    policy.costs = costs_with(lambda t: float(t), 0.05, rows=4)      # compute-bound: plain wins
    requests = [("a", 0, 0), ("b", 5, 6), ("c", 0, 0), ("d", 1, 3)]   # b: the best record
    assert policy.choose(requests, [4] * 4) == [0] * 4 and len(searches) == 1
    for _ in range(6):                                                # steps 2..7: no search
        assert policy.choose(list(requests), [4] * 4) == [0] * 4
    assert len(searches) == 1 and len(policy.choices) == 7            # one record per step
    caps = [4, 4, 4, 3]
    assert policy.choose(requests, caps) == [0] * 4 and len(searches) == 2     # a cap moved
    assert policy.choose(requests, caps) == [0, 1, 0, 0]              # step 9: the re-check
    assert len(searches) == 3
    assert policy.choose(requests, caps) == [0] * 4 and len(searches) == 4     # searched again
    assert policy.choose(requests, caps) == [0] * 4 and len(searches) == 4
    requests[1] = ("b", 6, 7)                                         # b accepted its draft
    assert policy.choose(requests, caps) == [0] * 4 and len(searches) == 5


def test_a_plan_kept_plain_by_the_hurdle_alone_is_searched_every_step(monkeypatch):
    """Drafting predicted to gain 3 % (margin included): the hurdle declines it, but the costs
    drift and it may win the next step, so the search runs every step."""
    import minispec.speed.goodput as goodput

    searches = []
    monkeypatch.setattr(goodput, "choose_ks", lambda *a, **kw: searches.append(1)
                        or choose_ks(*a, **kw))
    policy = GoodputK(1)
    policy.costs = costs_with(lambda t: 1.0 + 0.5 * (t - 1), 0.0, rows=16, k_max=1)
    requests = [(str(b), 70, 100) for b in range(16)]     # alpha about 0.7: E = 1.7 / 1.65 steps
    for step in range(1, 6):
        assert policy.choose(requests, [1] * 16) == [0] * 16 and len(searches) == step
    gain = max(policy.choices[-1].goodput.values()) / policy.choices[-1].goodput[0, 0]
    assert 1.0 < gain < 1.0 + policy.hurdle


def test_compute_bound_verify_does_not_draft():
    """Verify cost grows like the tokens it scores (a big batch): drafting can only lose."""
    choice = choose_ks([0.8] * 16, [4] * 16, 4, costs_with(lambda t: float(t), 0.05, rows=16))
    assert choice.ks == [0] * 16
    assert choice.goodput[0, 0] == max(choice.goodput.values())


def test_only_the_requests_that_accept_draft():
    """When drafting pays for some rows only, the rows with the highest acceptance draft and the
    rest decode plainly (k = 0), since each drafting row adds to the draft step's cost."""
    costs = costs_with(lambda t: 1.0 + 0.05 * t, 0.0, rows=4)
    costs.draft = {1: 0.02, 2: 0.04, 4: 0.5}                   # four drafting rows cost a lot
    choice = choose_ks([0.95, 0.05, 0.9, 0.02], [4] * 4, 4, costs)
    assert choice.ks[1] == choice.ks[3] == 0 and choice.ks[0] > 0 and choice.ks[2] > 0


def test_caps_are_respected():
    choice = choose_ks([0.9, 0.9], [1, 0], 4, costs_with(lambda t: 1.0, 0.01, rows=2))
    assert choice.ks == [1, 0]


def test_unknown_costs_give_no_choice():
    assert choose_ks([0.5], [4], 4, StepCosts()) is None


def test_costs_are_kept_per_bucket_and_interpolated():
    assert bucket(3) == 4 and bucket(1) == 1 and bucket(16) == 16 and bucket(17) == 32
    costs = StepCosts(smoothing=0.5)
    costs.record_verify(3, 1, 2.0)                              # bucket 4
    assert costs.verify_seconds(4, 3) is None                   # one width: no line yet
    costs.record_verify(4, 5, 4.0)
    assert costs.verify_seconds(3, 3) == pytest.approx(3.0)     # on the line through T = 1 and 5
    costs.record_verify(4, 1, 3.5)                  # the second measurement replaces the first
    assert costs.verify_seconds(4, 1) == pytest.approx(3.5)
    costs.record_verify(4, 1, 2.5)                              # then a moving average: 3.5 -> 3
    assert costs.verify_seconds(4, 1) == pytest.approx(3.0)
    costs.record_verify(4, 1, 9.0)                              # 3 -> 6, but T = 5 costs 4:
    assert costs.verify_seconds(4, 1) == pytest.approx(4.0)     # never above a wider forward
    costs.record_draft(2, steps=4, seconds=2.0)
    assert (costs.draft_seconds(2) == pytest.approx(0.5)
            and costs.draft_seconds(16) == pytest.approx(0.5))


def test_a_new_bucket_borrows_the_nearest_width_ratio():
    """With only its plain step measured, a bucket prices a wide verify with the ratio of the
    nearest bucket that has two widths (the smaller one on a tie), not a forced full-k step."""
    costs = StepCosts()
    for rows, r in ((2, 1.5), (8, 3.0)):                        # verify(B, 5) / verify(B, 1)
        costs.record_verify(rows, 1, 1.0)
        costs.record_verify(rows, 5, r)
    costs.record_verify(4, 1, 2.0)                              # bucket 4: plain only
    assert costs.verify_seconds(4, 5) == pytest.approx(2.0 * 1.5)    # ties 2 and 8: 2 wins
    costs.record_verify(32, 1, 10.0)
    assert costs.verify_seconds(32, 5) == pytest.approx(10.0 * 3.0)  # 8 is nearest to 32
    assert costs.verify_seconds(32, 3) == pytest.approx(10.0 * 2.0)  # on bucket 8's line
    assert costs.verify_seconds(64, 5) is None                  # nothing measured at 64


def test_fixed_rows_draft_their_cap_whatever_the_plan():
    """A seeded sampled request keeps the fixed k: its tokens must not depend on the batch."""
    policy = GoodputK(4)
    costs = costs_with(lambda t: float(t), 0.05, rows=4)        # compute-bound: plan k = 0
    policy.costs = costs
    ks = policy.choose([(str(b), 0, 0) for b in range(4)], [4, 4, 2, 4],
                       fixed=[False, True, True, False])
    assert ks == [0, 4, 2, 0] and policy.choices[-1].ks == ks


def test_alpha_estimates_shrink_towards_the_pool_with_optimism():
    fresh, seasoned = alpha_estimates([0, 90], [0, 100], pooled=0.5, optimism=0.0)
    assert fresh == 0.5 and seasoned == pytest.approx((90 + 2) / 104)
    bold_fresh, bold_seasoned = alpha_estimates([0, 90], [0, 100], pooled=0.5)
    # the bonus fades with data
    assert bold_fresh - fresh > 0.15 > 0.05 > bold_seasoned - seasoned > 0


def test_a_stale_plain_step_is_not_priced_above_the_line_through_wider_ones():
    """An engine that drafts every step never measures its plain step again: a stale 7.36 ms
    beside 7.38 ms for two tokens a row (measured at batch size 16) made one-draft plans look
    free. The plain step is priced on the line through the wider forwards instead."""
    costs = StepCosts.measured({(16, 1): 7.36, (16, 2): 7.38, (16, 5): 11.45})
    line = 7.38 - (11.45 - 7.38) / 3                            # the line through T = 2 and 5
    assert costs.verify_seconds(16, 1) == pytest.approx(line)
    assert costs.verify_seconds(16, 2) == pytest.approx(7.38)   # one wider width: no line
    fresh = StepCosts.measured({(16, 1): 5.0, (16, 2): 7.38, (16, 5): 11.45})
    assert fresh.verify_seconds(16, 1) == pytest.approx(5.0)    # below the line: as measured


def test_the_optimism_for_a_new_request_shrinks_with_the_batch():
    """One request learns from a draft, but every row pays for the wider verify: the bonus of a
    request with no record is ``1 / B`` standard deviations."""
    costs = costs_with(lambda t: 1.0, 0.01, rows=1)
    for rows in (2, 16):
        for t in range(1, 6):
            costs.record_verify(rows, t, 1.0)
    bonus = {}
    for B in (1, 2, 16):
        policy = GoodputK(4)
        policy.costs = costs
        policy.choose([(str(b), 0, 0) for b in range(B)], [4] * B)
        bonus[B] = policy.choices[-1].alphas[0] - 0.5           # the pooled prior starts at 0.5
    sd = (0.25 / 5) ** 0.5                                      # Beta: 4 prior drafts, none seen
    assert [bonus[B] for B in (1, 2, 16)] == pytest.approx([sd, sd / 2, sd / 16])


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_adaptive_engine_keeps_greedy_tokens_and_records_its_choices(kind):
    torch.manual_seed(0)
    target = tiny_llama(seed=0)
    drafter = tiny_llama(seed=0) if kind == "model" else "ngram"
    prompts = [[1, 2, 3], [5, 6, 5, 6], [9] * 5, list(range(10, 20))]
    plain = [ms.generate(target, p, 16).tokens for p in prompts]
    engine = ms.Engine(target, drafter=drafter, k=3, max_batch_size=4, block_size=4, adaptive=True)
    results = engine.generate(prompts, progress=False, max_new_tokens=16)
    assert [r.tokens for r in results] == plain
    assert engine.k_choices and all(0 <= k <= 3 for c in engine.k_choices for k in c.ks)
    assert engine.k_choices[0].ks == [0] * 4                    # explores: a plain step first ...
    assert any(c.goodput for c in engine.k_choices)             # ... then chooses from measurements
    assert engine.costs.verify and engine.target_cache.num_used_blocks == 0
    drafted = [d for r in results for d in r.stats.drafted_per_round]
    assert max(drafted) <= 3
    planned = [c for c in engine.k_choices if c.goodput]
    assert all(len(c.proposal_rates) == c.batch_size for c in planned)
    assert all(0 < p <= 1 for c in planned for p in c.proposal_rates)
    if kind == "model":                     # a draft model always proposes: its rate stays 1
        assert all(p == 1 for c in planned for p in c.proposal_rates)


def test_goodput_k_is_the_default_with_a_chain_drafter():
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    assert ms.Engine(target, draft=draft, k=3).adaptive                     # k is the upper bound
    assert not ms.Engine(target, draft=draft, k=3, adaptive=False).adaptive  # a fixed k
    assert not ms.Engine(target).adaptive                                   # nothing to choose
    assert not ms.Engine(target, draft=draft, k=2, branching=(2, 1)).adaptive  # trees: fixed depth
    engine = ms.Engine(target, draft=draft, k=3, max_batch_size=4, block_size=4)
    prompts = [[1, 2, 3], [5, 6, 5, 6], [9] * 5, list(range(10, 20))]
    samplings = [ms.SamplingParams(temperature=0.0), ms.SamplingParams(temperature=1.0, seed=7),
                 ms.SamplingParams(temperature=1.0, seed=8), ms.SamplingParams(temperature=0.0)]
    results = engine.generate(prompts, samplings, progress=False, max_new_tokens=12)
    for prompt, sp, result in zip(prompts, samplings, results, strict=True):
        single = ms.speculative_generate(target, draft, prompt, 12, k=3, sampling=sp)
        assert result.tokens == single.tokens
        assert len(result.stats.k_per_round) == result.stats.rounds
        if not sp.greedy:                         # seeded: every round drafts k, as alone
            assert result.stats.k_per_round == single.stats.k_per_round
            assert result.stats.accepted_per_round == single.stats.accepted_per_round


def test_proposal_rates_fall_for_a_drafter_without_matches():
    """An n-gram table on prompts with nothing to copy proposes little: the engine's estimate of
    its proposal rate falls below 1, and it stops pricing those rows as if they drafted."""
    target = tiny_llama(seed=0)
    prompts = [list(range(i, i + 11)) for i in (1, 12, 23, 34)]   # no repeated n-gram to look up
    engine = ms.Engine(target, drafter="ngram", k=3, max_batch_size=4, block_size=4, adaptive=True)
    engine.generate(prompts, progress=False, max_new_tokens=24)
    asked, proposed = engine.policy.proposals
    assert asked > 0 and proposed < asked
    planned = [c for c in engine.k_choices if c.goodput]
    assert min(p for c in planned for p in c.proposal_rates) < 1
