"""The static-shape step gives the dynamic path's logits and tokens (CPU: it runs eagerly).

[`StaticForward`][minispec.speed.static_step.StaticForward] pads a batch to a bucket and reads
everything from preallocated buffers so that a GPU can replay it as a CUDA graph. Here, without a
GPU, the same step runs eagerly and is checked against ``Llama.forward``: chain and tree forwards,
padded prefills, paged and contiguous caches, NaN where a row cannot see; then both drivers, end
to end, and the step's operations (no host sync inside it).
"""

import copy

import pytest
import torch
from tinymodels import VOCAB, noisy_copy, tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode

import minispec as ms
from minispec.models.llama import TreeAttention
from minispec.speed.goodput import bucket
from minispec.speed.static_step import StaticForward

pytestmark = pytest.mark.usefixtures("one_thread")
NAN = float("nan")
CACHES = {
    "contiguous": lambda m: ms.ContiguousKVCache.for_model(m, num_slots=6, max_seq_len=40),
    "paged": lambda m: ms.PagedKVCache.for_model(m, num_slots=6, max_seq_len=40, block_size=4),
    # blocks longer than a slot (64 positions, the contiguous cache's key unit): whole blocks
    "paged, 64-position blocks": lambda m: ms.PagedKVCache.for_model(m, num_slots=6,
                                                                     max_seq_len=40,
                                                                     block_size=64),
}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


def both(model, kind, steps):
    """Run ``steps`` (a list of (ids, positions, slots, tree)) through the dynamic path and the
    static step on two identical caches; each step's two (logits, hidden) pairs."""
    dynamic = CACHES[kind](model)
    slots = [dynamic.allocate() for _ in range(5)]
    static_cache = copy.deepcopy(dynamic)
    static = StaticForward(model, static_cache)
    out = []
    with torch.inference_mode():
        for ids, pos, rows, tree in steps:
            chosen = [slots[r] for r in rows]
            a = model(ids, pos, dynamic, chosen, return_hidden=True, tree=tree)
            b = static.in_bucket(ids, pos, chosen, tree)
            assert [dynamic.length(s) for s in slots] == [static_cache.length(s) for s in slots]
            out.append((a, b))
    return out


def prefill_then_decode(gen):
    """A padded prefill of three rows (lengths 7, 3, 5), a decode step of three, a chain verify
    of 4 tokens on two rows, then one row alone."""
    ids = torch.randint(0, VOCAB, (3, 7), generator=gen)
    pos = torch.tensor([list(range(7)), [0, 1, 2] + [-1] * 4, list(range(5)) + [-1] * 2])
    step = torch.randint(0, VOCAB, (3, 1), generator=gen)
    verify = torch.randint(0, VOCAB, (2, 4), generator=gen)
    return [(ids, pos, [0, 1, 2], None),
            (step, torch.tensor([[7], [3], [5]]), [0, 1, 2], None),
            (verify, torch.tensor([[8, 9, 10, 11], [4, 5, 6, 7]]), [0, 1], None),
            (step[:1], torch.tensor([[12]]), [0], None)]


def a_tree_verify(gen):
    """Two rows (4 and 6 committed tokens) each scoring a 4-node tree: root, two children of the
    root, one grandchild under the first child."""
    ids = torch.randint(0, VOCAB, (2, 6), generator=gen)
    pos = torch.tensor([list(range(4)) + [-1, -1], list(range(6))])
    ancestors = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]).bool()
    nodes = torch.randint(0, VOCAB, (2, 4), generator=gen)
    depths = torch.tensor([0, 1, 1, 2])
    tree = TreeAttention(torch.tensor([[3, 4, 5, 6], [5, 6, 7, 8]]), torch.tensor([3, 5]),
                         ancestors.expand(2, 4, 4))
    return [(ids, pos, [3, 4], None),
            (nodes, torch.stack([3 + depths, 5 + depths]), [3, 4], tree)]


