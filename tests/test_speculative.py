"""Speculative sampling and Algorithm 1's verify: exactness, acceptance, pitfalls, bad inputs."""

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
            verdict = ms.verify([x], q[None], target, uniforms=torch.zeros(1, dtype=p.dtype),
                                greedy=False)
            assert verdict.tokens[0] == x
            law[x] += q[x] * a
        if a < 1:
            verdict = ms.verify([x], q[None], target, uniforms=torch.ones(1, dtype=p.dtype),
                                greedy=False)
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
    """n-gram drafts: deterministic tokens, ``draft_probs=None``, still exact."""
    vocab, k = 4, 3
    p = random_table_model(vocab, seed=7, zeros=0.4)
    law = verify_law(p, None, vocab, k,
                     deterministic_draft=lambda prefix: (len(prefix) * 3 + 1) % vocab)
    assert max_law_error(law, autoregressive_law(p, vocab, k + 1)) < 1e-9


def test_monte_carlo_chi_square_speculative_sample_batch():
    p, q = random_pair(3, vocab=10, p_zeros=0.2, q_zeros=0.2)
    p, q = p.float(), q.float()
    n = 400_000
    tokens, accepted = ms.speculative_sample_batch(p, q, n, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=len(p))
    # Never a token the target rules out; a false alarm 1 time in 1000 at this fixed seed.
    assert chi_square_pvalue(counts, p) > 1e-3
    # Acceptance frequency = sum min(p, q): binomial, 5 standard errors.
    beta = float(acceptance_rate(p, q))
    assert abs(accepted.double().mean().item() - beta) < 5 * (beta * (1 - beta) / n) ** 0.5


def test_monte_carlo_speculative_sample_scalar():
    p, q = random_pair(5, vocab=5, p_zeros=0.0, q_zeros=0.0)
    g = torch.Generator().manual_seed(1)
    n = 4000
    tokens = [ms.speculative_sample(p, q, g)[0] for _ in range(n)]
    counts = torch.bincount(torch.tensor(tokens), minlength=5)
    assert chi_square_pvalue(counts, p) > 1e-3


def test_monte_carlo_verify_batch_first_two_tokens():
    vocab, k, B = 5, 3, 200_000
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
    verdicts = ms.verify_batch(draft, q_table[context[:, :k]], p_table[context], g, greedy=False)
    # Every verdict emits >= 1 token; rows with >= 2 tokens give the second token's law too.
    first = torch.tensor([v.tokens[0] for v in verdicts])
    counts = torch.bincount(first, minlength=vocab)
    assert chi_square_pvalue(counts, p_table[start]) > 1e-3
    # Per-position acceptance for position 1 matches beta = sum min(p, q).
    beta = float(acceptance_rate(p_table[start], q_table[start]))
    rate = sum(v.num_accepted >= 1 for v in verdicts) / B
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / B) ** 0.5


