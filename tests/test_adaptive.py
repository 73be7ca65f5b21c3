"""Goodput ``k`` in the single-sequence loop (``speculative_generate(..., adaptive=True)``): the
engine's policy on a batch of one. Greedy output stays the target's; ``k`` falls to 0 for a drafter
that is always wrong and rises to the cap for one that is always right and free; a seeded sampled
request keeps its fixed ``k``, so its tokens do not depend on the clock."""

import copy
import time

import pytest
import torch
from tinymodels import VOCAB, tiny_llama

import minispec as ms
from minispec.drafters.ngram import ContextDrafter
from minispec.speed.goodput import GoodputK


@pytest.fixture(scope="module")
def target():
    return tiny_llama(max_pos=200)


class OracleDrafter(ContextDrafter):
    """Proposes the next tokens of a known continuation (``right``: the target's greedy one, always
    accepted; else shifted ids, always rejected); a list lookup, so drafting costs ~nothing."""

    def __init__(self, prompt, continuation, right: bool):
        self.text = list(prompt) + list(continuation)
        self.right = right
        super().__init__()

    def lookup(self, context, k):
        ahead = self.text[len(context):len(context) + k]
        return ahead if self.right else [(t + 1) % VOCAB for t in ahead]


def test_greedy_output_is_the_targets_and_k_stays_in_range(target):
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    prompt = [1, 5, 9, 2, 7]
    plain = ms.generate(target, prompt, 60)
    out = ms.speculative_generate(target, draft, prompt, 60, k=6, adaptive=True)
    assert out.tokens == plain.tokens
    assert len(out.stats.k_per_round) == out.stats.rounds
    assert all(0 <= k <= 6 for k in out.stats.k_per_round)


