"""Tests for the shipped Shakespeare pair and the recipe that trains it (minispec.zoo).

The shipped models are checked on a held-out snippet committed next to these tests (validation
text of Macbeth, never seen in training). The recipe is exercised end to end on a toy corpus
written into a temporary folder, with toy shapes, so it runs in seconds and needs no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here must work without the network

from minispec import zoo  # noqa: E402

DATA = Path(__file__).parent / "data"
ZOO_FILE = Path(zoo.__file__)


# ---------------------------------------------------------------------------------------------
# The name table


def test_names_and_paths():
    assert zoo.NAMES == ("shakespeare-target", "shakespeare-draft")
    for name in zoo.NAMES:
        folder = zoo.path(name)
        assert folder.is_dir() and folder.name == name
        assert (folder / "model.safetensors").is_file()


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError) as err:
        zoo.path("shakespeare-giant")
    for name in zoo.NAMES:
        assert name in str(err.value)


def test_missing_files_give_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "_ZOO_DIR", tmp_path)
    (tmp_path / "shakespeare-draft").mkdir()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        zoo.path("shakespeare-draft")


def test_zoo_module_imports_neither_torch_nor_transformers():
    # Load minispec/zoo/__init__.py on its own in a fresh interpreter and look at sys.modules.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('zoo_probe', {str(ZOO_FILE)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# The shipped files


@pytest.fixture(scope="module")
def pair():
    """The shipped target and draft and their tokenizers, loaded by transformers offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = {}
    for name in zoo.NAMES:
        folder = str(zoo.path(name))
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        loaded[name] = (model.eval(), tok)
    return loaded


def test_shipped_configs(pair):
    for name, (model, _) in pair.items():
        cfg = model.config
        assert cfg.model_type == "llama"
        assert cfg.num_key_value_heads < cfg.num_attention_heads, "GQA expected"
        assert cfg.tie_word_embeddings
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        gen = json.loads((zoo.path(name) / "generation_config.json").read_text())
        assert gen["eos_token_id"] == cfg.eos_token_id is not None
        assert gen["bos_token_id"] == cfg.bos_token_id is not None
    target, draft = pair["shakespeare-target"][0], pair["shakespeare-draft"][0]
    n_p = sum(p.numel() for p in target.parameters())
    n_q = sum(p.numel() for p in draft.parameters())
    assert n_q < n_p / 3, "the draft should be much smaller than the target"


def test_shipped_weights_fit_the_size_budget():
    total = sum((zoo.path(n) / "model.safetensors").stat().st_size for n in zoo.NAMES)
    assert total <= 30 * 1024 * 1024


def test_pair_shares_one_tokenizer(pair):
    (target, tok_p), (draft, tok_q) = pair["shakespeare-target"], pair["shakespeare-draft"]
    assert tok_p.get_vocab() == tok_q.get_vocab()
    assert tok_p.all_special_tokens == tok_q.all_special_tokens
    assert tok_p.bos_token_id == tok_q.bos_token_id == target.config.bos_token_id
    assert tok_p.eos_token_id == tok_q.eos_token_id == draft.config.eos_token_id
    assert target.config.vocab_size == draft.config.vocab_size == len(tok_p)
    text = "MACBETH.\nIs this a dagger which I see before me?"
    ids = tok_p(text)["input_ids"]
    assert ids == tok_q(text)["input_ids"] and ids[0] == tok_p.bos_token_id
    assert tok_p.decode(ids, skip_special_tokens=True) == text  # byte-level: exact round trip


def test_heldout_quality_bars(pair):
    from minispec.tools.evaluate import ALPHA_RANGE, pair_metrics

    (target, tok), (draft, _) = pair["shakespeare-target"], pair["shakespeare-draft"]
    text = (DATA / "heldout_snippet.txt").read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert 200 <= len(ids) <= 2000
    m = pair_metrics(target, draft, ids)
    assert m["loss_p"] < m["loss_q"], m
    assert ALPHA_RANGE[0] <= m["alpha"] <= ALPHA_RANGE[1], m
    # Consistency of the measures themselves: 0 <= greedy agreement, alpha <= 1, KL >= 0.
    assert 0.0 <= m["greedy_agreement"] <= 1.0 and m["kl_pq"] >= 0.0


