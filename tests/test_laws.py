"""The lessons' law harness (in ``minispec.check.statistics``): exact laws that sum to one, and a
Pearson test that agrees with scipy's and rejects a wrong law."""

import random

import pytest
import torch
from scipy import stats
from tinymodels import tiny_llama

from minispec.check.statistics import chi_square, first_tokens_law, next_token_probs


def test_chi_square_matches_scipy_and_pools_rare_cells():
    law = {"a": 0.5, "b": 0.3, "c": 0.19, "d": 0.01}
    rng = random.Random(0)
    outcomes = rng.choices(list(law), weights=list(law.values()), k=200)
    pvalue, cells, smallest = chi_square(outcomes, law)
    counts = [outcomes.count(x) for x in "abc"] + [outcomes.count("d")]
    expected = [200 * law[x] for x in "abcd"]       # "d" expects 2 (< 5): the pooled cell
    assert cells == 4 and smallest == pytest.approx(2.0)
    assert pvalue == pytest.approx(stats.chisquare(counts, expected).pvalue, rel=1e-6)
    wrong = {"a": 0.3, "b": 0.5, "c": 0.19, "d": 0.01}
    assert chi_square(outcomes, wrong)[0] < 1e-6


def test_first_tokens_law_is_a_law_of_the_models_probabilities():
    model = tiny_llama(max_pos=64)
    prompt = [1, 5, 9, 2]
    p1, first, pairs = first_tokens_law(model, prompt, n=400)
    assert torch.allclose(p1, next_token_probs(model, [prompt])[0])
    assert sum(first.values()) == pytest.approx(1.0)
    likely = [a for a in range(len(p1)) if 400 * p1[a] >= 1]
    assert sum(pairs.values()) == pytest.approx(sum(p1[a].item() for a in likely))
    (a, b), prob = next((key, v) for key, v in pairs.items() if key[1] != "other")
    second = next_token_probs(model, [prompt + [a]])[0]
    assert prob == pytest.approx(p1[a].item() * second[b].item())
