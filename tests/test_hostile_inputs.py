"""Hostile and broken inputs get a clear error naming the argument (issue 21, findings 4-6).

Broken checkpoints are written into ``tmp_path`` from a tiny random Llama (``tinymodels``): a
``config.json`` plus ``model.safetensors`` (or shards and an index), then damaged one way each.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch
from safetensors.torch import save_file
from tinymodels import VOCAB, hf_checkpoint, noisy_copy, tiny_llama
from tinymodels import load_refused as refused
from tinymodels import write_checkpoint as write

import minispec as ms
from minispec.core.sampling import MIN_TEMPERATURE, SamplingParams, probs_from_logits
from minispec.core.sequence import Sequence
from minispec.drafters.trees import MAX_TREE_NODES, check_branching
from minispec.loading.loader import MAX_POSITIONS, load
from minispec.tools import cli, train_eagle


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def good(model):
    """(config.json dict, Hugging Face-named weights) of a checkpoint that loads."""
    return hf_checkpoint(model)


def test_the_intact_checkpoint_loads(good, model, tmp_path):
    loaded, _ = load(write(tmp_path, *good))
    ids, pos = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
    with torch.no_grad():
        assert torch.equal(loaded(ids, pos), model(ids, pos))


# --------------------------------------------------------------------------- finding 4: temperature


@pytest.mark.parametrize("temperature", [1e-46, 7e-46, MIN_TEMPERATURE / 2])
def test_a_temperature_below_float32_range_is_refused(temperature):
    with pytest.raises(ValueError, match=r"temperature .*>= 1\.4013e-45"):
        SamplingParams(temperature=temperature)


def test_the_smallest_temperature_gives_the_argmax_law():
    logits = torch.tensor([[1.0, 3.0, 2.0], [-3e38, -2e38, -3e38]])
    probs = probs_from_logits(logits, SamplingParams(temperature=MIN_TEMPERATURE))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-40, 1e-30, 0.1, 1.0, 1e30, 3e38])
@pytest.mark.parametrize("penalty", [1.0, 1e-300, 1e300])
def test_finite_logits_never_give_nan(temperature, penalty):
    logits = torch.tensor([[0.0, 1.0, -1.0, 5.0], [-3e38, 3e38, 0.0, -1e38],
                           [-3e38, -3e38, -2e38, -3e38], [1e-30, 0.0, -1e-30, 0.0]])
    for top_k, top_p in [(0, 1.0), (2, 1.0), (0, 0.5)]:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                repetition_penalty=penalty)
        probs = probs_from_logits(logits, params, context_ids=[0, 1, 2])
        assert torch.isfinite(probs).all(), params
        torch.testing.assert_close(probs.sum(-1), torch.ones(4))


# ------------------------------------------------------------------------- finding 5: checkpoints


def test_integer_weights_are_refused(good, tmp_path):
    config, weights = good
    name = "model.layers.0.mlp.up_proj.weight"
    broken = weights | {name: weights[name].round().to(torch.int32)}
    refused(write(tmp_path, config, broken), name, "I32")


def test_a_shape_that_does_not_match_the_config_is_named(good, tmp_path):
    config, weights = good
    refused(write(tmp_path / "config", config | {"vocab_size": 50}, weights),
            "model.embed_tokens.weight", "[48, 32]", "[50, 32]")
    name = "model.layers.1.mlp.gate_proj.weight"
    refused(write(tmp_path / "weight", config, weights | {name: torch.zeros(60, 32)}),
            name, "[60, 32]", "[64, 32]")


@pytest.mark.parametrize("field, value", [
    ("num_attention_heads", 0), ("num_attention_heads", -4), ("hidden_size", 0),
    ("num_key_value_heads", 0), ("vocab_size", 1.5), ("num_hidden_layers", True), ("head_dim", 0),
    ("max_position_embeddings", 0), ("intermediate_size", None),
])
def test_non_positive_sizes_are_named(good, tmp_path, field, value):
    config, weights = good
    refused(write(tmp_path, config | {field: value}, weights), field, "integer >= 1")


@pytest.mark.parametrize("changes, field", [
    ({"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": None}, "hidden_size"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": 7}, "head_dim"),
    ({"rope_theta": 0.0}, "rope_theta"),
])
def test_inconsistent_sizes_are_named(good, tmp_path, changes, field):
    config, weights = good
    config = {k: v for k, v in (config | changes).items() if v is not None}
    refused(write(tmp_path, config, weights), field)


def test_missing_and_extra_tensors_are_named(good, tmp_path):
    config, weights = good
    name = "model.layers.1.self_attn.k_proj.weight"
    refused(write(tmp_path / "missing", config, {k: v for k, v in weights.items() if k != name}),
            "lacks 1 tensor", name)
    extra = weights | {"model.layers.2.mlp.up_proj.weight": torch.zeros(64, 32)}
    refused(write(tmp_path / "extra", config, extra), "model.layers.2.mlp.up_proj.weight")
    refused(write(tmp_path / "layers", config | {"num_hidden_layers": 10**9}, weights),
            "num_hidden_layers")


def test_a_giant_max_position_embeddings_is_refused_before_allocating(good, tmp_path, monkeypatch):
    def no_tables(config):
        raise AssertionError("RoPE tables computed before the config was checked")

    def nothing_built(*args, **kwargs):
        raise AssertionError("the model was built or its weights read before the config check")

    monkeypatch.setattr("minispec.loading.loader.rope_tables", no_tables)
    for step in ("read_headers", "checked_meta_model", "read_weights_file"):
        monkeypatch.setattr(f"minispec.loading.loader.{step}", nothing_built)
    config, weights = good
    refused(write(tmp_path, config | {"max_position_embeddings": 2**40}, weights),
            "max_position_embeddings", str(MAX_POSITIONS))


def sharded(directory, config, weights, index):
    """Write the weights as one shard ``w.safetensors`` plus ``index`` as the index file."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "w.safetensors"))
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def test_an_index_without_weight_map_is_refused(good, tmp_path):
    config, weights = good
    refused(sharded(tmp_path, config, weights, {"metadata": {}}), "weight_map")


