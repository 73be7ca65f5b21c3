"""SmolLM2-135M-Instruct on a CUDA GPU: the static step with and without CUDA graphs, the record.

Writes ``minispec/tools/measured/gpu.json`` (``--record``), the one GPU record the results page
and the lessons render (read by ``minispec.tools.records``). Run on a machine with a CUDA device
(CI has none; ``benchmarks/gpu_session.sh`` is the whole device run)::

    python benchmarks/gpu.py --record minispec/tools/measured/gpu.json \
        --commit "$(git rev-parse HEAD)"

``--device cpu --model shakespeare-target`` runs every section on the CPU with the shipped tiny
model (graphs are CUDA-only, so "on" and "off" time the static step and the dynamic path there):
that is how the script is timed and checked before a GPU run.

Sections, each by the wall clock after ``torch.cuda.synchronize()``, each saved as soon as it
ends (a run stopped early keeps what it measured; an exception is recorded, the next one runs):

1. ``costs``    -- one step of ``T`` new tokens at 300 cached tokens, batch 1..64: ``step_ms``
   (T = 1) and ``r`` (``r(k) = t(k + 1) / t(1)`` at batch 1), graphs on and off, beside the
   memory roofline (weight bytes over the copy bandwidth measured here);
2. ``speedups`` -- batch 1 on the multi-task prompt set: each method's time over plain greedy's,
   graphs on (and ``speedup_b1_eager`` off), every output checked against plain greedy; with a
   shipped head, its chain, the hybrid and its dynamic tree (EAGLE-2: up to 32 nodes, as many as
   pay for the ``r(T)`` measured here first);
3. ``engine``   -- the continuous-batching engine at B = 1..64: the plain engine's tokens/s
   (graphs on and off), transformers' ``generate`` with its static cache on the same GPU, and the
   default engine (goodput k, n-gram drafts) over the plain one;
4. ``bf16``     -- the same model in bfloat16: the fraction of speculative tokens identical to
   plain greedy's (a verify of k + 1 rows and a one-row step round differently).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from itertools import accumulate
from pathlib import Path

import torch

import minispec as ms
from minispec.speed.static_step import BATCH_BUCKETS, StaticForward
from minispec.tools import records
from minispec.tools.workloads import multitask

MODEL = "smollm2-135m-instruct"


def now() -> float:
    """Seconds on the wall clock once the device's queued work has finished."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def copy_bandwidth(device: str, gib: float = 1.0) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    x = torch.empty(int(gib * 2**30) // 4, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = now()
    for _ in range(5):
        y.copy_(x)
    return 2 * x.numel() * 4 * 5 / (now() - t0)


def task_prompts(tokenizer, per_category: int) -> list:
    """The multi-task set's first ``per_category`` prompts of each category: chat messages, or
    their text's start for a tokenizer without a chat template (the shipped tiny model's, whose
    context is 512 tokens)."""
    chat = getattr(tokenizer, "chat_template", None) is not None
    return [m if chat else m[-1]["content"][:600] for ps in multitask().values()
            for m in ps[:per_category]]


