"""EAGLE-style drafting: the head reads the target's own features; verification keeps the
target's law.

The tests use tiny random targets (tests/tinymodels.py). Three kinds of head:

* a randomly initialised :class:`~minispec.extra_drafters.eagle_head.EagleHead` (full vocabulary, or
every
  other id): few drafts accepted, but every draft is still judged by the target, so greedy output
  must be the target's and sampled output must have the target's law;
* a *self-copy* head on a one-layer target: ``fc`` passes the token's embedding through and the
  head's decoder layer is the target's only layer, so the head computes the target minus its first
  token (the head's positions count pairs ``(f_{t-1}, x_t)``, which start at ``x_1``). Most drafts
  are accepted: the accept path and the multi-draft rounds are exercised, honestly, without
  training;
* a reference drafter written here without any cache (:func:`reference_drafts`): the target's
  features of the committed context, the head over all pairs, then its own predicted features. The
  drafter's batched, cached drafts must equal it round by round -- a head fed a rejected draft's
  feature, or keeping one of its own guesses, drafts something else.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from lawcheck import chi_square_pvalue
from tinymodels import exact_two_token_law, tiny_llama

import minispec as ms
from minispec.extra_drafters.eagle import EagleDrafter, load_drafter
from minispec.extra_drafters.eagle_head import EagleHead, load_head, save_head
from minispec.serving.engine import Engine

NEW = 20
PROMPTS = [[1, 2], [3, 4, 5], [5, 6, 5, 6, 5], [9] * 6, list(range(10, 22)), [40, 41, 42, 40, 41],
           list(range(20, 44))]

pytestmark = pytest.mark.usefixtures("one_thread")


def every_other(vocab_size: int) -> torch.Tensor:
    return torch.arange(0, vocab_size, 2)


def random_head(target, vocab=None, seed=7, layout="minispec", aux_layers=None) -> EagleHead:
    """A randomly initialised head bound to ``target`` (weights scaled so its logits are peaked);
    ``aux_layers``: an EAGLE-3 head fusing those target layers."""
    torch.manual_seed(seed)
    head = EagleHead(target.config, vocab, layout=layout, aux_layers=aux_layers).bind(target)
    head.eval()
    with torch.no_grad():
        for param in head.parameters():
            if param.ndim > 1:
                param.normal_(0, 0.35)
    return head.requires_grad_(False)


def self_copy_head(target, vocab=None) -> EagleHead:
    """``fc([e; f]) = e`` and the target's own layer 0: on a one-layer target it drafts what the
    target says, minus the first token of the context (see the module docstring)."""
    head = EagleHead(target.config, vocab).bind(target).eval()
    D = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, :D] = torch.eye(D)
        head.layer.load_state_dict(target.layers[0].state_dict())
    return head.requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def heads(target):
    return {"full": random_head(target),
            "reduced": random_head(target, every_other(target.config.vocab_size)),
            "eagle1": random_head(target, layout="eagle1")}


@pytest.fixture(scope="module")
def baselines(target):
    return [ms.generate(target, p, NEW).tokens for p in PROMPTS]


def reference_drafts(target, head: EagleHead, context: list[int], k: int) -> list[int]:
    """Greedy drafts with no cache: the target's features of ``context[:-1]``, pairs
    ``(f_j, x_{j+1})``, then ``(f'_i, d_i)`` with the head's own predicted feature."""
    with torch.inference_mode():
        n = len(context)
        _, f = target(torch.tensor([context[:-1]]), torch.arange(n - 1)[None], return_hidden=True)
        ids, features, drafts = torch.tensor([context[1:]]), f, []
        for _ in range(k):
            logits, predicted = head(ids, features, torch.arange(ids.shape[1])[None])
            drafts.append(int(head.vocab[logits[0, -1].argmax()]))
            ids = torch.cat([ids, torch.tensor([[drafts[-1]]])], dim=1)
            features = torch.cat([features, predicted[:, -1:]], dim=1)
    return drafts


def full_hidden(target, ids: list[int]) -> torch.Tensor:
    """The target's last hidden states over ``ids`` in one forward, no cache: ``(T, D)``."""
    with torch.inference_mode():
        _, hidden = target(torch.tensor([ids]), torch.arange(len(ids))[None], return_hidden=True)
    return hidden[0]


class Spy:
    """Wraps a drafter's hooks (instance attributes, so an engine's clone can be spied too) and
    records every round's drafts and every feature row the drafter is given."""

    def __init__(self, drafter: EagleDrafter):
        self.drafter, self.rounds, self.observed, self.prefills = drafter, [], [], []
        self.last: dict[str, list[int]] = {}
        propose, observe, prefill = drafter.propose, drafter.observe, drafter.observe_prefill

        def propose_hook(seqs, ks):
            proposals = propose(seqs, ks)
            for seq, k, p in zip(seqs, ks, proposals, strict=True):
                self.last[seq.request_id] = p.tree.tokens[1:]             # a chain's drafts
                self.rounds.append((list(seq.context), k, p.tree.tokens[1:]))
            return proposals

        def observe_hook(seqs, num_accepted, hidden, paths):
            for seq, a, h in zip(seqs, num_accepted, hidden, strict=True):
                drafts = self.last.pop(seq.request_id, [])      # [] : a round that did not propose
                self.observed.append((list(seq.context), drafts, a, h.clone()))
            observe(seqs, num_accepted, hidden, paths)

        def prefill_hook(seqs, starts, hidden):
            for seq, s, h in zip(seqs, starts, hidden, strict=True):
                self.prefills.append((seq.request_id, list(seq.context), s, h.clone()))
            prefill(seqs, starts, hidden)

        drafter.propose, drafter.observe, drafter.observe_prefill = (
            propose_hook, observe_hook, prefill_hook)


# ---------------------------------------------------------------------- 1. greedy parity


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("vocab", ["full", "reduced", "eagle1"])
def test_greedy_output_is_the_targets_with_a_random_head(target, heads, baselines, vocab, k):
    head = heads[vocab]
    for prompt, base in zip(PROMPTS, baselines, strict=True):
        out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=k)
        assert out.tokens == base and out.finish_reason == "length"
        assert out.stats.rounds < NEW or out.stats.accepted == 0


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_a_head_that_knows_the_target_gets_drafts_accepted(vocab):
    target = tiny_llama(seed=0, layers=1)
    head = self_copy_head(target,
                          None if vocab == "full" else every_other(target.config.vocab_size))
    accepted = tested = 0
    for prompt in PROMPTS:
        out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=3, adaptive=False)
        assert out.tokens == ms.generate(target, prompt, NEW).tokens
        accepted, tested = accepted + out.stats.accepted, tested + out.stats.tested
        assert out.stats.target_forwards < NEW
        if vocab == "reduced":            # q is zero outside V': an odd token is never drafted
            assert all(d % 2 == 0 for r in out.rounds for d in r.drafts)
    assert accepted / tested > (0.6 if vocab == "full" else 0.2)   # measured 0.84 and 0.4