@pytest.mark.parametrize("kind", CACHES)
def test_chain_and_tree_forwards_equal_the_dynamic_path(model, kind):
    gen = torch.Generator().manual_seed(0)
    steps = prefill_then_decode(gen) + a_tree_verify(gen)
    for (_, pos, _, _), ((logits, hidden), (s_logits, s_hidden)) in zip(
            steps, both(model, kind, steps), strict=True):
        assert s_logits.shape == logits.shape and s_hidden.shape == hidden.shape
        real = pos >= 0                                   # padding's logits are garbage in both
        assert torch.allclose(s_logits[real], logits[real], atol=1e-5, rtol=1e-5)
        assert torch.equal(s_logits[real].argmax(-1), logits[real].argmax(-1))
        assert torch.allclose(s_hidden[real], hidden[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", CACHES)
def test_nan_where_a_row_cannot_see_changes_no_logit(model, kind):
    """Every cache entry no row owns (other slots, the scratch row, block-table padding) is NaN:
    the static step's logits stay finite and equal to those of a clean cache."""
    gen = torch.Generator().manual_seed(1)
    clean, poisoned = CACHES[kind](model), None
    slots = [clean.allocate() for _ in range(2)]
    ids = torch.randint(0, VOCAB, (2, 6), generator=gen)
    pos = torch.tensor([list(range(6)), list(range(3)) + [-1] * 3])
    with torch.inference_mode():
        model(ids, pos, clean, slots)
        poisoned = copy.deepcopy(clean)
        for store in poisoned.k + poisoned.v:
            flat = store.view(-1, *store.shape[2:])
            keep = torch.zeros(flat.shape[0], dtype=torch.bool)
            for slot, n in zip(slots, (6, 3), strict=True):
                keep[poisoned.flat_index(slot, list(range(n)))] = True
            flat[~keep] = NAN
        step, step_pos = torch.randint(0, VOCAB, (2, 2), generator=gen), torch.tensor(
            [[6, 7], [3, -1]])
        a = StaticForward(model, clean).in_bucket(step, step_pos, slots)
        b = StaticForward(model, poisoned).in_bucket(step, step_pos, slots)
    assert torch.isfinite(b[0]).all() and torch.equal(a[0], b[0])


def test_buckets_pad_the_batch_and_reuse_their_buffers(model):
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    cache = CACHES["paged"](model)
    slots = [cache.allocate() for _ in range(3)]
    static = StaticForward(model, cache)
    with torch.inference_mode():
        static.in_bucket(torch.ones(3, 2, dtype=torch.long), torch.tensor([[0, 1]] * 3), slots)
        static.in_bucket(torch.ones(3, 1, dtype=torch.long), torch.tensor([[2]] * 3), slots)
        static.in_bucket(torch.ones(3, 1, dtype=torch.long), torch.tensor([[3]] * 3), slots)
    assert sorted(static.steps) == [(4, 1, 4), (4, 2, 4)]   # 3 rows -> 4; one block of keys


class Recorder(TorchDispatchMode):
    """Every aten operation run under it, by name."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", CACHES)
def test_the_step_never_syncs_with_the_host(model, kind):
    """No ``.item()`` / ``.tolist()`` (``_local_scalar_dense``), no ``nonzero``: a CUDA graph
    could not record them."""
    cache = CACHES[kind](model)
    slots = [cache.allocate() for _ in range(2)]
    static = StaticForward(model, cache)
    with torch.inference_mode():
        static.in_bucket(torch.ones(2, 3, dtype=torch.long),
                         torch.tensor([[0, 1, 2], [0, -1, -1]]), slots)
        [step] = static.steps.values()
        with Recorder() as recorder:
            step.run()
    assert "aten.index_copy_" in recorder.ops and "aten.index_select" in recorder.ops
    assert not {"aten._local_scalar_dense", "aten.nonzero", "aten.item"} & set(recorder.ops)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(seed=0)
    return target.double(), noisy_copy(target, 0.05, seed=None).double()


PROMPTS = [[1, 2, 3], [5, 6, 5, 6, 5], list(range(10, 22)), [40, 41, 42, 40, 41]]


@pytest.mark.parametrize("options", [dict(drafter=None, k=0), dict(drafter="model", k=3),
                                     dict(drafter="ngram", k=4),
                                     dict(drafter="model", k=3, branching=(2, 2, 1))])
def test_speculative_generate_with_the_static_step_equals_without(pair, options):
    target, draft = pair
    options = dict(options)
    drafter = draft if options.pop("drafter") == "model" else options.get("drafter", "ngram")
    drafter = None if options["k"] == 0 else drafter
    sampled = ms.SamplingParams(temperature=1.0, top_k=20, seed=3)
    for prompt in PROMPTS:
        for sampling in (None, sampled):
            run = [ms.speculative_generate(target, drafter, prompt, 20, sampling=sampling,
                                           adaptive=False, graphs=graphs, **options)
                   for graphs in (False, True)]
            assert run[0].tokens == run[1].tokens


def test_a_drafter_reused_without_graphs_drafts_eagerly_on_its_new_cache(pair):
    """A draft model captured by one call and attached to a fresh cache by the next runs on that
    cache: the static step stays with the call that made it."""
    target, draft = pair
    drafter = ms.ModelDrafter(draft)
    first = ms.speculative_generate(target, drafter, PROMPTS[2], 20, k=3, graphs=True)
    assert isinstance(drafter.step, StaticForward) and drafter.step.steps
    second = ms.speculative_generate(target, drafter, PROMPTS[2], 20, k=3, graphs=False)
    assert not isinstance(drafter.step, StaticForward)
    assert first.tokens == second.tokens == ms.generate(target, PROMPTS[2], 20).tokens
    assert first.stats.accepted_per_round == second.stats.accepted_per_round


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
@pytest.mark.parametrize("branching", [None, (2, 1, 1)])
def test_the_engine_on_the_static_step_equals_single_requests(pair, kv_cache, branching):
    """Six requests through a batch of four (refills), a small pool on the paged path
    (preemption), greedy: every output equals ``ms.generate`` alone."""
    target, draft = pair
    prompts = PROMPTS + [[7] * 9, [3, 1, 4, 1, 5, 9, 2, 6]]
    pool = dict(num_blocks=24) if kv_cache == "paged" else {}
    engine = ms.Engine(target, draft=draft, k=3, max_batch_size=4, kv_cache=kv_cache,
                       block_size=4, branching=branching, adaptive=False, graphs=True, **pool)
    results = engine.generate(prompts, progress=False, max_new_tokens=16)
    assert [r.tokens for r in results] == [ms.generate(target, p, 16).tokens for p in prompts]
    assert engine.runner.step.steps                           # the static step ran
    assert engine.drafter.step.steps                          # and the draft model's
    if kv_cache == "paged":
        assert engine.target_cache.num_used_blocks == 0
