"""Standardized sampling (Leviathan §2.2): SamplingParams validation and probs_from_logits."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minispec as ms


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("seed", 1.5),
        ("seed", "0"),
    ],
)
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ms.SamplingParams(**{field: value})


def test_sampling_params_is_frozen():
    params = ms.SamplingParams()
    with pytest.raises(AttributeError):
        params.temperature = 0.5  # type: ignore[misc]


def test_temperature_zero_is_one_hot_argmax_without_division():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [-1.0, -5.0, -0.5, -2.0]])
    probs = ms.probs_from_logits(logits, ms.SamplingParams(temperature=0))
    # First index on ties, exactly one-hot, no NaN (a division by T = 0 would give inf/NaN).
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]))


def test_temperature_one_is_softmax():
    logits = torch.randn(3, 17, generator=torch.Generator().manual_seed(0))
    probs = ms.probs_from_logits(logits, ms.SamplingParams(temperature=1.0))
    assert torch.allclose(probs, torch.softmax(logits, -1), atol=1e-7)


def test_temperature_scales_logits():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(1))
    probs = ms.probs_from_logits(logits, ms.SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, -1), atol=1e-7)


def test_top_k_keeps_exactly_k_distinct_logits():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    probs = ms.probs_from_logits(logits, ms.SamplingParams(top_k=5))
    assert torch.equal((probs > 0).sum(-1), torch.full((4,), 5))
    top5 = logits.topk(5, dim=-1).indices
    assert torch.equal(probs.gather(-1, top5) > 0, torch.ones(4, 5, dtype=torch.bool))


def test_top_p_keeps_smallest_prefix_reaching_mass():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    kept = ms.probs_from_logits(logits, ms.SamplingParams(top_p=0.7)) > 0
    # 0.5 < 0.7, 0.5 + 0.25 >= 0.7: two tokens.
    assert kept.tolist() == [True, True, False, False]
    kept = ms.probs_from_logits(logits, ms.SamplingParams(top_p=0.75)) > 0
    assert kept.tolist() == [True, True, False, False]
    kept = ms.probs_from_logits(logits, ms.SamplingParams(top_p=0.76)) > 0
    assert kept.tolist() == [True, True, True, False]
    # The most likely token survives any top_p.
    kept = ms.probs_from_logits(logits, ms.SamplingParams(top_p=1e-6)) > 0
    assert kept.tolist() == [True, False, False, False]


def test_repetition_penalty_ctrl_rule():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    params = ms.SamplingParams(temperature=1.0, repetition_penalty=2.0)
    probs = ms.probs_from_logits(logits, params, context_ids=[0, 1])
    expected = torch.softmax(torch.tensor([1.0, -4.0, 1.0, 0.5]), -1)
    assert torch.allclose(probs, expected, atol=1e-7)


def test_repetition_penalty_per_row_context():
    logits = torch.zeros(2, 3) + torch.tensor([1.0, 1.0, 1.0])
    params = ms.SamplingParams(repetition_penalty=2.0)
    probs = ms.probs_from_logits(logits, params, context_ids=[[0], [0, 2]])
    assert probs[0, 0] < probs[0, 1] == probs[0, 2]
    assert probs[1, 0] == probs[1, 2] < probs[1, 1]
    with pytest.raises(ValueError, match="rows"):
        ms.probs_from_logits(logits, params, context_ids=[[0]])


def test_nan_logits_rejected():
    with pytest.raises(ValueError, match="NaN"):
        ms.probs_from_logits(torch.tensor([0.0, float("nan")]), ms.SamplingParams())


def test_all_masked_row_rejected():
    with pytest.raises(ValueError, match="-inf"):
        ms.probs_from_logits(torch.full((3,), float("-inf")), ms.SamplingParams())


def test_bf16_logits_give_float32_probs():
    logits = torch.randn(2, 9).to(torch.bfloat16)
    probs = ms.probs_from_logits(logits, ms.SamplingParams(temperature=0.7))
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_sample_shapes_and_one_hot():
    g = torch.Generator().manual_seed(0)
    one_hot = torch.zeros(3, 4, 5)
    one_hot[..., 2] = 1
    tokens = ms.sample(one_hot, g)
    assert tokens.shape == (3, 4)
    assert torch.equal(tokens, torch.full((3, 4), 2))
    assert ms.sample(torch.tensor([0.0, 1.0]), g).shape == ()


def test_generator_from_seed_is_reproducible():
    params = ms.SamplingParams(seed=123)
    a = torch.rand(5, generator=params.make_generator())
    b = torch.rand(5, generator=params.make_generator())
    assert torch.equal(a, b)


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.floats(0.05, 5.0),
    top_k=st.integers(0, 12),
    top_p=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_probs_are_distributions_on_a_subset_of_the_support(temperature, top_k, top_p, seed):
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(seed)) * 3
    params = ms.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = ms.probs_from_logits(logits, params)
    assert torch.allclose(probs.sum(-1), torch.ones(3), atol=1e-5)
    assert (probs >= 0).all()
    # The argmax always survives the filters.
    assert (probs.gather(-1, logits.argmax(-1, keepdim=True)) > 0).all()
    if top_k:
        assert ((probs > 0).sum(-1) <= top_k).all()  # random logits have no ties
