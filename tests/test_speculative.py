"""Speculative sampling and ``ms.verify`` on a chain (Algorithm 1): exactness, acceptance, pitfalls,
bad inputs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lawcheck import (
    autoregressive_law,
    chi_square_pvalue,
    max_law_error,
    random_table_model,
    verify_law,
)

import minispec as ms
from minispec.core.theory import acceptance_rate


def random_pair(seed: int, vocab: int = 8, p_zeros: float = 0.3, q_zeros: float = 0.3):
    g = torch.Generator().manual_seed(seed)

    def dist(zeros):
        logits = torch.randn(vocab, generator=g, dtype=torch.float64)
        mask = torch.rand(vocab, generator=g, dtype=torch.float64) < zeros
        mask[logits.argmax()] = False
        return torch.softmax(logits.masked_fill(mask, float("-inf")), -1)

    return dist(p_zeros), dist(q_zeros)


def chain(drafts, probs=None):
    return ms.Proposal.chain(drafts, probs)


SPECIAL_PAIRS = {
    "disjoint": (torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64),
                 torch.tensor([0.0, 0.0, 0.3, 0.7], dtype=torch.float64)),
    "equal": (torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),) * 2,
    "q_one_hot": (torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
                  torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)),
    "p_one_hot": (torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64),
                  torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)),
}


def first_token_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact law of the first token ``ms.verify`` emits for one draft x ~ q (k = 1).

    Every random path is enumerated: the draft x (probability q(x)), forced acceptance (u = 0,
    probability min(1, p/q)) or forced rejection (u = 1, probability 1 - min(1, p/q)), in which
    case the token is drawn from the verdict's ``final_probs``.
    """
    law = torch.zeros_like(p)
    target = torch.stack([p, p])          # position 2 (the bonus) is irrelevant for the first token
    for x in range(len(q)):
        if q[x] == 0:
            continue
        a = min(1.0, float(p[x] / q[x]))
        if a > 0:
            verdict = ms.verify(chain([x], q[None]), target,
                                uniforms=torch.zeros(1, dtype=p.dtype), greedy=False)
            assert verdict.tokens[0] == x
            law[x] += q[x] * a
        if a < 1:
            verdict = ms.verify(chain([x], q[None]), target,
                                uniforms=torch.ones(1, dtype=p.dtype), greedy=False)
            assert verdict.num_accepted == 0
            law += q[x] * (1 - a) * verdict.final_probs
    return law