def test_alpha_is_one_for_a_model_against_itself(pair):
    from minispec.tools.evaluate import pair_metrics

    draft, tok = pair["shakespeare-draft"]
    ids = tok("Ham.\nTo be, or not to be, that is the question:", add_special_tokens=False)
    m = pair_metrics(draft, draft, ids["input_ids"])
    assert m["alpha"] == pytest.approx(1.0, abs=1e-5)
    assert m["greedy_agreement"] == 1.0 and m["kl_pq"] == pytest.approx(0.0, abs=1e-5)


def test_shipped_target_generates(pair):
    import torch

    target, tok = pair["shakespeare-target"]
    enc = tok("Ham.\n", return_tensors="pt")
    with torch.no_grad():
        out = target.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == enc["input_ids"].shape[1] + 8 or tok.eos_token_id in out[0].tolist()


# ---------------------------------------------------------------------------------------------
# The recipe, on a toy corpus


LINES = [
    "Ham.\nTo be, or not to be, that is the question:\n",
    "Hor.\nWhat think you on't, my good lord? I know not.\n\n",
    "[Enter King, Queen, and Attendants.]\n\n",
    "King.\nHow fares our cousin Hamlet?\n\n",
]


@pytest.fixture
def toy_corpus(tmp_path) -> Path:
    """Three tiny 'works' and one folio variant that the corpus step must skip."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for w, name in enumerate(("alpha_gut.txt", "beta_gut.txt", "gamma_gut.txt", "alpha_gut_f.txt")):
        (folder / name).write_text("".join(LINES[(i + w) % 4] for i in range(50)))
    return folder


def test_holdout_split_takes_the_tail_at_a_line_start():
    from minispec.tools.data import split_holdout

    text = "".join(f"line {i}\n" for i in range(200))
    train, val = split_holdout(text, 0.05)
    assert train + val == text
    assert val.startswith("line ") and train.endswith("\n")
    assert 0.03 < len(val) / len(text) < 0.07


def test_corpus_step_reads_a_local_folder(toy_corpus, tmp_path):
    from minispec.tools.data import load_corpus

    corpus = load_corpus(toy_corpus, tmp_path / "cache")
    assert corpus.names == ["alpha_gut.txt", "beta_gut.txt", "gamma_gut.txt"]  # no _f variant
    assert all(v and t.endswith("\n") for t, v in zip(corpus.train, corpus.val, strict=True))
    assert load_corpus(toy_corpus, tmp_path / "cache").sha256 == corpus.sha256
    (toy_corpus / "beta_gut.txt").write_text("changed\n" * 40)
    assert load_corpus(toy_corpus, tmp_path / "cache").sha256 != corpus.sha256


def test_recipe_runs_end_to_end_on_a_toy_corpus(toy_corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minispec.tools import train

    out = tmp_path / "run"
    common = ["--out", str(out), "--corpus", str(toy_corpus), "--tiny", "--vocab-size", "300",
              "--context", "32", "--batch-size", "2", "--threads", "1"]
    train.main([*common, "--steps", "2"])  # data, target, draft, label-draft, evaluate
    for kind in ("target", "draft", "label-draft"):
        model = AutoModelForCausalLM.from_pretrained(str(out / kind), local_files_only=True)
        tok = AutoTokenizer.from_pretrained(str(out / kind), local_files_only=True)
        assert model.config.vocab_size == len(tok) == 300
        assert json.loads((out / kind / "training.json").read_text())["steps"] == 2
    card = json.loads((out / "model_card.json").read_text())
    assert set(card["pairs"]) == {"draft", "label-draft"}
    assert "alpha" in card["pairs"]["draft"] and (out / "MODEL_CARD.md").is_file()
    # Resume: continue the target from its checkpoint to a longer schedule.
    train.main([*common, "--stage", "target", "--steps", "3", "--resume"])
    assert json.loads((out / "target" / "training.json").read_text())["steps"] == 3


def test_recipe_help(capsys):
    from minispec.tools import train

    with pytest.raises(SystemExit) as done:
        train.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--out", "--time-budget", "--resume", "--corpus", "--steps"):
        assert flag in text
