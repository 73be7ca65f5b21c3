"""minispec.loading.loader: local directories (single and sharded safetensors), the hub cache,
shipped names, and the clear errors for what is not supported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minispec import zoo
from minispec.loading.loader import load


def reference_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids).logits


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        pos = torch.arange(ids.shape[1], device=model.device).expand_as(ids)
        return model(ids.to(model.device), pos)


IDS = torch.tensor([[1, 5, 9, 2, 7, 3, 3, 8]])


def test_single_file_checkpoint(tiny):
    model, tokenizer = load(tiny.path)
    assert tokenizer is None  # no tokenizer files were saved
    assert not model.training and model.dtype == torch.float32
    assert (model.lm_head is None) == tiny.hf.config.tie_word_embeddings
    torch.testing.assert_close(
        our_logits(model, IDS), reference_logits(tiny.hf, IDS), rtol=0, atol=1e-4
    )


def test_sharded_checkpoint(tiny_gqa, tmp_path):
    tiny_gqa.hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model, _ = load(str(tmp_path))
    assert torch.equal(our_logits(model, IDS), our_logits(tiny_gqa.model, IDS))


def test_pickle_only_checkpoint_is_refused(tiny_gqa, tmp_path):
    shutil.copy(tiny_gqa.path / "config.json", tmp_path / "config.json")
    torch.save(tiny_gqa.hf.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors"):
        load(tmp_path)


def test_unsupported_architecture(tiny_gqa, tmp_path):
    config = json.loads((tiny_gqa.path / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        load(tmp_path)


def test_missing_files_and_wrong_paths(tiny_gqa, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load(tmp_path)  # an empty directory
    shutil.copy(tiny_gqa.path / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load(tmp_path)
    with pytest.raises(ValueError, match="directory"):
        load(tmp_path / "config.json")


@pytest.mark.parametrize("name", ["no-such-model", "minispec-tests/not-in-any-cache"])
def test_unknown_name_or_uncached_hub_id(name):
    with pytest.raises(FileNotFoundError) as info:
        load(name)
    message = str(info.value)
    assert name in message and "local path" in message and "shakespeare-target" in message


def test_hub_id_from_the_local_cache(tiny_gqa, tmp_path, monkeypatch):
    """A hub id resolves through huggingface_hub's cache layout without any network access."""
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tiny_gqa.path, repo / "snapshots" / commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    model, _ = load("someone/tiny-llama")
    assert torch.equal(our_logits(model, IDS), our_logits(tiny_gqa.model, IDS))


def test_dtype_and_device_arguments(tiny_gqa):
    for dtype in (torch.bfloat16, "bfloat16", "torch.float16"):
        model, _ = load(tiny_gqa.path, device="cpu", dtype=dtype)
        expected = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype.split(".")[-1])
        assert model.dtype == expected and model.device == torch.device("cpu")
        assert all(p.dtype == expected for p in model.parameters())
    with pytest.raises(ValueError, match="floating-point"):
        load(tiny_gqa.path, dtype="int8")


def test_default_dtype_is_float32_on_cpu(hf_model_factory, tmp_path):
    hf = hf_model_factory("mha-untied").to(torch.bfloat16)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    model, _ = load(tmp_path)
    assert model.dtype == torch.float32
    want = hf.lm_head.weight.float()  # bf16 values, exactly representable in fp32
    assert torch.equal(model.lm_head.weight, want)