def test_a_packed_head_drafts_as_the_eager_one(tmp_path):
    """``make_fast`` (oneDNN-packed fc, layer and V' rows) changes float rounding only: on a
    target whose drafts get accepted, the packed head's rounds equal the eager head's."""
    from minispec.speed import packed

    target = tiny_llama(seed=0, layers=1)
    if packed.unavailable_reason(target) is not None:
        pytest.skip(packed.unavailable_reason(target))
    eager = self_copy_head(target, every_other(target.config.vocab_size))
    save_head(eager, tmp_path, dtype=torch.float32)
    drafter = ms.load_drafter(tmp_path, target, fast=True)
    assert isinstance(drafter.model.fc, packed.PackedLinear)
    assert isinstance(drafter.model.layer.self_attn.o_proj, packed.PackedLinear)
    for prompt in PROMPTS:
        # a fixed k: under goodput k the rounds would depend on the clock, not on the head
        a = ms.speculative_generate(target, EagleDrafter(eager), prompt, NEW, k=3, adaptive=False)
        b = ms.speculative_generate(target, drafter, prompt, NEW, k=3, adaptive=False)
        assert b.tokens == a.tokens == ms.generate(target, prompt, NEW).tokens
        assert [r.drafts for r in b.rounds] == [r.drafts for r in a.rounds]