def step_time(target, batch: int, tokens: int, graphs: bool, context: int = 300,
              repeats: int = 10) -> float:
    """Median seconds of one forward of ``tokens`` new tokens a row at ``context`` cached ones,
    through the static step (``graphs``: captured on CUDA) or the dynamic path."""
    cache = ms.PagedKVCache.for_model(target, num_slots=batch, max_seq_len=context + 2 * repeats
                                      * tokens + 64, block_size=16)
    slots = [cache.allocate() for _ in range(batch)]
    static = StaticForward(target, cache, graphs=True) if graphs else None
    device = target.device
    samples, n = [], context
    with torch.inference_mode():
        ids = torch.randint(0, 1000, (batch, context), device=device)
        target(ids, torch.arange(context, device=device)[None].expand(batch, -1), cache, slots)
        for i in range(repeats + 3):
            x = torch.randint(0, 1000, (batch, tokens), device=device)
            pos = torch.arange(n, n + tokens, device=device)[None].expand(batch, -1)
            t0 = now()
            if static is not None:
                static(x, pos, slots)
            else:
                target(x, pos, cache, slots)
            if i >= 3:                                     # the first three warm up (capture)
                samples.append(now() - t0)
            n += tokens
    return sorted(samples)[len(samples) // 2]


def costs(target, batch_sizes: list[int], max_k: int) -> dict:
    """``step_ms`` by batch size and ``r`` by k, graphs on and off, and the roofline."""
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    bandwidth = copy_bandwidth(target.device.type)
    out = {"weight_bytes": weight_bytes, "copy_bandwidth_GBps": bandwidth / 1e9,
           "roofline_ms": 1e3 * weight_bytes / bandwidth}
    for suffix, graphs in (("", True), ("_eager", False)):
        one = {b: step_time(target, b, 1, graphs) for b in batch_sizes}
        out["step_ms" + suffix] = {b: 1e3 * t for b, t in one.items()}
        out["r" + suffix] = {k: step_time(target, 1, k + 1, graphs) / one[1]
                             for k in range(1, max_k + 1)}
    return out


def priced_tree(target, graphs: bool, nodes: int = 32, top_k: int = 8) -> ms.DynamicTree:
    """EAGLE-2's dynamic tree priced by this device: ``r(T)``, ``T = 1..nodes + 1``, from one-row
    steps of ``T`` tokens (running maximum), so the tree verifies as many nodes as pay here."""
    one = step_time(target, 1, 1, graphs)
    r = [step_time(target, 1, t, graphs) / one for t in range(1, nodes + 2)]
    return ms.DynamicTree(top_k=top_k, nodes=nodes, verify_cost=tuple(accumulate(r, max)))


def methods(target, name: str, k: int, graphs: bool = True) -> dict:
    """Name -> keyword arguments of ``speculative_generate`` (a new drafter each call)."""
    table = {"prompt lookup": lambda: dict(drafter=ms.PromptLookupDrafter(), k=k),
             "suffix": lambda: dict(drafter=ms.SuffixDrafter(), k=k),
             "ngram": lambda: dict(drafter=ms.NGramDrafter(), k=k)}
    try:
        head = ms.load_drafter(f"{name}-eagle", target)
    except (ValueError, KeyError, FileNotFoundError):
        return table                                       # a model without a shipped head
    tree = priced_tree(target, graphs)
    table |= {"eagle k=2": lambda: dict(drafter=head, k=2),
              "hybrid": lambda: dict(drafter=ms.HybridDrafter(head=head), k=k),
              "eagle tree": lambda: dict(drafter=head, k=6, branching=tree)}
    return table


def speedups(target, tokenizer, model_name: str, per_category: int, new_tokens: int, k: int,
             graphs: bool) -> tuple[dict, bool]:
    """Each method's speed over plain greedy at batch 1 (fixed k), and whether every output
    equalled plain greedy's."""
    prompts = task_prompts(tokenizer, per_category)
    table, identical, seconds = methods(target, model_name, k, graphs), True, {}
    run = dict(tokenizer=tokenizer, adaptive=False, graphs=graphs)
    for make in [lambda: dict(drafter=None, k=0), *table.values()]:                # warm up
        ms.speculative_generate(target, prompt_ids=prompts[0], max_new_tokens=8, **make(), **run)
    for prompt in prompts:
        t0 = now()
        plain = ms.generate(target, prompt, new_tokens, tokenizer=tokenizer, graphs=graphs)
        seconds["plain"] = seconds.get("plain", 0.0) + now() - t0
        for name, make in table.items():
            t0 = now()
            out = ms.speculative_generate(target, prompt_ids=prompt, max_new_tokens=new_tokens,
                                          **make(), **run)
            seconds[name] = seconds.get(name, 0.0) + now() - t0
            identical &= out.tokens == plain.tokens
    return {name: seconds["plain"] / s for name, s in seconds.items() if name != "plain"}, identical


def hf_tokens_per_s(target, tokenizer, name: str, prompts: list, new_tokens: int) -> float:
    """transformers' ``generate`` with its static cache, the batch left-padded, greedy."""
    from transformers import AutoModelForCausalLM

    from minispec.loading.loader import resolve

    hf = AutoModelForCausalLM.from_pretrained(resolve(name), dtype=target.dtype,
                                              trust_remote_code=False).to(target.device)
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             if isinstance(p, list) else p for p in prompts]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.decode([0])
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(target.device)
    kwargs = dict(do_sample=False, cache_implementation="static",
                  pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    hf.generate(**batch, min_new_tokens=4, max_new_tokens=4, **kwargs)              # warm
    t0 = now()
    out = hf.generate(**batch, min_new_tokens=new_tokens, max_new_tokens=new_tokens, **kwargs)
    seconds = now() - t0
    del hf
    return (out.shape[1] - batch["input_ids"].shape[1]) * len(prompts) / seconds


def engine_table(target, tokenizer, name: str, batch_sizes: list[int], new_tokens: int, k: int
                 ) -> tuple[dict, bool]:
    """Per batch size: the plain engine (graphs on, off), transformers, the default engine."""
    pool = task_prompts(tokenizer, 5)
    table, identical = {}, True
    for batch in batch_sizes:
        prompts = [pool[i % len(pool)] for i in range(batch)]
        row, reference = {}, None
        for column, kwargs, graphs in (("plain_tok_s", {}, True), ("plain_tok_s_eager", {}, False),
                                       ("default_tok_s", {"drafter": "ngram", "k": k}, True)):
            engine = ms.Engine(target, max_batch_size=batch, tokenizer=tokenizer,
                               graphs=graphs, **kwargs)
            engine.generate(prompts, max_new_tokens=8, progress=False)                 # warm
            t0 = now()
            results = engine.generate(prompts, max_new_tokens=new_tokens, progress=False)
            seconds = now() - t0
            tokens = [r.tokens for r in results]
            reference = reference or tokens
            identical &= tokens == reference
            row[column] = sum(map(len, tokens)) / seconds
        row["hf_tok_s"] = hf_tokens_per_s(target, tokenizer, name, prompts, new_tokens)
        row["default_over_plain"] = row["default_tok_s"] / row["plain_tok_s"]
        table[batch] = row
    return table, identical


def bf16(name: str, device: str, per_category: int, new_tokens: int, k: int) -> dict:
    """The fraction of tokens of speculative greedy (prompt lookup, fixed k) identical to plain
    greedy's in bfloat16, position by position until the first difference and over all."""
    target, tokenizer = ms.load(name, device=device, dtype=torch.bfloat16)
    prompts = task_prompts(tokenizer, per_category)
    same = total = whole = 0
    for prompt in prompts:
        plain = ms.generate(target, prompt, new_tokens, tokenizer=tokenizer).tokens
        spec = ms.speculative_generate(target, ms.PromptLookupDrafter(), prompt, new_tokens, k=k,
                                       tokenizer=tokenizer, adaptive=False).tokens
        same += sum(a == b for a, b in zip(plain, spec, strict=False))
        total += max(len(plain), len(spec))
        whole += plain == spec
    return {"identical_fraction": same / total, "identical_outputs": whole,
            "outputs": len(prompts)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=Path("minispec/tools/measured/gpu.json"))
    parser.add_argument("--commit", default=None, help="the commit measured (default: git's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--per-category", type=int, default=1, help="prompts per category")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="drafts per round")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_BUCKETS))
    parser.add_argument("--sections", nargs="+", default=["costs", "speedups", "engine", "bf16"])
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (use --device cpu --model shakespeare-target to dry-run)")
    target, tokenizer = ms.load(args.model, device=args.device, dtype=torch.float32)
    record = records.stamp("wall", " ".join(["python", "benchmarks/gpu.py", *sys.argv[1:]]))
    record["commit"] = args.commit or record["commit"] or "unknown"
    record |= {"model": args.model, "dtype": "float32", "identical_tokens": True, "seconds": {}}
    jobs = {
        "costs": lambda: costs(target, args.batch_sizes, args.k),
        "speedups": lambda: speedup_section(target, tokenizer, args),
        "engine": lambda: engine_table(target, tokenizer, args.model, args.batch_sizes,
                                       args.new_tokens, args.k),
        "bf16": lambda: {"bf16": bf16(args.model, args.device, args.per_category,
                                      args.new_tokens, args.k)},
    }
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            save(record, name, jobs[name]())
        except Exception:                                   # keep the other sections' numbers
            record.setdefault("errors", {})[name] = traceback.format_exc()
        record["seconds"][name] = time.perf_counter() - t0
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(name, f"{record['seconds'][name]:.1f} s", flush=True)
    return 0


def speedup_section(target, tokenizer, args) -> tuple[dict, bool]:
    """``speedup_b1`` (graphs on) and ``speedup_b1_eager`` (off), and whether all were exact."""
    runs = {graphs: speedups(target, tokenizer, args.model, args.per_category,
                             args.new_tokens, args.k, graphs) for graphs in (True, False)}
    return ({"speedup_b1": runs[True][0], "speedup_b1_eager": runs[False][0]},
            runs[True][1] and runs[False][1])


def save(record: dict, section: str, result) -> None:
    """Fold a section's result into the record (its identical-token verdict too)."""
    if section in ("engine", "speedups"):
        result, same = result
        record["identical_tokens"] &= same
    record.update({"engine": result} if section == "engine" else result)


if __name__ == "__main__":
    raise SystemExit(main())
