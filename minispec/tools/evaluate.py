"""Quality bars for the shipped pair, measured on held-out text, and the model card.

Notation: ``p`` is the target's next-token distribution, ``q`` the draft's, both at temperature 1
unless said otherwise. At every held-out position we measure

* the loss of each model, ``-log p(y)`` and ``-log q(y)`` (nats/token);
* ``beta = sum_v min(p(v), q(v))``, the chance that speculative sampling accepts the draft's token;
  its mean over positions is ``alpha`` (Leviathan et al., Definition 3.1);
* greedy agreement, ``argmax p == argmax q`` (the acceptance rate of greedy speculative decoding);
* ``KL(p || q) = sum_v p(v) (log p(v) - log q(v))``, the quantity the distilled draft minimised.

The bars the shipped pair must clear: the target's loss is lower than the draft's by at least
``MIN_LOSS_GAP`` nats/token, and ``alpha`` lies in ``ALPHA_RANGE`` -- high enough that speculation
pays, low enough that rejections (and the residual distribution) show up in the lessons.

Usage::

    python -m minispec.tools.evaluate --run runs/zoo           # card into the run folder
    python -m minispec.tools.evaluate --run runs/zoo --ship    # copy the pair into minispec/zoo/
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import shutil
from pathlib import Path

from minispec import zoo

MIN_LOSS_GAP = 0.25
ALPHA_RANGE = (0.60, 0.85)
ZOO_DIR = Path(zoo.__file__).resolve().parent
PROMPTS = ("Ham.\nTo be, or not to be", "SCENE II. A street.\n\n[Enter", "When forty winters shall")
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "training.json")


def pair_metrics(target, draft, ids, context: int = 256, temperature: float = 1.0,
                 batch_size: int = 8, extra_alpha_temperatures: tuple[float, ...] = ()) -> dict:
    """Compare target ``p`` and draft ``q`` at every position of the token list ``ids``.

    ``ids`` is cut into consecutive windows of ``context + 1`` tokens (the last window may be
    shorter); each window predicts its own tokens 2.. from the ones before, starting fresh.
    Losses are always at temperature 1; alpha, greedy agreement and KL use ``temperature``.
    For each T in ``extra_alpha_temperatures`` the result also holds ``alpha_T{T}``, measured in
    the same pass (both models sharpened or flattened by the same T, as speculative sampling does).
    """
    import torch
    import torch.nn.functional as F

    ids = torch.as_tensor(ids, dtype=torch.long)
    windows = [ids[i: i + context + 1] for i in range(0, len(ids) - 1, context)]
    windows = [w for w in windows if len(w) >= 2]
    sums = {"loss_p": 0.0, "loss_q": 0.0, "alpha": 0.0, "greedy_agreement": 0.0, "kl_pq": 0.0}
    sums |= {f"alpha_T{t}": 0.0 for t in extra_alpha_temperatures}
    positions = 0
    target.eval()
    draft.eval()
    with torch.no_grad():
        for first in range(0, len(windows), batch_size):
            group = windows[first: first + batch_size]
            same = all(len(w) == len(group[0]) for w in group)  # else one window at a time
            batches = [torch.stack(group)] if same else [w[None] for w in group]
            for rows in batches:
                x, y = rows[:, :-1], rows[:, 1:]
                log_p = F.log_softmax(target(input_ids=x).logits.float(), dim=-1)
                log_q = F.log_softmax(draft(input_ids=x).logits.float(), dim=-1)
                sums["loss_p"] += -log_p.gather(-1, y[..., None]).sum().item()
                sums["loss_q"] += -log_q.gather(-1, y[..., None]).sum().item()
                log_pt = F.log_softmax(log_p / temperature, dim=-1)
                log_qt = F.log_softmax(log_q / temperature, dim=-1)
                p, q = log_pt.exp(), log_qt.exp()
                sums["alpha"] += torch.minimum(p, q).sum(-1).sum().item()
                sums["greedy_agreement"] += (p.argmax(-1) == q.argmax(-1)).sum().item()
                sums["kl_pq"] += (p * (log_pt - log_qt)).sum(-1).sum().item()
                for t in extra_alpha_temperatures:
                    p_t, q_t = F.softmax(log_p / t, dim=-1), F.softmax(log_q / t, dim=-1)
                    sums[f"alpha_T{t}"] += torch.minimum(p_t, q_t).sum(-1).sum().item()
                positions += y.numel()
    out = {k: v / positions for k, v in sums.items()}
    out["loss_gap"] = out["loss_q"] - out["loss_p"]
    out["positions"] = positions
    return out


def sample_texts(model, tok, prompts=PROMPTS, max_new_tokens: int = 48, seed: int = 0) -> list:
    """Greedy and temperature-0.8 continuations of a few prompts (transformers ``generate``)."""
    import torch

    out = []
    for prompt in prompts:
        enc = tok(prompt, return_tensors="pt")
        row = {"prompt": prompt}
        for label, kwargs in (("greedy", {"do_sample": False}),
                              ("T=0.8", {"do_sample": True, "temperature": 0.8, "top_k": 0})):
            torch.manual_seed(seed)
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, **kwargs)
            row[label] = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out.append(row)
    return out


def hardware() -> str:
    """A one-line description of the machine the numbers were measured on."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux: the CPU's marketing name is more telling than "x86_64"
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    return (f"{cpu}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}, no GPU")