def test_a_shard_outside_the_checkpoint_folder_is_refused(good, tmp_path):
    config, weights = good
    write(tmp_path / "elsewhere", config, weights)      # a loadable file, just not in the folder
    (tmp_path / "elsewhere" / "model.safetensors").rename(tmp_path / "elsewhere" / "w.safetensors")
    for shard in ("../elsewhere/w.safetensors", str(tmp_path / "elsewhere" / "w.safetensors")):
        index = {"weight_map": {name: shard for name in weights}}
        refused(sharded(tmp_path / "ckpt", config, {}, index), "outside the checkpoint folder",
                repr(shard))
    index = {"weight_map": {name: "w.safetensors" for name in weights}}
    load(sharded(tmp_path / "ok", config, weights, index))       # the same index, inside: loads


def test_an_unknown_device_is_named(good, tmp_path):
    refused(write(tmp_path, *good), "device", "nonsense", device="nonsense")


def test_the_cli_prints_one_line_instead_of_a_traceback(good, tmp_path, capsys):
    config, weights = good
    path = write(tmp_path, config | {"num_attention_heads": 0}, weights)
    assert cli.main(["generate", "hello", "--target", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "num_attention_heads" in err and "Traceback" not in err


def test_train_eagle_never_unpickles_objects(tmp_path, monkeypatch):
    source = open(train_eagle.__file__).read()
    calls = re.findall(r"torch\.load\(([^)]*)\)", source)
    assert calls and all("weights_only=True" in call for call in calls)
    chunk = train_eagle.eagle_data.Chunk("answers", torch.arange(4), torch.zeros(4, 2),
                                         torch.ones(4))
    built = {"train": [chunk], "heldout": [chunk], "prompts": 1}
    monkeypatch.setattr(train_eagle, "build_data", lambda target, tokenizer, args: built)
    monkeypatch.setattr(train_eagle.packed, "make_fast", lambda model: model)
    monkeypatch.setattr(train_eagle.packed, "make_eager", lambda model: model)
    args = argparse.Namespace(out=tmp_path)
    assert train_eagle.cached_data(None, None, args) is built
    cached = train_eagle.cached_data(None, None, args)     # from data.pt, weights_only=True
    assert cached["prompts"] == 1 and torch.equal(cached["train"][0].tokens, chunk.tokens)


# ---------------------------------------------------------------------------- finding 6: arguments


def test_a_tree_too_large_is_refused_naming_branching(model):
    assert MAX_TREE_NODES == 1024
    for branching in [(3000,), (32, 32), (2,) * 10]:
        with pytest.raises(ValueError, match="branching"):
            check_branching(branching, len(branching))
    assert check_branching((2,) * 10, 9) == (2,) * 9          # 1023 nodes: allowed
    with pytest.raises(ValueError, match="branching"):
        ms.speculative_generate(model, noisy_copy(model, 0.05), [1, 2, 3], 4, k=2,
                                branching=(3000,))


@pytest.mark.parametrize("kwargs, match", [
    ({"adaptive": 1}, "adaptive must be True, False or None"),
    ({"adaptive": "yes"}, "adaptive must be True, False or None"),
    ({"adaptive": True, "drafter": None}, "needs a drafter"),
    ({"adaptive": True, "branching": (2, 1)}, "no branching"),
])
def test_adaptive_k_refuses_what_it_cannot_plan(model, kwargs, match):
    args = {"drafter": noisy_copy(model, 0.05)} | kwargs
    forwards = []
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            ms.speculative_generate(model, args.pop("drafter"), [1, 2, 3], 4, k=2, **args)
    finally:
        hook.remove()
    assert not forwards                                # refused before the prefill


def test_a_single_stop_token_id_is_accepted(model):
    args = dict(max_new_tokens=4, max_seq_len=32, vocab_size=VOCAB)
    seq = Sequence.new("r", [1, 2], None, stop_token_ids=5, eos_token_ids=7, **args)
    assert seq.stop_token_ids == {5} and seq.eos_token_ids == {7}
    with pytest.raises(ValueError, match="stop_token_ids"):
        Sequence.new("r", [1, 2], None, stop_token_ids=5.0, **args)
    reference = ms.generate(model, [1, 2, 3], 12)
    stop = reference.tokens[5]
    out = ms.generate(model, [1, 2, 3], 12, stop_token_ids=stop)
    assert out.finish_reason == "stop"
    assert out.tokens == ms.generate(model, [1, 2, 3], 12, stop_token_ids=[stop]).tokens


@pytest.mark.parametrize("command", [["bench"], ["bench", "costs"]])
@pytest.mark.parametrize("value", ["-1", "two"])
def test_bench_threads_must_be_a_count(command, value, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([*command, "--threads", value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--threads" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- finding 6: the engine


class BadDrafter(ms.Drafter):
    """A user's drafter that proposes ``ids`` (of ``dtype``) for one prompt only."""

    def __init__(self, ids, dtype=torch.long, victim=VOCAB - 1):
        self.ids, self.dtype, self.victim = ids, dtype, victim

    def propose(self, seqs, shapes):
        return [self.chain(seq.context, k) for seq, k in zip(seqs, shapes, strict=True)]

    def chain(self, context, k):
        if self.victim in context:
            return ms.Proposal.chain(torch.tensor(self.ids, dtype=self.dtype)[:k])
        return ms.Proposal.chain([context[-1]] * k)


@pytest.mark.parametrize("ids, dtype", [([VOCAB], torch.long), ([-1], torch.long),
                                        ([1.5], torch.float32)])
def test_a_drafter_proposing_nonsense_fails_its_request_alone(model, ids, dtype):
    engine = ms.Engine(model, drafter=BadDrafter(ids, dtype), k=2, max_batch_size=4,
                       adaptive=False)   # drafts from the first step
    bad, good = [1, VOCAB - 1, 2], [[3, 4], [5, 6, 7]]
    outs = engine.generate([bad, *good], max_new_tokens=6, progress=False)
    assert outs[0].finish_reason == "error" and "drafter proposed" in outs[0].error
    for prompt, out in zip(good, outs[1:], strict=True):
        assert out.tokens == ms.generate(model, prompt, 6).tokens
    with pytest.raises(ValueError, match="drafter proposed"):
        ms.speculative_generate(model, BadDrafter(ids, dtype), bad, 6, k=2)


class BadQDrafter(BadDrafter):
    """Proposes a valid token with a ``q`` row that is not a distribution over the target's
    vocabulary (``width`` entries, filled with ``value``) for one prompt only."""

    def __init__(self, width, value):
        super().__init__([0])
        self.width, self.value = width, value

    def chain(self, context, k):
        proposal = super().chain(context, k)
        if self.victim in context:               # one draft, its q given as is (not checked)
            proposal = ms.Proposal.chain(proposal.tree.tokens[1:2])
            proposal.draws[0] = [(1, torch.full((self.width,), self.value))]
        return proposal


@pytest.mark.parametrize("width, value, match", [(VOCAB, float("nan"), "NaN"),
                                                 (VOCAB + 1, 1 / (VOCAB + 1), r"\[V\]")])
def test_a_drafter_with_a_broken_q_fails_its_request_alone(model, width, value, match):
    """A sampled row's q is checked where it enters the round (``Proposal.chain``) and against the
    target's vocabulary in the walk; either failure ends that request alone."""
    engine = ms.Engine(model, drafter=BadQDrafter(width, value), k=2, max_batch_size=4,
                       adaptive=False)
    sampled = ms.SamplingParams(temperature=1.0, seed=3)
    bad, good = [1, VOCAB - 1, 2], [[3, 4], [5, 6, 7]]
    outs = engine.generate([bad, *good], max_new_tokens=6, progress=False, sampling=sampled)
    assert outs[0].finish_reason == "error" and re.search(match, outs[0].error)
    for prompt, out in zip(good, outs[1:], strict=True):
        alone = ms.Engine(model, drafter=BadQDrafter(width, value), k=2, adaptive=False)
        assert out.tokens == alone.generate([prompt], max_new_tokens=6, progress=False,
                                            sampling=sampled)[0].tokens


def test_engine_options_that_would_be_ignored_are_refused(model):
    with pytest.raises(ValueError, match="needs a drafter"):
        ms.Engine(model, adaptive=True)
    with pytest.raises(ValueError, match="num_blocks"):
        ms.Engine(model, kv_cache="contiguous", num_blocks=8)
    with pytest.raises(ValueError, match="branching"):
        ms.Engine(model, drafter="ngram", adaptive=True, branching=(2, 1))
    with pytest.raises(ValueError, match="list of prompts"):
        ms.Engine(model).generate("ROMEO", progress=False)
