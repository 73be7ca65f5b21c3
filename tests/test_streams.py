"""``Engine.stream`` yields exactly its own requests' outputs, whoever else drives the engine, and
leaving a stream early aborts what it started (issue: no request touches another)."""

from __future__ import annotations

import pytest
from tinymodels import noisy_copy, tiny_llama

import minispec as ms

NEW = 12
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target, noisy_copy(target, 0.05, seed=None)


@pytest.fixture(scope="module")
def alone(pair):
    return {tuple(p): ms.generate(pair[0], p, NEW).tokens for p in PROMPTS}


def collect(outputs) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for out in outputs:
        if out.token is not None:
            tokens.setdefault(out.request_id, []).append(out.token)
    return tokens


def test_two_interleaved_streams_each_get_their_own(pair, alone):
    engine = ms.Engine(pair[0], draft=pair[1], k=3, max_batch_size=3, block_size=4)
    a = engine.stream(PROMPTS[:2], max_new_tokens=NEW)
    b = engine.stream(PROMPTS[2:], max_new_tokens=NEW)
    seen_a, seen_b, done = [], [], set()
    while len(done) < 2:                       # alternate: each stream also drives the other's
        for name, stream, seen in (("a", a, seen_a), ("b", b, seen_b)):
            if name not in done:
                out = next(stream, None)
                if out is None:
                    done.add(name)
                else:
                    seen.append(out)
    ids_a, ids_b = {o.request_id for o in seen_a}, {o.request_id for o in seen_b}
    assert len(ids_a) == 2 and len(ids_b) == 3 and not ids_a & ids_b
    got = {**collect(seen_a), **collect(seen_b)}
    finished = {o.request_id: o for o in seen_a + seen_b if o.finished}
    assert len(finished) == 5
    prompts = dict(zip(sorted(got, key=int), PROMPTS, strict=True))
    assert all(got[rid] == alone[tuple(prompts[rid])] for rid in got)
    assert engine.target_cache.num_used_blocks == 0 and not engine.has_unfinished()


def test_a_stream_beside_step_and_generate(pair, alone):
    """A stream's outputs never leak into step(); step()'s requests never vanish into a stream;
    generate() inside a stream loop works and the stream still ends."""
    engine = ms.Engine(pair[0], draft=pair[1], k=3, max_batch_size=4, block_size=4)
    own = engine.add_request(PROMPTS[3], max_new_tokens=NEW)
    from_step, from_stream, inner = [], [], None
    for i, out in enumerate(engine.stream(PROMPTS[:2], max_new_tokens=NEW)):
        from_stream.append(out)
        from_step += engine.step()                     # another consumer drives the engine
        if i == 1:
            inner = engine.generate([PROMPTS[4]], max_new_tokens=NEW, progress=False)
    while engine.has_unfinished():
        from_step += engine.step()
    assert {o.request_id for o in from_step} == {own}
    assert collect(from_step)[own] == alone[tuple(PROMPTS[3])]
    assert {o.request_id for o in from_stream}.isdisjoint({own})
    assert sum(o.finished for o in from_stream) == 2
    assert sorted(collect(from_stream).values()) == sorted(alone[tuple(p)] for p in PROMPTS[:2])
    assert inner[0].tokens == alone[tuple(PROMPTS[4])]


def test_leaving_a_stream_early_aborts_its_requests(pair, alone):
    engine = ms.Engine(pair[0], draft=pair[1], k=3, max_batch_size=2, block_size=4)
    for _out in engine.stream(PROMPTS[:2], max_new_tokens=40):
        break                                          # the stream is closed here
    assert not engine.has_unfinished()
    assert engine.target_cache.num_used_blocks == 0 and engine.draft_cache.num_used_blocks == 0
    steps_before = engine.target_forwards
    out = engine.generate([PROMPTS[2]], max_new_tokens=4, progress=False)[0]
    assert out.tokens == alone[tuple(PROMPTS[2])][:4]
    assert engine.target_forwards - steps_before <= 4   # nothing else was still running


def test_a_bad_prompt_list_is_refused(pair):
    engine = ms.Engine(pair[0], block_size=4)
    with pytest.raises(ValueError, match="list of prompts"):
        engine.generate("ROMEO", progress=False)
    with pytest.raises(ValueError, match="list of prompts"):
        list(engine.stream({"role": "user", "content": "hi"}))
    assert not engine.has_unfinished()