def spied_rounds(target, head: EagleHead, driver: str, new: int) -> Spy:
    """The rounds of ``head``'s drafter at ``k = 4`` over ``PROMPTS``: four single sequences
    (``driver="single"``) or all of them in an engine of 3 rows."""
    if driver == "single":
        spy = Spy(EagleDrafter(head))
        for prompt in PROMPTS[:4]:
            ms.speculative_generate(target, spy.drafter, prompt, new, k=4, adaptive=False)
    else:
        engine = Engine(target, drafter=EagleDrafter(head), k=4, max_batch_size=3, block_size=4,
                        adaptive=False)
        spy = Spy(engine.drafter)
        engine.generate(PROMPTS, progress=False, max_new_tokens=new)
    return spy


@pytest.mark.parametrize("layout", ["full", "eagle1"])
@pytest.mark.parametrize("driver", ["single", "engine"])
def test_drafts_equal_an_uncached_reference(target, heads, driver, layout):
    """Round by round, the cached (batched) drafts are the reference drafts of the committed
    context."""
    head = heads[layout]
    spy = spied_rounds(target, head, driver, NEW)
    assert len(spy.rounds) > 20
    for context, k, drafts in spy.rounds:
        assert drafts == reference_drafts(target, head, context, k)


# ---------------------------------------------------------------------- 2. sampled law


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=1.0, top_k=3),
                                    dict(temperature=0.8, top_p=0.8)], ids=["t1", "top_k", "top_p"])
@pytest.mark.parametrize("vocab", ["full", "reduced", "eagle1"])
def test_sampled_output_has_the_targets_law(vocab, params):
    """The first two of three tokens (k = 2: a round drafts d_1 from the target's features and d_2
    from the head's own) follow the target's exact law; with V' = {0, 2, 4}, q is zero on 1 and 3,
    which only the residual can produce."""
    target = tiny_llama(vocab=5, seed=3, scale=0.5)
    head = random_head(target, every_other(5) if vocab == "reduced" else None, seed=4,
                       layout="eagle1" if vocab == "eagle1" else "minispec")
    params = ms.SamplingParams(**params)
    prompt = [1, 2, 3, 1, 2]
    law = exact_two_token_law(target, prompt, params)
    n = 1200
    engine = Engine(target, drafter=EagleDrafter(head), k=2, max_batch_size=64, block_size=4)
    results = engine.generate([prompt] * n, [dataclasses.replace(params, seed=s) for s in range(n)],
                              progress=False, max_new_tokens=3)
    counts = torch.zeros(25)
    for result in results:
        counts[result.tokens[0] * 5 + result.tokens[1]] += 1
    accepted = sum(r.stats.accepted for r in results)
    assert 0 < accepted < sum(r.stats.tested for r in results)      # both paths taken
    keep = law * n >= 5                                                # merge rare cells into one
    merged_counts = torch.cat([counts[keep], counts[~keep].sum()[None]])
    merged_law = torch.cat([law[keep], law[~keep].sum()[None]])
    assert chi_square_pvalue(merged_counts, merged_law) > 1e-3


def test_q_is_zero_outside_the_draft_vocabulary(target, heads):
    head = heads["reduced"]
    spy = Spy(EagleDrafter(head))
    drafts = []
    propose = spy.drafter.propose
    spy.drafter.propose = lambda seqs, ks: drafts.extend(out := propose(seqs, ks)) or out
    ms.speculative_generate(target, spy.drafter, PROMPTS[2], NEW, k=3,
                            sampling=ms.SamplingParams(temperature=1.0, seed=0))
    odd = torch.arange(target.config.vocab_size) % 2 == 1
    assert len(drafts) > 3
    for proposal in drafts:
        tokens = proposal.tree.tokens[1:]      # a chain's drafts, each with the q it came from
        if not tokens:                         # the last round may draft nothing
            continue
        probs = torch.stack([q for draws in proposal.draws for _, q in draws])
        assert probs.shape == (len(tokens), target.config.vocab_size)
        assert torch.all(probs[:, odd] == 0)
        assert torch.allclose(probs.sum(-1), torch.ones(len(tokens)), atol=1e-5)
        assert all(t % 2 == 0 for t in tokens)