@pytest.mark.parametrize("seed", range(20))
def test_exact_law_of_first_token_equals_p_random(seed):
    p, q = random_pair(seed, p_zeros=0.3 * (seed % 3), q_zeros=0.3 * ((seed + 1) % 3))
    assert torch.allclose(first_token_law(p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(SPECIAL_PAIRS))
def test_exact_law_of_first_token_equals_p_special(name):
    p, q = SPECIAL_PAIRS[name]
    assert torch.allclose(first_token_law(p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_joint_law_of_verify_equals_target(k, seed):
    vocab = 4
    p = random_table_model(vocab, seed=100 + seed, zeros=0.25)
    q = random_table_model(vocab, seed=200 + seed, zeros=0.25)
    law = verify_law(p, q, vocab, k)
    assert max_law_error(law, autoregressive_law(p, vocab, k + 1)) < 1e-9
    assert abs(sum(law.values()) - 1) < 1e-9


def test_exact_joint_law_with_one_hot_q():
    """n-gram drafts: deterministic tokens, a chain without ``probs``, still exact."""
    vocab, k = 4, 3
    p = random_table_model(vocab, seed=7, zeros=0.4)
    law = verify_law(p, None, vocab, k,
                     deterministic_draft=lambda prefix: (len(prefix) * 3 + 1) % vocab)
    assert max_law_error(law, autoregressive_law(p, vocab, k + 1)) < 1e-9


def test_monte_carlo_chi_square_verify_one_draft():
    """k = 1 drafts from ``q``: the first token has law ``p`` and the draft is kept at the rate
    ``sum min(p, q)`` (Leviathan Thm 3.5)."""
    p, q = random_pair(3, vocab=10, p_zeros=0.2, q_zeros=0.2)
    p, q = p.float(), q.float()
    n = 20_000
    g = torch.Generator().manual_seed(0)
    target = torch.stack([p, p])
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    verdicts = [ms.verify(chain([x], q[None]), target, g, greedy=False) for x in drafts]
    counts = torch.bincount(torch.tensor([v.tokens[0] for v in verdicts]), minlength=len(p))
    # Never a token the target rules out; a false alarm 1 time in 1000 at this fixed seed.
    assert chi_square_pvalue(counts, p) > 1e-3
    # Acceptance frequency = sum min(p, q): binomial, 5 standard errors.
    beta = float(acceptance_rate(p, q))
    rate = sum(v.num_accepted for v in verdicts) / n
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / n) ** 0.5


def test_monte_carlo_speculative_sample_scalar():
    p, q = random_pair(5, vocab=5, p_zeros=0.0, q_zeros=0.0)
    g = torch.Generator().manual_seed(1)
    n = 4000
    tokens = [ms.speculative_sample(p, q, g)[0] for _ in range(n)]
    counts = torch.bincount(torch.tensor(tokens), minlength=5)
    assert chi_square_pvalue(counts, p) > 1e-3


def test_monte_carlo_verify_chain_first_token_and_acceptance():
    vocab, k, B = 5, 3, 20_000
    g = torch.Generator().manual_seed(2)
    p_table = torch.softmax(torch.randn(vocab, vocab, generator=g), -1)     # p(. | last token)
    q_table = torch.softmax(torch.randn(vocab, vocab, generator=g), -1)
    start = 0
    draft = torch.empty(B, k, dtype=torch.long)
    prev = torch.full((B,), start)
    for i in range(k):
        draft[:, i] = torch.multinomial(q_table[prev], 1, generator=g).squeeze(1)
        prev = draft[:, i]
    context = torch.cat([torch.full((B, 1), start), draft], 1)               # (B, k+1)
    verdicts = [ms.verify(chain(draft[b], q_table[context[b, :k]]), p_table[context[b]], g,
                          greedy=False) for b in range(B)]
    # Every verdict emits >= 1 token; the first has the target's law.
    first = torch.tensor([v.tokens[0] for v in verdicts])
    counts = torch.bincount(first, minlength=vocab)
    assert chi_square_pvalue(counts, p_table[start]) > 1e-3
    # Per-position acceptance for position 1 matches beta = sum min(p, q).
    beta = float(acceptance_rate(p_table[start], q_table[start]))
    rate = sum(v.num_accepted >= 1 for v in verdicts) / B
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / B) ** 0.5
    # One uniform per test, lazily: a rejection ends the walk, k accepts test k drafts.
    assert all(len(v.accept_probs) == min(v.num_accepted + 1, k) for v in verdicts)


class CountingUniforms:
    """An iterable of uniforms that counts how many were taken."""

    def __init__(self, values):
        self.values, self.taken = list(values), 0

    def __iter__(self):
        for u in self.values:
            self.taken += 1
            yield u


@pytest.mark.parametrize("accepted", range(4))
def test_verify_draws_one_uniform_per_test_lazily(accepted):
    """``accepted`` zeros then a one: the walk stops at the first one and takes nothing more."""
    k = 3
    target = torch.full((k + 1, 4), 0.25)
    q = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * k)                 # p/q = 0.25/0.7 < 1 on token 0
    us = CountingUniforms([0.0] * accepted + [1.0] + [0.0] * 5)
    verdict = ms.verify(chain([0] * k, q), target, uniforms=us, greedy=False)
    assert verdict.num_accepted == accepted
    assert us.taken == len(verdict.accept_probs) == min(accepted + 1, k)
    assert verdict.bonus == (accepted == k)