def test_verify_batch_rows_match_single_verify_with_own_generators():
    vocab, k, B = 7, 4, 6
    g = torch.Generator().manual_seed(3)
    target = torch.softmax(torch.randn(B, k + 1, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(B, k, vocab, generator=g), -1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(B, k)
    greedy = [b % 2 == 0 for b in range(B)]
    batch = ms.verify_batch(draft, q, target, [torch.Generator().manual_seed(b) for b in range(B)],
                            greedy=greedy)
    for b in range(B):
        single = ms.verify(draft[b], q[b], target[b], torch.Generator().manual_seed(b),
                           greedy=greedy[b])
        assert single.tokens == batch[b].tokens
        assert single.num_accepted == batch[b].num_accepted


def test_greedy_verify_is_exact_match_plus_argmax():
    target = torch.zeros(4, 6)
    target[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1  # the target's greedy path: 1 2 3 | 4
    assert ms.verify([1, 2, 3], None, target).tokens == [1, 2, 3, 4]
    assert ms.verify([1, 5, 3], None, target).tokens == [1, 2]
    verdict = ms.verify([0, 2, 3], None, target)
    assert (verdict.tokens, verdict.num_accepted, verdict.bonus) == ([1], 0, False)
    assert ms.verify([1, 2, 3], None, target).bonus


def test_greedy_forced_on_soft_target_uses_argmax():
    target = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    verdict = ms.verify([1], None, target, greedy=True)
    assert verdict.tokens == [1, 0]
    verdict = ms.verify([2], torch.tensor([[0.0, 0.0, 1.0]]), target, greedy=True)
    assert verdict.tokens == [1]


def test_k_zero_is_plain_sampling():
    target = torch.tensor([[0.0, 1.0, 0.0]])
    verdict = ms.verify(torch.empty(0, dtype=torch.long), None, target)
    assert verdict.tokens == [1] and verdict.bonus


# --- pitfalls from DESIGN.md ---------------------------------------------------------------

def test_strict_less_than_rejects_zero_target_probability_at_u_zero():
    """u = 0 must not accept a token with p(x) = 0 (``u <= p/q`` would)."""
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([0.5, 0.5, 0.0])
    verdict = ms.verify([0], q[None], torch.stack([p, p]), uniforms=torch.zeros(1), greedy=False)
    assert verdict.num_accepted == 0
    assert verdict.tokens == [1]


def test_accept_boundary_u_equal_ratio_rejects():
    p = torch.tensor([0.25, 0.75])
    q = torch.tensor([0.5, 0.5])
    # p(0)/q(0) = 0.5: u = 0.5 rejects, u just below accepts.
    assert ms.verify([0], q[None], torch.stack([p, p]), uniforms=torch.tensor([0.5]),
                     greedy=False).num_accepted == 0
    assert ms.verify([0], q[None], torch.stack([p, p]), uniforms=torch.tensor([0.4999]),
                     greedy=False).num_accepted == 1


def test_residual_when_p_equals_q_is_safe():
    p = torch.tensor([0.2, 0.3, 0.5])
    r = ms.residual(p, p)
    assert torch.isfinite(r).all()
    assert torch.allclose(r.sum(), torch.tensor(1.0))
    # And speculative sampling with p == q always accepts.
    _, accepted = ms.speculative_sample_batch(p, p, 10_000, torch.Generator().manual_seed(0))
    assert accepted.all()


def test_residual_is_normalised_excess():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.1, 0.4, 0.4])
    assert torch.allclose(ms.residual(p, q), torch.tensor([0.4, 0.2, 0.0, 0.0]) / 0.6)


def test_q_zero_guard():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="q\\(x\\) = 0"):
        ms.verify([1], q, p, greedy=False)


def test_one_hot_q_rejection_removes_the_draft_from_the_residual():
    p = torch.tensor([0.5, 0.3, 0.2])
    verdict = ms.verify([0], None, torch.stack([p, p]), uniforms=torch.tensor([0.9]), greedy=False)
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
    ],
)
def test_speculative_sample_bad_inputs(p, q, match):
    with pytest.raises(ValueError, match=match):
        ms.speculative_sample(p, q)


def test_verify_bad_shapes():
    target = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="k\\+1"):
        ms.verify([0, 1, 2], None, target)
    with pytest.raises(ValueError, match="draft_probs"):
        ms.verify([0, 1], torch.full((2, 5), 0.2), target)
    with pytest.raises(ValueError, match="lie in"):
        ms.verify([0, 9], None, target)
    with pytest.raises(ValueError, match="uniforms"):
        ms.verify([0, 1], None, target, uniforms=torch.zeros(3))


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


def test_verify_greedy_matches_verify_on_one_hot_rows():
    g = torch.Generator().manual_seed(4)
    for _ in range(50):
        k = int(torch.randint(0, 5, (1,), generator=g))
        argmax = torch.randint(0, 3, (k + 1,), generator=g)
        drafts = torch.randint(0, 3, (k,), generator=g)
        one_hot = torch.zeros(k + 1, 3).scatter_(-1, argmax[:, None], 1.0)
        full = ms.verify(drafts, None, one_hot)
        fast = ms.core.speculative.verify_greedy(drafts.tolist(), argmax.tolist())
        assert (fast.tokens, fast.num_accepted) == (full.tokens, full.num_accepted)