# ---------------------------------------------------------- 3. features of accepted positions only


def check_features(target, spy: Spy, k: int) -> None:
    """Every row the drafter was given is the target's own state at the committed position it
    claims; after a verify, exactly ``a + 1`` rows: ``[last, d_1..d_a]``."""
    assert any(a < len(d) for _, d, a, _ in spy.observed)        # some drafts were rejected
    assert any(a > 0 for _, _, a, _ in spy.observed)             # and some accepted
    for context, drafts, a, hidden in spy.observed:
        n = len(context)
        assert hidden.shape == (a + 1, target.config.hidden_size)
        full = full_hidden(target, context + drafts[:a])                        # (n + a, D)
        assert torch.allclose(hidden, full[n - 1:], atol=1e-5)
    next_start: dict[str, int] = {}
    for rid, context, start, hidden in spy.prefills:
        assert start == 0 or start == next_start[rid]             # chunks in order, restarts at 0
        next_start[rid] = start + len(hidden)
        assert next_start[rid] <= len(context) - 1                # never the last token
        full = full_hidden(target, context[:-1])
        assert torch.allclose(hidden, full[start:next_start[rid]], atol=1e-5)


@pytest.mark.parametrize("driver", ["single", "engine", "engine-chunked"])
def test_the_head_only_gets_the_targets_features_of_committed_positions(driver):
    target = tiny_llama(seed=0, layers=1)
    head = self_copy_head(target)
    if driver == "single":
        spy = Spy(EagleDrafter(head))
        for prompt in PROMPTS:
            ms.speculative_generate(target, spy.drafter, prompt, NEW, k=3, adaptive=False)
    else:
        chunk = {"engine": None, "engine-chunked": 5}[driver]
        engine = Engine(target, drafter=EagleDrafter(head), k=3, max_batch_size=3, block_size=4,
                        max_num_batched_tokens=chunk, adaptive=False)
        spy = Spy(engine.drafter)
        results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
        assert all(r.finish_reason == "length" for r in results)
        if chunk:
            assert any(start > 0 for _, _, start, _ in spy.prefills)     # really chunked
    check_features(target, spy, k=3)


def test_the_check_fails_when_rejected_drafts_features_are_passed(target, heads):
    """The check above is not vacuous: a runner that handed all K + 1 rows would be caught."""
    spy = Spy(EagleDrafter(heads["full"]))
    ms.speculative_generate(target, spy.drafter, PROMPTS[2], NEW, k=3, adaptive=False)
    context, drafts, a, _ = next(o for o in spy.observed if o[2] < len(o[1]))
    all_rows = full_hidden(target, context + drafts)[len(context) - 1:]         # (K + 1, D)
    spy.observed = [(context, drafts, a, all_rows)]
    with pytest.raises(AssertionError):
        check_features(target, spy, k=3)


# ---------------------------------------------------------------------- 4. engine parity


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
@pytest.mark.parametrize("vocab", ["full", "reduced", "eagle1"])
def test_engine_greedy_equals_single_sequence_decoding(target, heads, baselines, vocab, kv_cache):
    head = heads[vocab]
    engine = Engine(target, drafter=EagleDrafter(head), k=3, max_batch_size=4, kv_cache=kv_cache,
                    block_size=4)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    for prompt, base, result in zip(PROMPTS, baselines, results, strict=True):
        single = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=3)
        assert result.tokens == single.tokens == base and result.finish_reason == "length"
    if kv_cache == "paged":
        assert engine.target_cache.num_used_blocks == engine.draft_cache.num_used_blocks == 0


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_engine_rounds_equal_single_sequence_rounds(target, heads, kv_cache):
    """Greedy drafts are deterministic: batched, each request accepts what it accepts alone (with
    a fixed k: goodput k chooses each round's k from the clock and the batch)."""
    head = heads["full"]
    engine = Engine(target, drafter=EagleDrafter(head), k=3, max_batch_size=4, kv_cache=kv_cache,
                    block_size=4, adaptive=False)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    for prompt, result in zip(PROMPTS, results, strict=True):
        single = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=3,
                                         adaptive=False)
        assert result.stats.accepted_per_round == single.stats.accepted_per_round