def test_greedy_verify_is_exact_match_plus_argmax():
    target = torch.zeros(4, 6)
    target[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1  # the target's greedy path: 1 2 3 | 4
    argmax = [1, 2, 3, 4]
    for rows in (target, argmax):          # one-hot rows or the argmaxes alone
        assert ms.verify(chain([1, 2, 3]), rows).tokens == [1, 2, 3, 4]
        assert ms.verify(chain([1, 5, 3]), rows).tokens == [1, 2]
        verdict = ms.verify(chain([0, 2, 3]), rows)
        assert (verdict.tokens, verdict.num_accepted, verdict.bonus) == ([1], 0, False)
        verdict = ms.verify(chain([1, 2, 3]), rows)
        assert verdict.bonus and verdict.path == [1, 2, 3] and verdict.accept_probs == []
    assert ms.verify(chain([1, 2, 3]), argmax).final_probs is None
    assert torch.equal(ms.verify(chain([1, 2, 3]), target).final_probs, target[3])


def test_greedy_forced_on_soft_target_uses_argmax():
    target = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    verdict = ms.verify(chain([1]), target, greedy=True)
    assert verdict.tokens == [1, 0]
    assert torch.equal(verdict.final_probs, torch.tensor([1.0, 0.0, 0.0]))
    verdict = ms.verify(chain([2], torch.tensor([[0.0, 0.0, 1.0]])), target, greedy=True)
    assert verdict.tokens == [1]


def test_k_zero_is_plain_sampling():
    target = torch.tensor([[0.0, 1.0, 0.0]])
    verdict = ms.verify(chain(torch.empty(0, dtype=torch.long)), target)
    assert verdict.tokens == [1] and verdict.bonus and verdict.path == []
    assert ms.verify(chain([]), [1]).tokens == [1]
    g = torch.Generator().manual_seed(0)
    soft = torch.tensor([[0.2, 0.0, 0.8]])
    assert {ms.verify(chain([]), soft, g).tokens[0] for _ in range(50)} == {0, 2}


# --- pitfalls from DESIGN.md ---------------------------------------------------------------

def test_strict_less_than_rejects_zero_target_probability_at_u_zero():
    """u = 0 must not accept a token with p(x) = 0 (``u <= p/q`` would)."""
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([0.5, 0.5, 0.0])
    verdict = ms.verify(chain([0], q[None]), torch.stack([p, p]), uniforms=torch.zeros(1),
                        greedy=False)
    assert verdict.num_accepted == 0
    assert verdict.tokens == [1]


def test_accept_boundary_u_equal_ratio_rejects():
    p = torch.tensor([0.25, 0.75])
    q = torch.tensor([0.5, 0.5])
    # p(0)/q(0) = 0.5: u = 0.5 rejects, u just below accepts.
    assert ms.verify(chain([0], q[None]), torch.stack([p, p]), uniforms=torch.tensor([0.5]),
                     greedy=False).num_accepted == 0
    assert ms.verify(chain([0], q[None]), torch.stack([p, p]), uniforms=torch.tensor([0.4999]),
                     greedy=False).num_accepted == 1


def test_residual_when_p_equals_q_is_safe():
    p = torch.tensor([0.2, 0.3, 0.5])
    r = ms.residual(p, p)
    assert torch.isfinite(r).all()
    assert torch.allclose(r.sum(), torch.tensor(1.0))
    # And speculative sampling with p == q always accepts, whatever u < 1.
    g = torch.Generator().manual_seed(0)
    assert all(ms.speculative_sample(p, p, g)[1] for _ in range(2000))
    just_below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    for x in range(3):
        verdict = ms.verify(chain([x], p[None]), torch.stack([p, p]), uniforms=[just_below_one],
                            greedy=False)
        assert verdict.num_accepted == 1


def test_residual_is_normalised_excess():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.1, 0.4, 0.4])
    assert torch.allclose(ms.residual(p, q), torch.tensor([0.4, 0.2, 0.0, 0.0]) / 0.6)


def test_q_zero_guard():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="probability 0"):
        ms.verify(chain([1], q), p, greedy=False)
    # an untested draft with q(x) = 0 (after a rejection) is never looked at
    verdict = ms.verify(chain([0, 1], torch.tensor([[1.0, 0.0], [1.0, 0.0]])),
                        torch.full((3, 2), 0.5), uniforms=[0.9], greedy=False)
    assert verdict.num_accepted == 0


def test_one_hot_q_rejection_removes_the_draft_from_the_residual():
    p = torch.tensor([0.5, 0.3, 0.2])
    verdict = ms.verify(chain([0]), torch.stack([p, p]), uniforms=torch.tensor([0.9]),
                        greedy=False)
    assert verdict.num_accepted == 0
    assert torch.allclose(verdict.final_probs, torch.tensor([0.0, 0.6, 0.4]))


