"""Closed forms of Leviathan et al. §3, checked against the paper's numbers and against
simulation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minispec as ms
from minispec.core import theory

# Leviathan et al., Table 1 (c = c_hat = 0): alpha, gamma, operations, speed.
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize(("alpha", "gamma", "ops", "speed"), TABLE_1)
def test_table_1(alpha, gamma, ops, speed):
    assert round(theory.walltime_speedup(alpha, gamma, c=0.0), 2) == speed
    assert round(theory.ops_factor(alpha, gamma, c_hat=0.0), 2) == ops


def test_expected_tokens_closed_form_and_edges():
    for alpha in [0.0, 0.3, 0.8, 0.99]:
        for gamma in range(0, 9):
            closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
            assert theory.expected_tokens(alpha, gamma) == pytest.approx(closed, rel=1e-12)
            assert theory.expected_accepted(alpha, gamma) == pytest.approx(closed - 1, rel=1e-12,
                                                                           abs=1e-12)
    assert theory.expected_tokens(1.0, 4) == 5
    assert theory.expected_tokens(0.0, 4) == 1
    # Stratos §1.1.1: beta = 0.8, T = 10 gives more than 4 tokens per step.
    assert theory.expected_tokens(0.8, 10) > 4


def test_expected_tokens_matches_simulated_iid_rounds():
    """Eq. (1) is the mean of a capped geometric variable: simulate it."""
    alpha, gamma, n = 0.7, 4, 200_000
    g = torch.Generator().manual_seed(0)
    accepts = torch.rand(n, gamma, generator=g) < alpha
    tokens = accepts.long().cumprod(-1).sum(-1) + 1
    expected = theory.expected_tokens(alpha, gamma)
    stderr = tokens.double().std().item() / n**0.5
    assert abs(tokens.double().mean().item() - expected) < 5 * stderr


def test_blog_worked_example():
    """50 ms target, 5 ms draft, K = 5, 3 accepted + 1 -> 4 tokens per 75 ms: 2.67x."""
    target_ms, draft_ms, K, tokens = 50.0, 5.0, 5, 4
    speedup = tokens / ((K * draft_ms + target_ms) / target_ms)
    # The same number from the cost model with r = 1: tokens / (gamma c + 1).
    assert speedup == pytest.approx(tokens / (K * (draft_ms / target_ms) + 1))
    assert round(speedup, 2) == 2.67


def test_corollary_3_9():
    for alpha, c in [(0.5, 0.1), (0.8, 0.3), (0.3, 0.29)]:
        bound = theory.min_speedup_gamma1(alpha, c)
        assert bound == pytest.approx((1 + alpha) / (1 + c))
        assert bound > 1
    with pytest.raises(ValueError, match="alpha > c"):
        theory.min_speedup_gamma1(0.2, 0.3)


def test_verify_cost_r():
    base = theory.walltime_speedup(0.7, 4, 0.25)
    assert theory.walltime_speedup(0.7, 4, 0.25, r=1.65) < base
    assert theory.walltime_speedup(0.7, 4, 0.25, r=lambda g: 1.0) == base
    with pytest.raises(ValueError, match="r must be"):
        theory.walltime_speedup(0.7, 4, 0.25, r=0)


def test_optimal_gamma_is_argmax_and_monotone_in_alpha():
    previous = 1
    for alpha in [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]:
        best = theory.optimal_gamma(alpha, c=0.05)
        values = [theory.walltime_speedup(alpha, g, 0.05) for g in range(1, 65)]
        assert theory.walltime_speedup(alpha, best, 0.05) == max(values)
        assert best >= previous                  # Figure 3: better drafts deserve longer drafts
        previous = best
    # A higher draft cost never asks for a longer draft.
    assert theory.optimal_gamma(0.8, 0.3) <= theory.optimal_gamma(0.8, 0.01)


def test_lk_divergence_lemma_and_corollary():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(100, 9, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(100, 9, generator=g, dtype=torch.float64) * 2, -1)
    d = theory.lk_divergence(p, q)
    assert torch.allclose(d, 1 - theory.acceptance_rate(p, q), atol=1e-12)      # Lemma 3.3
    assert torch.allclose(d, theory.lk_divergence(q, p))                        # symmetric
    assert ((d >= 0) & (d <= 1)).all()
    assert torch.allclose(theory.lk_divergence(p, p), torch.zeros(100, dtype=torch.float64))
    disjoint_p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    disjoint_q = torch.tensor([0.0, 0.0, 0.2, 0.8])
    assert theory.lk_divergence(disjoint_p, disjoint_q) == pytest.approx(1.0)


def test_ops_factor_counts_work():
    """Thm 3.11 against counted work: simulate rounds and count target tokens + draft steps."""
    alpha, gamma, c_hat, n = 0.75, 3, 0.1, 100_000
    g = torch.Generator().manual_seed(1)
    tokens = (torch.rand(n, gamma, generator=g) < alpha).long().cumprod(-1).sum(-1) + 1
    work_per_token = n * (gamma * c_hat + gamma + 1) / tokens.sum().item()
    assert work_per_token == pytest.approx(theory.ops_factor(alpha, gamma, c_hat), rel=0.01)


@pytest.mark.parametrize(("fn", "args", "match"), [
    (theory.expected_tokens, (1.5, 3), "alpha"),
    (theory.expected_tokens, (0.5, -1), "gamma"),
    (theory.expected_tokens, (0.5, 2.5), "gamma"),
    (theory.walltime_speedup, (0.5, 2, -0.1), "c must"),
    (theory.ops_factor, (0.5, 2, -1.0), "c_hat"),
    (theory.optimal_gamma, (0.5, 0.1, 1.0, 0), "max_gamma"),
])
def test_bad_inputs(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)


@settings(max_examples=100, deadline=None)
@given(alpha=st.floats(0, 1), gamma=st.integers(0, 30), c=st.floats(0, 2))
def test_property_speedup_bounds(alpha, gamma, c):
    tokens = theory.expected_tokens(alpha, gamma)
    assert 1 <= tokens <= gamma + 1 + 1e-9
    assert theory.walltime_speedup(alpha, gamma, c) <= tokens + 1e-12
    assert theory.ops_factor(alpha, gamma, 0.0) >= 1 - 1e-9       # never fewer operations


def test_public_api_names():
    for name in ["expected_tokens", "walltime_speedup", "optimal_gamma", "lk_divergence",
                 "acceptance_rate"]:
        assert callable(getattr(ms.theory, name))
