"""EAGLE-3-style features: the head fuses the target's streams entering three layers.

Tiny random targets (tests/tinymodels.py) and randomly initialised heads with ``aux_layers``: few
drafts are accepted, but greedy output must be the target's (chains and trees, single sequence and
engine), and the cached drafts must equal an uncached reference that asks the target for the same
three layers. A self-copy head (tests/test_eagle.py) given ``aux_layers`` gets drafts accepted, so
the multi-draft rounds run with the fused features pending.
"""

from __future__ import annotations

import pytest
import torch
from test_eagle import PROMPTS, every_other, random_head, self_copy_head, spied_rounds
from tinymodels import tiny_llama

import minispec as ms
from minispec.extra_drafters.eagle import EagleDrafter
from minispec.extra_drafters.eagle_head import EagleHead, default_aux_layers, load_head, save_head
from minispec.serving.engine import Engine

NEW = 20
BRANCHINGS = [(3, 2, 1, 1), (2, 2, 2), (1,)]

pytestmark = pytest.mark.usefixtures("one_thread")


def eagle3_head(target, vocab=None, seed=7, aux_layers=None) -> EagleHead:
    """A randomly initialised EAGLE-3 head (peaked logits) bound to ``target``."""
    layers = aux_layers or default_aux_layers(target.config.num_hidden_layers)
    return random_head(target, vocab, seed, aux_layers=layers)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=4)


@pytest.fixture(scope="module")
def heads(target):
    return {"full": eagle3_head(target),
            "reduced": eagle3_head(target, every_other(target.config.vocab_size))}


@pytest.fixture(scope="module")
def baselines(target):
    return [ms.generate(target, p, NEW).tokens for p in PROMPTS]


def reference_drafts(target, head: EagleHead, context: list[int], k: int) -> list[int]:
    """Greedy drafts with no cache: the target's three layers over ``context[:-1]``, then the
    head's own predicted features."""
    with torch.inference_mode():
        n = len(context)
        _, f = target(torch.tensor([context[:-1]]), torch.arange(n - 1)[None],
                      return_hidden=head.aux_layers)                              # (1, n-1, 3D)
        ids, features, drafts = torch.tensor([context[1:]]), head.fuse(f), []
        for _ in range(k):
            logits, predicted = head(ids, features, torch.arange(ids.shape[1])[None])
            drafts.append(int(head.vocab[logits[0, -1].argmax()]))
            ids = torch.cat([ids, torch.tensor([[drafts[-1]]])], dim=1)
            features = torch.cat([features, predicted[:, -1:]], dim=1)
    return drafts


def test_the_target_hands_over_the_streams_entering_three_layers(target):
    ids, pos = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None]
    L, D = target.config.num_hidden_layers, target.config.hidden_size
    with torch.inference_mode():
        logits, final = target(ids, pos, return_hidden=True)
        logits3, fused = target(ids, pos, return_hidden=(0, 2, L))
    assert torch.equal(logits, logits3) and fused.shape == (1, 4, 3 * D)
    assert torch.equal(fused[..., :D], target.embed_tokens(ids))             # entering layer 0
    assert torch.allclose(target.norm(fused[..., 2 * D:]), final, atol=1e-6)  # the last output
    assert default_aux_layers(30) == (2, 15, 27) and default_aux_layers(2) == (0, 1, 2)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_output_is_the_targets_single(target, heads, baselines, vocab, k):
    drafter = EagleDrafter(heads[vocab])
    assert drafter.feature_layers == heads[vocab].aux_layers
    for prompt, base in zip(PROMPTS, baselines, strict=True):
        assert ms.speculative_generate(target, drafter, prompt, NEW, k=k).tokens == base


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_tree_output_is_the_targets(target, heads, baselines, vocab):
    for prompt, base in zip(PROMPTS[:4], baselines[:4], strict=True):
        for branching in BRANCHINGS:
            out = ms.speculative_generate(target, EagleDrafter(heads[vocab]), prompt, NEW, k=4,
                                          branching=branching)
            assert out.tokens == base


@pytest.mark.parametrize("branching", [None, (2, 2, 1)])
def test_engine_greedy_equals_plain_greedy(target, heads, baselines, branching):
    engine = Engine(target, drafter=EagleDrafter(heads["reduced"]), k=3, max_batch_size=4,
                    block_size=4, branching=branching)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    assert [r.tokens for r in results] == baselines


@pytest.mark.parametrize("driver", ["single", "engine"])
def test_drafts_equal_an_uncached_reference(target, heads, driver):
    head = heads["full"]
    spy = spied_rounds(target, head, driver, NEW)
    assert len(spy.rounds) > 20
    assert all(h.shape[-1] == 3 * target.config.hidden_size for *_, h in spy.observed)
    for context, k, drafts in spy.rounds:
        assert drafts == reference_drafts(target, head, context, k)


@pytest.mark.parametrize("branching", [None, (3, 2, 1, 1)])
def test_a_self_copy_eagle3_head_gets_drafts_accepted(branching):
    """The self-copy head ignores its features (``fc`` passes the embedding): drafts get accepted,
    and the rounds that keep several drafts run with three-layer features pending."""
    target = tiny_llama(seed=0, layers=1)
    head = self_copy_head(target)
    fused = EagleHead(target.config, aux_layers=(0, 1, 1))
    head.aux_layers, head.fuse = fused.aux_layers, fused.fuse.requires_grad_(False)
    accepted = 0
    for prompt in PROMPTS:
        out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=3,
                                      adaptive=False, branching=branching)
        assert out.tokens == ms.generate(target, prompt, NEW).tokens
        accepted += out.stats.accepted
    assert accepted > NEW


def test_save_then_load_keeps_the_layers_and_the_drafts(target, heads, baselines, tmp_path):
    save_head(heads["reduced"], tmp_path, dtype=torch.float32)
    loaded = load_head(tmp_path, target)
    assert loaded.aux_layers == heads["reduced"].aux_layers
    assert torch.equal(loaded.fuse.weight, heads["reduced"].fuse.weight)
    for prompt, base in zip(PROMPTS[:3], baselines[:3], strict=True):
        a = ms.speculative_generate(target, EagleDrafter(loaded), prompt, NEW, k=3, adaptive=False)
        b = ms.speculative_generate(target, EagleDrafter(heads["reduced"]), prompt, NEW, k=3,
                                    adaptive=False)
        assert a.tokens == base and [r.drafts for r in a.rounds] == [r.drafts for r in b.rounds]


def test_bad_layers_are_refused(target):
    with pytest.raises(ValueError, match="aux_layers"):
        EagleHead(target.config, aux_layers=(0, 1))
    with pytest.raises(ValueError, match="aux_layers"):
        EagleHead(target.config, aux_layers=(0, 1, 9))