# --- bad inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("p", "q", "match"),
    [
        (torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3, 0.5]), "same V"),
        (torch.tensor([1.2, -0.2]), torch.tensor([0.5, 0.5]), "negative"),
        (torch.tensor([0.5, 0.6]), torch.tensor([0.5, 0.5]), "sum to 1"),
        (torch.tensor([float("nan"), 0.5]), torch.tensor([0.5, 0.5]), "NaN"),
        (torch.tensor([1, 0]), torch.tensor([0.5, 0.5]), "floating"),
        (torch.tensor([0.5, 0.5]), torch.tensor([1, 0]), "floating"),
    ],
)
def test_speculative_sample_bad_inputs(p, q, match):
    with pytest.raises(ValueError, match=match):
        ms.speculative_sample(p, q)


def test_chain_bad_probs():
    with pytest.raises(ValueError, match=r"\[k, V\] with k = 2"):
        chain([0, 1], torch.full((3, 4), 0.25))
    with pytest.raises(ValueError, match=r"\[k, V\]"):
        chain([0, 1], torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="sum to 1"):
        chain([0, 1], torch.full((2, 4), 0.3))
    with pytest.raises(ValueError, match="negative"):
        chain([0], torch.tensor([[1.5, -0.5]]))
    with pytest.raises(ValueError, match="NaN"):
        chain([0], torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="floating"):
        chain([0], torch.tensor([[1, 0]]))


def test_verify_bad_targets():
    target = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match=r"\[N, V\] with N = 4"):
        ms.verify(chain([0, 1, 2]), target)                   # k + 1 rows needed
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        ms.verify(chain([]), torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="lie in"):
        ms.verify(chain([0, 9]), target)
    with pytest.raises(ValueError, match="lie in"):
        ms.verify(chain([0, -1]), target)
    with pytest.raises(ValueError, match="sum to 1"):
        ms.verify(chain([0, 1]), torch.full((3, 4), 0.3))
    with pytest.raises(ValueError, match="NaN"):
        ms.verify(chain([0, 1]), target.clone().index_fill_(1, torch.tensor([2]), float("nan")))
    with pytest.raises(ValueError, match="uniforms"):                   # too few to decide
        ms.verify(chain([0, 1]), target, uniforms=[])
    ms.verify(chain([0, 1]), target, uniforms=torch.zeros(5))        # extra ones are left


def test_verify_bad_argmaxes():
    with pytest.raises(ValueError, match="3 argmax ids for a tree of 2 nodes"):
        ms.verify(chain([0]), [0, 1, 2])
    with pytest.raises(ValueError, match="argmaxes"):
        ms.verify(chain([0]), [0, 1], greedy=False)
    assert ms.verify(chain([0]), [0, 1], greedy=True).tokens == [0, 1]


def test_verify_refuses_q_over_another_vocabulary():
    """``Proposal.chain`` cannot know the target's V: verify compares every draft q with it."""
    target = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match=r"\[V\] = \[4\]"):
        ms.verify(chain([0, 1], torch.full((2, 5), 0.2)), target, uniforms=[0.0, 0.0])


# --- properties ----------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), vocab=st.integers(2, 12),
       p_zeros=st.floats(0, 0.9), q_zeros=st.floats(0, 0.9))
def test_property_exact_law_and_residual(seed, vocab, p_zeros, q_zeros):
    p, q = random_pair(seed, vocab, p_zeros, q_zeros)
    r = ms.residual(p, q)
    assert torch.allclose(r.sum(), torch.tensor(1.0, dtype=r.dtype))
    if not torch.equal(p, q):
        assert (r[q >= p] == 0).all()            # the residual lives where p exceeds q
    assert torch.allclose(first_token_law(p, q), p, atol=1e-6, rtol=0)


def test_verify_on_argmaxes_matches_verify_on_one_hot_rows():
    g = torch.Generator().manual_seed(4)
    for _ in range(50):
        k = int(torch.randint(0, 5, (1,), generator=g))
        argmax = torch.randint(0, 3, (k + 1,), generator=g)
        drafts = torch.randint(0, 3, (k,), generator=g)
        one_hot = torch.zeros(k + 1, 3).scatter_(-1, argmax[:, None], 1.0)
        full = ms.verify(chain(drafts), one_hot)
        fast = ms.verify(chain(drafts), argmax.tolist())
        assert (fast.tokens, fast.path, fast.bonus) == (full.tokens, full.path, full.bonus)
        assert fast.final_probs is None and torch.equal(full.final_probs, one_hot[len(full.path)])