def build_card(run: Path, context: int, sample_tokens: int) -> dict:
    """Measure everything the model card reports; returns the machine-readable card."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    val = load_file(str(run / "tokens.safetensors"))["val"]
    tok = AutoTokenizer.from_pretrained(str(run / "target"), trust_remote_code=False)
    models = {k: AutoModelForCausalLM.from_pretrained(str(run / k))
              for k in ("target", "draft", "label-draft") if (run / k).is_dir()}
    training = {k: json.loads((run / k / "training.json").read_text()) for k in models}
    card: dict = {"corpus": json.loads((run / "corpus.json").read_text()),
                  "hardware": hardware(), "context": context,
                  "bars": {"min_loss_gap": MIN_LOSS_GAP, "alpha_range": list(ALPHA_RANGE)},
                  "models": {}, "pairs": {}, "samples": {}}
    for name, model in models.items():
        t = training[name]
        card["models"][name] = {"params": t["params"], "shape": t["shape"],
                                "objective": t["objective"], "steps": t["steps"],
                                "train_minutes": t["minutes"], "tokens_seen": t["tokens_seen"],
                                "dtype": str(model.dtype).replace("torch.", ""),
                                "budget": {"minutes": t["settings"]["time_budget_min"],
                                           "steps": t["settings"]["max_steps"]}}
    for name in ("draft", "label-draft"):
        if name in models:
            m = pair_metrics(models["target"], models[name], val, context,
                             extra_alpha_temperatures=(0.8,))
            card["pairs"][name] = {k: round(v, 4) if isinstance(v, float) else v
                                   for k, v in m.items()}
    shipped = card["pairs"].get("draft")
    if shipped:
        card["bars"]["loss_gap_ok"] = shipped["loss_gap"] >= MIN_LOSS_GAP
        card["bars"]["alpha_ok"] = ALPHA_RANGE[0] <= shipped["alpha"] <= ALPHA_RANGE[1]
    for name in ("target", "draft"):
        if name in models:
            card["samples"][name] = sample_texts(models[name], tok, max_new_tokens=sample_tokens)
    card["total_train_minutes"] = round(sum(t["minutes"] for t in training.values()), 1)
    return card


def render_markdown(card: dict) -> str:
    """The human-readable model card."""
    c, pairs, models = card["corpus"], card["pairs"], card["models"]
    lines = [
        "# The shipped Shakespeare pair",
        "",
        "`shakespeare-target` (`p`) and `shakespeare-draft` (`q`) are tiny Llama models trained "
        "from scratch on CPU by `python -m minispec.tools.train`. They share one byte-level BPE "
        f"tokenizer (vocab {c.get('vocab_size')}, `<|bos|>` = 0, `<|eos|>` = 1). The draft is "
        "*distilled*: trained to match the target's whole next-token distribution instead of the "
        "true next token.",
        "",
        f"- **Corpus:** {c['source']}; {c['works']} works, sha256 of the texts `{c['sha256']}`.",
        f"- **Split:** the last 5 % of every work is held out: {c['train_tokens']:,} training "
        f"tokens, {c['val_tokens']:,} held-out tokens. All numbers below are on held-out text, "
        f"in windows of {card['context']} tokens.",
        f"- **Hardware:** {card['hardware']}. Total training time {card['total_train_minutes']} min"
        " (wall clock, the three models below)." + (f" {card['note']}" if card.get("note") else ""),
        "",
        "## Models",
        "",
        "| model | shape (hidden x layers, heads / KV heads, MLP) | params | objective | steps | "
        "minutes | tokens seen |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in models.items():
        s = m["shape"]
        shape = (f"{s['hidden_size']} x {s['num_hidden_layers']}, {s['num_attention_heads']} / "
                 f"{s['num_key_value_heads']}, {s['intermediate_size']}")
        shown = {"target": "shakespeare-target", "draft": "shakespeare-draft (shipped)",
                 "label-draft": "label-trained draft (not shipped)"}[name]
        lines.append(f"| {shown} | {shape} | {m['params']:,} | {m['objective']} | {m['steps']:,} "
                     f"| {m['train_minutes']} | {m['tokens_seen']:,} |")
    lines += ["", "## Quality on held-out text", "",
              "| draft q | loss p | loss q | gap | alpha (T=1) | alpha (T=0.8) | greedy agreement "
              "| KL(p‖q) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in pairs.items():
        lines.append(f"| {name} | {m['loss_p']:.3f} | {m['loss_q']:.3f} | {m['loss_gap']:.3f} | "
                     f"{m['alpha']:.3f} | {m['alpha_T0.8']:.3f} | {m['greedy_agreement']:.3f} | "
                     f"{m['kl_pq']:.3f} |")
    bars = card["bars"]
    lines += ["", f"Bars for the shipped pair: gap ≥ {bars['min_loss_gap']} nats/token "
              f"({'met' if bars.get('loss_gap_ok') else 'NOT met'}); alpha in "
              f"[{bars['alpha_range'][0]}, {bars['alpha_range'][1]}] "
              f"({'met' if bars.get('alpha_ok') else 'NOT met'}).", ""]
    if "draft" in pairs and "label-draft" in pairs:
        d, lab = pairs["draft"], pairs["label-draft"]
        better = "higher" if d["alpha"] > lab["alpha"] else "not higher"
        if d["loss_q"] > lab["loss_q"]:
            own = f"although its own loss is worse ({d['loss_q']:.3f} vs {lab['loss_q']:.3f})"
        else:
            own = (f"and, at these step counts, its own loss is lower too ({d['loss_q']:.3f} vs "
                   f"{lab['loss_q']:.3f}): a whole distribution per position carries more signal "
                   "than one true token")
        lines += [f"Distilled vs label-trained draft of the same shape: the distilled draft's "
                  f"alpha is {better} ({d['alpha']:.3f} vs {lab['alpha']:.3f}) {own}. What sets "
                  f"alpha is how closely q imitates p (KL(p‖q) {d['kl_pq']:.3f} vs "
                  f"{lab['kl_pq']:.3f}), not how well q predicts the text.", ""]
    lines += ["## How it was made", "", "```",
              "python -m minispec.tools.train --out runs/zoo --stage data"]
    for name in models:
        b = models[name]["budget"]
        limit = f"--steps {b['steps']}" if b["steps"] else f"--time-budget {b['minutes']:g}"
        lines.append(f"python -m minispec.tools.train --out runs/zoo --stage {name} {limit}")
    lines += ["python -m minispec.tools.evaluate --run runs/zoo --ship", "```", "",
              "A time budget makes the number of steps depend on the "
              "machine and its load; pass `--steps N` with the counts above for a repeatable run "
              "(the learning-rate schedule then follows steps instead of wall clock).", ""]
    lines += ["## Samples", "", "Continuations by transformers `generate` (greedy, and sampled at "
              "T = 0.8 with `torch.manual_seed(0)`). In each sample the prompt is in **bold**; the "
              "model wrote the rest. Expect play-shaped text and word salad; greedy text loops, "
              "which is where n-gram drafting shines.", ""]
    for name, rows in card["samples"].items():
        for row in rows:
            for mode in ("greedy", "T=0.8"):
                # HTML, not an indented code block, so that the prompt can be bold.
                sample = f"<b>{html.escape(row['prompt'])}</b>{html.escape(row[mode])}"
                lines += [f"**{name}, {mode}:**", "", f"<pre>{sample}</pre>", ""]
    return "\n".join(lines).rstrip() + "\n"


def ship(run: Path, card: dict) -> None:
    """Copy the target and the distilled draft into the package, with the model card."""
    for kind, name in (("target", "shakespeare-target"), ("draft", "shakespeare-draft")):
        dest = ZOO_DIR / name
        dest.mkdir(exist_ok=True)
        for f in SHIPPED_FILES:
            if (run / kind / f).exists():
                shutil.copy(run / kind / f, dest / f)
                os.chmod(dest / f, 0o644)  # safetensors writes 0600; shipped files are public
    write_card(card, ZOO_DIR)
    for name in ("shakespeare-target", "shakespeare-draft"):
        shutil.copy(ZOO_DIR / "MODEL_CARD.md", ZOO_DIR / name / "README.md")


def write_card(card: dict, folder: Path) -> None:
    """Write ``model_card.json`` and ``MODEL_CARD.md`` into ``folder``."""
    (folder / "model_card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
    (folder / "MODEL_CARD.md").write_text(render_markdown(card))


def main(argv: list[str] | None = None) -> dict:
    """Measure, write the card into the run folder, and ship the pair when asked."""
    import torch

    ap = argparse.ArgumentParser(prog="python -m minispec.tools.evaluate",
                                 description="Quality bars and model card for the Shakespeare "
                                             "pair.")
    ap.add_argument("--run", type=Path, required=True, help="run folder of minispec.tools.train")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sample-tokens", type=int, default=48)
    ap.add_argument("--ship", action="store_true", help="copy the pair into minispec/zoo/")
    ap.add_argument("--note", default="", help="a remark for the card, e.g. on machine load")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    card = build_card(args.run, args.context, args.sample_tokens)
    card["note"] = args.note
    write_card(card, args.run)
    print(json.dumps({"bars": card["bars"], "pairs": card["pairs"]}, indent=2))
    if args.ship:
        ship(args.run, card)
    return card


if __name__ == "__main__":
    main()
