"""``minispec.tools.lockstep``: engines in lockstep give paired ratios with their spread, and a
gain is claimed only outside it."""

from __future__ import annotations

import itertools

import pytest
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
from minispec.tools.lockstep import Paired, interleave, race, ratios

PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


def paired(ratios, tokens_per_forward=2.0):
    return Paired("m", sorted(ratios), [100.0], tokens_per_forward, None, True)


def test_verdicts_follow_the_spread():
    assert paired([1.05, 1.2, 1.3]).verdict == "faster"
    assert paired([0.95, 1.2, 1.3]).verdict == "within noise"
    assert paired([0.7, 0.8, 0.99]).verdict == "slower"
    assert paired([0.7, 0.8, 1.01]).verdict == "within noise"
    assert paired([1.2, 1.3], tokens_per_forward=1.0).verdict == "within noise"  # drafted nothing
    # a policy that drafted once in a hundred rounds cannot have made a 4 % gain: noise
    barely = paired([1.04, 1.08, 1.3], tokens_per_forward=1.005)
    assert barely.drafted and not barely.explained and barely.verdict == "within noise"
    assert paired([1.04, 1.08], tokens_per_forward=1.05).verdict == "faster"
    assert "[1.05-1.30]" in str(paired([1.05, 1.2, 1.3]))


def test_race_pairs_every_repeat_and_checks_the_tokens():
    target = tiny_llama(seed=0)
    draft = noisy_copy(target, 0.02)
    made = itertools.count()

    def engines():
        next(made)
        size = dict(max_batch_size=2, max_seq_len=40)
        return {"plain": ms.Engine(target, **size),
                "draft": ms.Engine(target, draft, k=3, adaptive=False, **size),
                "queued": ms.Engine(target, max_batch_size=1, max_seq_len=40)}  # one at a time

    result = race(engines, PROMPTS, 12, repeats=3)
    assert next(made) == 3                                   # fresh engines every repeat
    plain, spec = result["plain"], result["draft"]
    assert plain.ratios == [1.0, 1.0, 1.0] and plain.tokens_per_forward == pytest.approx(1.0)
    assert len(spec.ratios) == 3 and spec.ratios == sorted(spec.ratios) and spec.same
    assert spec.outputs == [ms.generate(target, p, 12, eos_token_id=[]).tokens for p in PROMPTS]
    assert spec.tokens_per_forward > 1.5                     # a close draft is mostly accepted
    assert spec.low <= spec.ratio <= spec.high
    assert len(spec.speeds) == 3 and spec.speeds[0] <= spec.tokens_per_s <= spec.speeds[-1]
    queued = result["queued"]           # a request's own forwards, not the engine's: still 1.0
    assert queued.tokens_per_forward == pytest.approx(plain.tokens_per_forward) and queued.same


def test_one_repeat_has_no_spread():
    with pytest.raises(ValueError, match="at least 2"):
        race(dict, PROMPTS, 4, repeats=1)


def test_interleave_times_only_the_runs_in_alternating_order():
    """On a clock that only the runs advance (by each task's price), every repeat's seconds are the
    price, the set-up is untimed, the warm-up is thrown away and the order flips every repeat."""
    now, order = [0.0], []

    def task(name, price):
        def prepare():
            now[0] += 100.0                                   # set-up: not timed
            return lambda: (order.append(name), now.__setitem__(0, now[0] + price), name)[-1]
        return prepare

    timed = interleave({"a": task("a", 2.0), "b": task("b", 1.0)}, repeats=3, warmup=1,
                       clock=lambda: now[0])
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert timed["a"].seconds == [2.0] * 3 and timed["b"].seconds == [1.0] * 3
    assert timed["a"].median == 2.0 and timed["b"].output == "b"


def test_ratios_pair_the_repeats_and_weigh_the_work():
    seconds = {"base": [1.0, 2.0, 1.0], "fast": [0.5, 1.0, 0.8], "more": [1.0, 2.0, 1.0]}
    paired_ = ratios(seconds, "base", work={"more": 2.0})
    assert paired_["base"] == [1.0, 1.0, 1.0]
    assert paired_["fast"] == pytest.approx([1.25, 2.0, 2.0])   # repeat by repeat, sorted
    assert paired_["more"] == [2.0, 2.0, 2.0]                   # twice the work in the same time