@pytest.mark.parametrize("right", [True, False])
def test_k_follows_the_acceptance_and_the_cost(target, right, monkeypatch):
    """The plan follows acceptance at a fixed cost: the runner's clock is a fake one on which a
    target forward takes 1 ms plus 1 % per token (a near-flat verify, drafting free), so the
    costs the policy learns, and the choices, do not depend on this machine's load."""
    prompt, n = [3, 1, 4, 1, 5], 120
    plain = ms.generate(target, prompt, n)
    clock, forward = FakeClock(), target.forward
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(target, "forward", lambda ids, *a, **kw: (
        clock.advance(1e-3 * (1 + 0.01 * ids.shape[1])), forward(ids, *a, **kw))[1])
    drafter = OracleDrafter(prompt, plain.tokens, right)
    out = ms.speculative_generate(target, drafter, prompt, n, k=6, adaptive=True)
    assert out.tokens == plain.tokens
    late = out.stats.k_per_round[len(out.stats.k_per_round) // 2:]
    # the result keeps each round's choice and its inputs: one KChoice per round, B = 1
    assert [c.ks for c in out.k_choices] == [[k] for k in out.stats.k_per_round]
    planned = [c for c in out.k_choices[len(out.k_choices) // 2:] if c.goodput]
    assert planned and all(c.batch_size == 1 for c in planned)
    if right:        # every draft accepted, drafting free: the plan drafts the most it may
        assert out.stats.acceptance_rate == 1.0
        assert sum(k == 6 for k in late) >= 0.8 * len(late), out.stats.k_per_round
        assert all(c.alphas[0] > 0.9 for c in planned)
    else:            # every draft rejected: plain steps, but for the scheduled re-checks
        assert out.stats.acceptance_rate == 0.0
        assert sum(k == 0 for k in late) >= 0.8 * len(late), out.stats.k_per_round
        # (a one-draft plan still predicts a few per cent here, as alpha > 0 and the verify is
        # nearly flat: below the policy's hurdle, so it is not taken)
        assert all(c.alphas[0] < 0.3 and c.ks == [0] for c in planned), planned


def test_a_seeded_sampled_request_keeps_its_k(target):
    draft = tiny_llama(seed=1, max_pos=200)
    sampling = ms.SamplingParams(temperature=1.0, seed=0)
    fixed = ms.speculative_generate(target, draft, [1, 2, 3], 40, k=4, sampling=sampling)
    chosen = ms.speculative_generate(target, draft, [1, 2, 3], 40, k=4, sampling=sampling,
                                     adaptive=True)
    assert chosen.tokens == fixed.tokens
    assert chosen.stats.k_per_round == fixed.stats.k_per_round


def test_without_a_drafter_every_round_is_recorded_plain(target):
    """No drafter means plain decoding whatever ``k`` says: every round records ``k = 0``, as the
    engine does (once, the loop recorded the ``k`` it was given, shrinking near the budget)."""
    out = ms.speculative_generate(target, None, [1, 2, 3], 8, k=4)
    assert out.tokens == ms.generate(target, [1, 2, 3], 8).tokens
    assert out.stats.k_per_round == [0] * 8 and out.stats.k == 0


def test_k_means_k_in_the_loop_and_the_policy_is_asked_for(target):
    """``speculative_generate(k=4)`` drafts exactly 4 a round; ``adaptive=True`` lets the
    engine's policy choose (``k`` the upper bound), as the ``Engine`` does by default."""
    prompt, n = [3, 1, 4, 1, 5], 80
    plain = ms.generate(target, prompt, n)
    wrong = OracleDrafter(prompt, plain.tokens, right=False)
    default = ms.speculative_generate(target, wrong, prompt, n, k=4, adaptive=True)
    fixed = ms.speculative_generate(target, wrong, prompt, n, k=4)
    assert default.tokens == fixed.tokens == plain.tokens
    assert set(fixed.stats.k_per_round[:-4]) == {4}             # shrunk only near the budget
    assert 0 in default.stats.k_per_round                 # drafts that never pay: plain steps
    assert sum(default.stats.drafted_per_round) < sum(fixed.stats.drafted_per_round) / 2
    assert len(default.k_choices) == default.stats.rounds and fixed.k_choices == []


def test_the_loop_and_the_engine_use_one_policy():
    """Both drivers take their policy from one function (a ``GoodputK`` by default for chains,
    installed from above; ``FixedK`` otherwise); no second policy exists."""
    import minispec.decoding as decoding
    from minispec.decoding import loop, runner
    from minispec.serving import engine
    from minispec.speed import defaults, goodput
    assert loop.collaborators is runner.collaborators is engine.collaborators
    assert runner.DEFAULTS.speed is defaults.collaborators
    assert isinstance(defaults.policy_for(None, 4, chains=True), goodput.GoodputK)
    for fixed in (defaults.policy_for(None, 4, chains=False), defaults.policy_for(False, 4, True),
                  defaults.policy_for(None, 0, chains=True)):            # trees, off, no drafter
        assert type(fixed) is runner.FixedK
    assert not hasattr(ms, "AdaptiveK") and not hasattr(decoding, "adaptive")


class FakeClock:
    """``time.perf_counter`` for a test: a microsecond per reading, plus what ``advance`` adds, so
    the durations the runner measures are exact and no load on the machine can change them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1e-6
        return self.now

    def advance(self, seconds):
        self.now += seconds


class SlowCatchUp(ms.ModelDrafter):
    """A draft model whose catch-up forward (a lagging cache fed several tokens a row) takes
    50 ms more on ``clock``; its draft steps (one or two tokens a row) take no time there."""

    def __init__(self, model, max_seq_len=None, clock=None):
        super().__init__(model, max_seq_len)
        self.clock = clock

    def _forward(self, seqs, feeds):
        if max(map(len, feeds)) > 4:
            self.clock.advance(0.05)
        return super()._forward(seqs, feeds)

    def clone(self):
        return SlowCatchUp(self.model, self.max_seq_len, self.clock)


class PlainThenFull(GoodputK):
    """Plain rounds for the first 10 steps, then every row drafts its cap; keeps what it learns."""

    def __init__(self, k_max):
        super().__init__(k_max)
        self.draft_seconds, self.lags, self.shares = [], [], []

    def choose(self, requests, caps, fixed=None, lags=None):
        self.steps += 1
        self.shares.append(lags)
        return [0] * len(caps) if self.steps <= 10 else caps

    def learn(self, request_ids, ks, drafted, accepted, draft_s, verify_s, lags):
        if any(ks):
            self.draft_seconds.append(draft_s)
            self.lags.append(sum(lags))
        super().learn(request_ids, ks, drafted, accepted, draft_s, verify_s, lags)


def test_a_catch_up_prefill_is_not_priced_as_a_draft_step(target, monkeypatch):
    """After plain rounds a draft model's cache lags the context by every token since; feeding it
    is a cost of having stopped, paid once, not a cost of each draft step: the policy keeps each
    request's lag itself (the runner's round has no clock and the drafter no timer), times the
    round from outside, prices what the catching-up round's draft phase took beyond its draft
    steps per token of lag (``StepCosts.catch_up``), and charges that to the step that catches a
    row up.

    The policy and the runner's phases read ``time.perf_counter``; here it is a fake clock on which
    only the catch-up takes time, so the test measures the accounting, not this machine's speed."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    engine = ms.Engine(target, drafter=SlowCatchUp(copy.deepcopy(target), clock=clock), k=2,
                       max_batch_size=2)
    engine.policy = PlainThenFull(2)
    prompts = [[1, 5, 9, 2, 7], [3, 1, 4]]
    results = engine.generate(prompts, progress=False, max_new_tokens=24)
    assert [r.tokens for r in results] == [ms.generate(target, p, 24).tokens for p in prompts]
    assert not hasattr(engine.drafter, "catch_up_seconds")         # no timer in the drafter
    first = engine.policy.draft_seconds[0]                         # the round that caught up
    assert first >= 0.05, engine.policy.draft_seconds              # ... fed the lag in 50 ms
    assert max(engine.policy.draft_seconds[1:]) < 0.001            # the draft steps cost nothing
    assert engine.costs.draft_seconds(2) < 0.001                   # ... and are priced so
    # ... the catch-up priced per token of lag instead: 10 plain rounds after prompts of 5 and 3
    # tokens leave caches 15 and 13 tokens behind, fed all but the last token each, 26 in one
    # 50 ms forward
    assert engine.policy.lags[0] == 26
    # the policy plans with each row's lag per token it may still generate: 14 of 24 left
    assert engine.policy.shares[10] == [14 / 14, 12 / 14]
    assert engine.costs.catch_up == pytest.approx(0.05 / 26, rel=0.01)