def test_tokenizer_is_loaded_when_present(tiny_gqa, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "to": 3, "be": 4, "or": 5, "not": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    shutil.copytree(tiny_gqa.path, tmp_path, dirs_exist_ok=True)
    tokenizer.save_pretrained(tmp_path)
    _, loaded = load(tmp_path)
    assert loaded is not None
    assert loaded("to be or not to be")["input_ids"] == [3, 4, 5, 6, 3, 4]


@pytest.mark.parametrize("name", zoo.NAMES)
def test_shipped_models_load(name):
    try:
        directory = Path(zoo.path(name))
    except FileNotFoundError:
        pytest.skip(f"shipped model {name!r} is not built in this checkout")
    model, tokenizer = load(name)
    config = json.loads((directory / "config.json").read_text())
    assert model.config.hidden_size == config["hidden_size"]
    assert tokenizer is not None
    ids = tokenizer("To be, or not to be", return_tensors="pt")["input_ids"]
    logits = our_logits(model, ids)
    assert logits.shape == (1, ids.shape[1], config["vocab_size"])
    assert torch.isfinite(logits).all()


def test_missing_shipped_files_give_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(zoo, "_ZOO_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="shakespeare-draft"):
        load("shakespeare-draft")


# ---------------------------------------------- broken checkpoints name the file (issue 10, item 7)


def _copy_checkpoint(tiny_gqa, tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_gqa.path, directory)
    return directory


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors_names_the_file(tiny_gqa, tmp_path, damage):
    directory = _copy_checkpoint(tiny_gqa, tmp_path)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x07" * 4096,
                         "empty": b""}[damage])
    with pytest.raises(ValueError, match="truncated or corrupt") as info:
        load(directory)
    assert str(weights) in str(info.value)


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "num_hidden_layers"])
def test_config_without_a_required_key_names_key_and_file(tiny_gqa, tmp_path, key):
    directory = _copy_checkpoint(tiny_gqa, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config[key]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=repr(key)) as info:
        load(directory)
    assert str(directory / "config.json") in str(info.value)


def test_config_that_is_not_json_names_the_file(tiny_gqa, tmp_path):
    directory = _copy_checkpoint(tiny_gqa, tmp_path)
    (directory / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON") as info:
        load(directory)
    assert "config.json" in str(info.value)


# ------------------------------------------------------------------- hub ids: download when online


class FakeHub:
    """Stands in for huggingface_hub.snapshot_download: nothing cached, downloads give ``path``."""

    def __init__(self, path: Path):
        self.path, self.calls = path, []

    def __call__(self, repo_id, allow_patterns=None, local_files_only=False, **kwargs):
        self.calls.append({"repo_id": repo_id, "allow_patterns": allow_patterns,
                           "local_files_only": local_files_only})
        if local_files_only:
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("not in the cache")
        return str(self.path)


@pytest.fixture
def fake_hub(tiny_gqa, monkeypatch):
    import huggingface_hub

    hub = FakeHub(tiny_gqa.path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return hub


def test_uncached_hub_id_is_downloaded_safetensors_only(fake_hub, tiny_gqa):
    model, _ = load("someone/tiny-llama")
    assert torch.equal(our_logits(model, IDS), our_logits(tiny_gqa.model, IDS))
    assert [c["local_files_only"] for c in fake_hub.calls] == [True, False]
    patterns = fake_hub.calls[-1]["allow_patterns"]
    assert ("*.safetensors" in patterns and "config.json" in patterns
            and "tokenizer.json" in patterns)
    assert not any(p.endswith((".bin", ".pt", ".pth", ".ckpt")) for p in patterns)


def test_local_files_only_never_downloads(fake_hub):
    with pytest.raises(FileNotFoundError, match="local_files_only=True") as info:
        load("someone/tiny-llama", local_files_only=True)
    assert "local path" in str(info.value)
    assert [c["local_files_only"] for c in fake_hub.calls] == [True]


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_hf_hub_offline_never_downloads(fake_hub, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        load("someone/tiny-llama")
    assert [c["local_files_only"] for c in fake_hub.calls] == [True]


def test_failed_download_is_a_clear_error(tiny_gqa, monkeypatch):
    import huggingface_hub

    def unreachable(repo_id, allow_patterns=None, local_files_only=False, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(FileNotFoundError, match="download failed.*hub unreachable"):
        load("someone/tiny-llama")