@pytest.mark.parametrize("chunk", [None, 6])
def test_engine_parity_with_preemption_and_chunked_prefill(chunk):
    target = tiny_llama(seed=0, layers=1)
    head = self_copy_head(target)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(48, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 26, (12,), generator=g)]
    engine = Engine(target, drafter=EagleDrafter(head), k=3, max_batch_size=6, block_size=4,
                    num_blocks=20, max_num_batched_tokens=chunk, adaptive=False)
    spy = Spy(engine.drafter)
    results = engine.generate(prompts, progress=False, max_new_tokens=NEW)
    assert engine.scheduler.num_preemptions > 0
    assert any(start == 0 and rid in {r for r, _, s, _ in spy.prefills[:i] if s == 0}
               for i, (rid, _, start, _) in enumerate(spy.prefills))    # a prefill was restarted
    for prompt, result in zip(prompts, results, strict=True):
        assert result.tokens == ms.generate(target, prompt, NEW).tokens
    assert sum(r.stats.accepted for r in results) > 0
    assert engine.target_cache.num_used_blocks == engine.draft_cache.num_used_blocks == 0
    assert engine.drafter.pending == {}                                 # released
    check_features(target, spy, k=3)


# ---------------------------------------------------------------------- edge cases of the round


def test_a_one_token_prompt_single(target, heads):
    out = ms.speculative_generate(target, EagleDrafter(heads["full"]), [7], NEW, k=3)
    assert out.tokens == ms.generate(target, [7], NEW).tokens


def test_a_one_token_prompt_engine(target, heads):
    engine = Engine(target, drafter=EagleDrafter(heads["full"]), k=3, block_size=4)
    result = engine.generate([[7]], progress=False, max_new_tokens=NEW)[0]
    assert result.tokens == ms.generate(target, [7], NEW).tokens


