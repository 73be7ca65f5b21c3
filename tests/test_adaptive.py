"""Adaptive gamma: greedy parity stays exact, k follows the acceptance of a controlled drafter."""

import copy

import pytest
import torch
from tinymodels import VOCAB, tiny_llama

import minispec as ms
from minispec.decoding.adaptive import AdaptiveK, KPolicy
from minispec.drafters.base import Draft, ModelDrafter


@pytest.fixture(scope="module")
def target():
    return tiny_llama(max_pos=160)


class ControlledDrafter:
    """Proposes the target's own greedy tokens (always accepted) or shifted ones (always
    rejected)."""

    def __init__(self, target, right: bool):
        self.inner = ModelDrafter(target)
        self.right = right
        self.forwards = 0

    def propose(self, context, k, sampling, generator):
        draft = self.inner.propose(context, k, sampling, generator)
        tokens = draft.tokens if self.right else (draft.tokens + 1) % VOCAB
        return Draft(tokens, None)


def test_policy_protocol():
    assert isinstance(AdaptiveK(c=0.1), KPolicy)


def test_alpha_hat_is_the_beta_posterior_mean():
    policy = AdaptiveK(c=0.1, prior=(2.0, 3.0))
    assert policy.alpha_hat == pytest.approx(2 / 5)
    policy.update(drafted=4, accepted=2)      # 2 successes, 1 failure, the 4th draft untested
    assert policy.alpha_hat == pytest.approx((2 + 2) / (2 + 3 + 3))
    policy.update(drafted=3, accepted=3)      # all accepted: no failure
    assert policy.alpha_hat == pytest.approx((2 + 5) / (2 + 3 + 6))
    policy.reset()
    assert policy.alpha_hat == pytest.approx(2 / 5) and policy.history == []


def test_k_is_optimal_gamma_of_the_estimate():
    r = {g: 1 + 0.15 * g for g in range(1, 9)}
    policy = AdaptiveK(c=0.2, r=r, k_max=8)
    for _ in range(30):
        policy.update(drafted=4, accepted=3)
        expected = ms.theory.optimal_gamma(round(policy.alpha_hat, 3), 0.2, lambda g: r[g],
                                           max_gamma=8)
        assert policy.next_k() == expected


def test_k_moves_up_with_high_and_down_with_low_acceptance():
    up, down = AdaptiveK(c=0.05, k_max=8), AdaptiveK(c=0.05, k_max=8)
    first = up.next_k()
    assert down.next_k() == first             # same prior, same first choice
    for _ in range(20):
        up.update(drafted=up.next_k(), accepted=up.history[-1])
        down.update(drafted=down.next_k(), accepted=0)
    assert up.next_k() == 8 > first > down.next_k() == 1


def test_decay_forgets_old_rounds():
    policy = AdaptiveK(c=0.05, k_max=8, decay=0.5)
    for _ in range(20):
        policy.update(drafted=8, accepted=8)
    assert policy.next_k() == 8
    for _ in range(6):
        policy.update(drafted=8, accepted=0)
    assert policy.alpha_hat < 0.3 and policy.next_k() <= 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        AdaptiveK(c=-1)
    with pytest.raises(ValueError):
        AdaptiveK(c=0.1, k_min=3, k_max=2)
    with pytest.raises(ValueError):
        AdaptiveK(c=0.1, decay=0)
    with pytest.raises(ValueError):
        AdaptiveK(c=0.1).update(drafted=2, accepted=3)


def test_greedy_parity_with_adaptive_k(target):
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    prompt = [1, 5, 9, 2, 7]
    plain = ms.generate(target, prompt, 60)
    policy = AdaptiveK(c=0.3, r=1.2, k_max=6)
    out = ms.speculative_generate(target, draft, prompt, 60, k=policy)
    assert out.tokens == plain.tokens
    assert out.stats.k == 6 and len(policy.history) == out.stats.rounds
    assert max(out.stats.drafted_per_round) <= 6


@pytest.mark.parametrize("right", [True, False])
def test_k_adapts_in_a_real_loop(target, right):
    prompt = [3, 1, 4, 1, 5]
    policy = AdaptiveK(c=0.05, r=1.0, k_max=8)
    out = ms.speculative_generate(target, ControlledDrafter(target, right), prompt, 80, k=policy)
    assert out.tokens == ms.generate(target, prompt, 80).tokens
    if right:
        assert out.stats.acceptance_rate == 1.0
        assert policy.history[-1] == 8 and policy.history[-1] > policy.history[0]
    else:
        assert out.stats.acceptance_rate == 0.0
        assert policy.history[-1] == 1 and policy.history[-1] < policy.history[0]


def test_policy_is_reset_per_request(target):
    policy = AdaptiveK(c=0.05, k_max=8)
    ms.speculative_generate(target, ControlledDrafter(target, False), [1, 2, 3], 30, k=policy)
    assert policy.history[-1] == 1
    ms.speculative_generate(target, ControlledDrafter(target, True), [1, 2, 3], 30, k=policy)
    assert policy.history[0] == AdaptiveK(c=0.05, k_max=8).next_k()


def test_sampled_run_with_adaptive_k_is_valid(target):
    draft = tiny_llama(seed=1, max_pos=160)
    sampling = ms.SamplingParams(temperature=1.0, seed=0)
    out = ms.speculative_generate(target, draft, [1, 2, 3], 40, k=AdaptiveK(c=0.3, k_max=4),
                                  sampling=sampling)
    assert len(out.tokens) == 40 and all(0 <= t < VOCAB for t in out.tokens)


def test_policy_needs_a_drafter(target):
    with pytest.raises(ValueError, match="drafter"):
        ms.speculative_generate(target, None, [1, 2], 5, k=AdaptiveK(c=0.1))
