"""The EAGLE head's recipe (``python -m minispec.tools.train_eagle``) end to end, on the tiny
shipped target and a toy corpus: data, vocabulary, training, checkpoint, resume, files a drafter
loads.

The real run (SmolLM2-135M-Instruct, an hour of CPU) is not repeated here; its facts are in the
shipped head's ``eagle_config.json`` and model card.
"""

from __future__ import annotations

import json

import pytest
import torch

import minispec as ms
from minispec.extra_drafters.eagle_head import EagleHead, default_aux_layers
from minispec.tools import eagle_data, train_eagle, workloads

LINES = ["Ham.\nTo be, or not to be, that is the question:\n",
         "King.\nHow fares our cousin Hamlet?\n\n"]


@pytest.fixture
def toy_corpus(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for w, name in enumerate(("alpha_gut.txt", "beta_gut.txt")):
        (folder / name).write_text("".join(LINES[(i + w) % 2] for i in range(40)))
    return folder


def tiny_args(out, corpus) -> list[str]:
    return ["--target", "shakespeare-target", "--out", str(out), "--corpus", str(corpus),
            "--prompts", "3", "--answer-tokens", "12", "--prose-chars", "3000",
            "--code-chars", "3000", "--chunk", "64", "--batch", "2", "--eval-every", "2",
            "--threads", "1", "--coverage", "0.9", "--eval-tokens", "12"]


def test_recipe_runs_end_to_end_and_resumes(toy_corpus, tmp_path, one_thread):
    out = tmp_path / "run"
    head_dir = train_eagle.main([*tiny_args(out, toy_corpus), "--steps", "4"])
    facts = json.loads((out / "training.json").read_text())
    assert facts["training"]["steps"] == 4
    assert [row["step"] for row in facts["training"]["curve"]] == [2, 4]
    assert all(0 <= row["heldout_top1"] <= 1 and row["loss"] > 0
               for row in facts["training"]["curve"])
    assert set(facts["data"]["tokens_by_source"]) == {"answers", "shakespeare", "code"}
    size = facts["draft_vocab"]["size"]
    assert 0 < size < 4096          # the tiny target's vocabulary: V' is a strict subset
    card = (head_dir / "MODEL_CARD.md").read_text()
    assert card.startswith("# shakespeare-target-eagle") and f"vocabulary of {size} tokens" in card
    evaluation = json.loads((head_dir / "eagle_config.json").read_text())["evaluation"]
    assert set(evaluation["by_task"]) == set(workloads.TASKS)
    assert all(0 <= row["eagle"]["alpha"] <= 1 for row in evaluation["by_task"].values())

    target, tok = ms.load("shakespeare-target")
    drafter = ms.load_drafter(head_dir, target)
    assert drafter.model.draft_vocab_size == size
    prompt = tok.encode("ROMEO:")
    out_spec = ms.speculative_generate(target, drafter, prompt, 24, k=3)
    assert out_spec.tokens == ms.generate(target, prompt, 24).tokens

    # a checkpoint is written every two minutes; force one, then resume from it
    train_eagle.CHECKPOINT_EVERY_S, saved = 0, train_eagle.CHECKPOINT_EVERY_S
    try:
        train_eagle.main([*tiny_args(out, toy_corpus), "--steps", "6"])
        train_eagle.main([*tiny_args(out, toy_corpus), "--steps", "8", "--resume",
                          "--answer-weight", "0.5"])
    finally:
        train_eagle.CHECKPOINT_EVERY_S = saved
    facts = json.loads((out / "training.json").read_text())
    assert facts["training"]["steps"] == 8 and facts["training"]["curve"][0]["step"] == 2
    sessions = facts["training"]["sessions"]
    assert sessions[0].startswith("steps 0-6") and sessions[1].startswith("steps 6-8")
    assert "answer weight 0.5" in sessions[1]
    assert "heldout_answers_top1" in facts["training"]["curve"][-1]



def test_the_eagle1_recipe_trains_a_head_vllm_and_sglang_load(toy_corpus, tmp_path, one_thread):
    """``--layout eagle1``: the full vocabulary, a head that drafts exactly, and files that
    ``minispec.tools.export`` turns into their checkpoint (tests/test_export.py checks that
    layout)."""
    from minispec.tools import export

    head_dir = train_eagle.main([*tiny_args(tmp_path / "run", toy_corpus), "--steps", "2",
                                 "--layout", "eagle1"])
    saved = json.loads((head_dir / "eagle_config.json").read_text())
    assert saved["layout"] == "eagle1"
    assert saved["draft_vocab_size"] == saved["target_config"]["vocab_size"]      # the full one
    target, tok = ms.load("shakespeare-target")
    drafter = ms.load_drafter(head_dir, target)
    assert drafter.model.layout == "eagle1" and drafter.model.fc.bias is None
    prompt = tok.encode("ROMEO:")
    out = ms.speculative_generate(target, drafter, prompt, 16, k=3)
    assert out.tokens == ms.generate(target, prompt, 16).tokens
    exported = export.export_head(head_dir, tmp_path / "vllm")
    assert (exported / "model.safetensors").is_file() and (exported / "config.json").is_file()

def test_vocabulary_covers_what_it_claims():
    chunks = [eagle_data.Chunk("x", torch.zeros(10, dtype=torch.long), torch.zeros(10, 4),
                               torch.tensor([5, 5, 5, 5, 5, 5, 3, 3, 3, 9]))]
    vocab, curve = eagle_data.choose_vocab(chunks, coverage=0.85, vocab_size=64)
    assert vocab.tolist() == [3, 5]                     # 60 % + 30 % >= 85 %
    vocab, _ = eagle_data.choose_vocab(chunks, coverage=0.95, vocab_size=64)
    assert vocab.tolist() == [3, 5, 9]
    assert curve == [(64, 1.0)]


def test_prompt_set_is_ours_and_disjoint_from_the_evaluation_tasks():
    from minispec.tools import workloads

    prompts = eagle_data.build_prompts(seed=0)
    texts = {p[-1]["content"] for p in prompts}
    assert len(prompts) == len(texts) >= 200
    for task in workloads.TASKS.values():
        assert task[-1]["content"] not in texts
    for name in ("HumanEval", "GSM8K", "MT-bench"):
        assert not any(name.lower() in t.lower() for t in texts)


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_eagle.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--time-budget" in capsys.readouterr().out


def test_the_eagle3_recipe_trains_a_head_that_fuses_three_layers(toy_corpus, tmp_path, one_thread):
    """``--layout eagle3``: the data keep the target's three layers, the head (EAGLE-3's layout)
    fuses them, trains unrolled 3 passes with the KL term, the saved head reloads and drafts
    exactly; the export (tests/test_export_eagle3.py) refuses the tiny target's default layers,
    which name one layer twice (``benchmarks/eagle3_gpu.sh``'s dry run trains and exports three
    distinct ones)."""
    from minispec.tools import export

    head_dir = train_eagle.main([*tiny_args(tmp_path / "run", toy_corpus), "--steps", "2",
                                 "--layout", "eagle3"])
    saved = json.loads((head_dir / "eagle_config.json").read_text())
    assert saved["layout"] == "eagle3"
    target, tok = ms.load("shakespeare-target")
    layers = default_aux_layers(target.config.num_hidden_layers)
    assert tuple(saved["aux_layers"]) == layers
    facts = saved["training"]
    assert facts["name"].endswith("-eagle3") and facts["args"]["unroll"] == "3"
    assert facts["args"]["w_kl"] == "1.0"
    assert len(facts["training"]["heldout_top1_by_position"]) == 4
    assert "KL(p || q)" in (head_dir / "MODEL_CARD.md").read_text()
    drafter = ms.load_drafter(head_dir, target)
    assert drafter.feature_layers == layers and drafter.model.lm_head is not None
    prompt = tok.encode("ROMEO:")
    for branching in (None, (2, 2, 1)):
        out = ms.speculative_generate(target, drafter, prompt, 16, k=3, branching=branching)
        assert out.tokens == ms.generate(target, prompt, 16).tokens
    with pytest.raises(ValueError, match="three distinct"):   # the tiny target's (2, 3, 3)
        export.export_head(head_dir, tmp_path / "vllm")


@pytest.mark.parametrize("layout", ["minispec", "eagle3"])
def test_the_eagle3_loss_decreases_on_a_fixed_batch(one_thread, layout):
    """A few AdamW steps of ``head_loss`` (3 passes, the KL term) on one batch of a tiny random
    target's three-layer features lower it, for the minispec layout fusing three layers and for
    EAGLE-3's (no feature term; its LM head stays frozen)."""
    from tinymodels import tiny_llama

    torch.manual_seed(0)
    target = tiny_llama(layers=4).requires_grad_(False)
    layers = default_aux_layers(4)
    seqs = [("answers", torch.randint(0, 48, (40,)).tolist()) for _ in range(4)]
    chunks = eagle_data.extract(target, seqs, chunk=40, progress=False, aux_layers=layers)
    assert chunks[0].aux.shape == (40, 3 * 32) and chunks[0].features.shape == (40, 32)
    head = EagleHead(target.config, layout=layout, aux_layers=layers).bind(target)
    head.init_from_target()
    frozen = None if head.lm_head is None else head.lm_head.weight.clone()
    index = train_eagle._index(head)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss, _ = train_eagle.head_loss(head, chunks, index, 3, 0.5, 0.0, w_kl=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert frozen is None or torch.equal(frozen, head.lm_head.weight)
    kl = train_eagle.kl_to_target(head, torch.randn(1, 2, 48), torch.randn(1, 2, 32))
    assert kl.shape == (1, 2) and bool((kl >= -1e-6).all())