@pytest.mark.parametrize("vocab", ["full", "reduced"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_head_logits_fail_that_row_alone(target, heads, baselines, monkeypatch, vocab,
                                             temperature):
    """The head's logits are NaN for the row whose prompt starts with 33 (a broken head, as a NaN
    weight read by that request alone would make it): that row fails, the others decode as
    before, greedy rows (the argmax fast path) and sampled rows alike."""
    feed = EagleDrafter._feed

    def poisoned(self, seqs, tokens, features):
        logits, feature = feed(self, seqs, tokens, features)
        bad = torch.tensor([seq.context[0] == 33 for seq in seqs])[:, None, None]
        return logits.masked_fill(bad, float("nan")), feature

    sampling = ms.SamplingParams(temperature=temperature, seed=0 if temperature else None)
    healthy = Engine(target, drafter=EagleDrafter(heads[vocab]), k=3, block_size=4,
                     adaptive=False).generate(PROMPTS[:3], sampling, progress=False,
                                              max_new_tokens=NEW)
    monkeypatch.setattr(EagleDrafter, "_feed", poisoned)
    engine = Engine(target, drafter=EagleDrafter(heads[vocab]), k=3, block_size=4, adaptive=False)
    results = engine.generate([PROMPTS[0], [33, 4, 5], *PROMPTS[1:3]], sampling, progress=False,
                              max_new_tokens=NEW)
    assert results[1].finish_reason == "error" and "NaN" in results[1].error
    assert [r.tokens for r in results[:1] + results[2:]] == [r.tokens for r in healthy]
    if not temperature:
        assert [r.tokens for r in healthy] == baselines[:3]
    assert engine.target_cache.num_used_blocks == 0


def test_adaptive_engine_rows_that_skip_drafting(target, heads, baselines):
    engine = Engine(target, drafter=EagleDrafter(heads["full"]), k=3, block_size=4, adaptive=True)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    assert [r.tokens for r in results] == baselines


# ---------------------------------------------------------------------- 5. files and errors


@pytest.mark.parametrize("vocab", ["full", "reduced", "eagle1"])
def test_save_then_load_gives_the_same_drafts(target, heads, vocab, tmp_path):
    head = heads[vocab]
    exact = load_drafter(save_head(head, tmp_path / "fp32", dtype=torch.float32), target)
    assert torch.equal(exact.model.vocab, head.vocab)
    half = load_head(save_head(head, tmp_path / "fp16", extra={"steps": 0}), target)
    rounded = copy.deepcopy(head)
    with torch.no_grad():
        for param in rounded.parameters():
            param.copy_(param.half().float())
    rounded.bind(target)
    for prompt in PROMPTS[1:5]:
        context = prompt + [3, 1]
        assert (reference_drafts(target, exact.model, context, 4)
                == reference_drafts(target, head, context, 4))
        assert (reference_drafts(target, half, context, 4)
                == reference_drafts(target, rounded, context, 4))
        for loaded, original in ((exact, head), (EagleDrafter(half), rounded)):
            # a fixed k: under goodput k the rounds would depend on the clock, not on the head
            a = ms.speculative_generate(target, loaded, prompt, NEW, k=3, adaptive=False)
            b = ms.speculative_generate(target, EagleDrafter(original), prompt, NEW, k=3,
                                        adaptive=False)
            assert a.tokens == b.tokens and a.stats.accepted_per_round == b.stats.accepted_per_round
    for name, value in head.state_dict().items():
        assert torch.equal(exact.model.state_dict()[name], value)


@pytest.mark.parametrize("other", [dict(hidden=48), dict(vocab=40), dict(heads=2, kv_heads=1)])
def test_loading_for_a_target_of_another_shape_fails(heads, tmp_path, other):
    directory = save_head(heads["reduced"], tmp_path)
    wrong = tiny_llama(**other)
    with pytest.raises(ValueError, match="made for a target"):
        load_drafter(directory, wrong)
    with pytest.raises(ValueError, match="made for a target"):
        load_head(directory, wrong)


def test_a_missing_head_is_file_not_found(target, tmp_path):
    with pytest.raises(FileNotFoundError):
        load_drafter(tmp_path / "nowhere", target)
    with pytest.raises(FileNotFoundError, match="head.safetensors"):
        load_drafter(tmp_path, target)                        # a directory without a head in it
    with pytest.raises(FileNotFoundError):
        load_head(tmp_path, target)


def test_a_drafter_bound_to_another_target_is_refused(target, heads):
    twin = copy.deepcopy(target)                               # same weights, another model
    drafter = EagleDrafter(heads["full"])
    with pytest.raises(ValueError, match="another target"):
        ms.speculative_generate(twin, drafter, PROMPTS[1], NEW, k=3)
    with pytest.raises(ValueError, match="another target"):
        Engine(twin, drafter=drafter, k=3)
    unbound = EagleHead(target.config)
    with pytest.raises(ValueError, match="not bound"):
        ms.speculative_generate(target, EagleDrafter(unbound), PROMPTS[1], NEW, k=3)


@pytest.mark.parametrize("vocab", [[-1, 2], [0, 48], [3, 1, 2], [1, 1, 2], [], [[0, 1]]])
def test_a_bad_draft_vocabulary_is_refused(target, vocab):
    with pytest.raises(ValueError, match="vocab"):
        EagleHead(target.config, torch.tensor(vocab, dtype=torch.long))


def test_the_eagle1_layout_has_no_fc_bias_no_input_norm_and_no_final_norm(target, heads):
    """The checkpoint layout vLLM and SGLang read (tests/test_export.py checks the whole forward
    against transformers' decoder layer)."""
    head = heads["eagle1"]
    names = set(head.state_dict())
    assert "fc.bias" not in names and not any("input_layernorm" in n for n in names)
    assert {"fc.bias", "layer.input_layernorm.weight"} <= set(heads["full"].state_dict())
    ids, features = torch.tensor([[3, 4, 5]]), torch.randn(1, 3, target.config.hidden_size)
    logits, feature = head(ids, features, torch.arange(3)[None])
    torch.testing.assert_close(logits, feature @ target.output_weight.T)   # LM head, no norm
    assert not torch.allclose(feature, target.norm(feature), atol=1e-2)
    with pytest.raises(ValueError, match="layout"):
        EagleHead(target.config, layout="eagle2")
