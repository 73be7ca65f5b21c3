"""SmolLM2-135M-Instruct on a CUDA GPU: exactness, the cost model's terms, speedups, the engine.

Run on a machine with a CUDA device (CI has none)::

    python benchmarks/gpu.py --out benchmarks/out/gpu

Sections, each timed by the wall clock after ``torch.cuda.synchronize()`` (device work is
asynchronous), each written to ``--out/gpu.json`` as soon as it ends, so a run stopped early keeps
what it measured; an exception in one section is recorded and the next one runs:

1. ``parity``   -- minispec's greedy tokens against transformers' ``generate`` on the same GPU and
   dtype (float32), prompt by prompt;
2. ``costs``    -- one forward of ``T`` new tokens at a cached context, ``r(k) = t(k + 1) / t(1)``,
   and the one-token step against the memory roofline (weight bytes over the copy bandwidth
   measured here);
3. ``speedups`` -- batch 1 on the multi-task prompt set: plain greedy, prompt lookup, suffix, the
   shipped EAGLE head (goodput k and fixed k) and the hybrid; every output checked against plain;
4. ``engine``   -- the continuous-batching engine at B = 1..32: plain, n-gram and the EAGLE head
   (goodput k, the default, and fixed k), outputs checked against the plain engine's.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

import minispec as ms
from minispec.tools.workloads import multitask

MODEL = "smollm2-135m-instruct"


def now() -> float:
    """Seconds on the wall clock once the GPU's queued work has finished."""
    torch.cuda.synchronize()
    return time.perf_counter()


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    x = torch.empty(int(gib * 2**30) // 4, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = now()
    for _ in range(10):
        y.copy_(x)
    return 2 * x.numel() * 4 * 10 / (now() - t0)


def parity(target, tokenizer, prompts: list) -> dict:
    """Greedy tokens of minispec and of transformers on the same device and dtype."""
    from transformers import AutoModelForCausalLM

    from minispec.models.chat import encode_prompt
    from minispec.zoo import smollm2

    hf = AutoModelForCausalLM.from_pretrained(smollm2.cache_dir(), dtype=torch.float32).cuda()
    same = []
    for messages in prompts:
        ids = encode_prompt(messages, tokenizer)
        ours = ms.generate(target, ids, 48).tokens
        x = torch.tensor([ids], device="cuda")
        theirs = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48,
                             do_sample=False, pad_token_id=tokenizer.eos_token_id)
        same.append(ours == theirs[0, len(ids):].tolist()[:len(ours)])
    del hf
    return {"prompts": len(same), "equal": sum(same)}


def costs(target, context: int = 300, max_k: int = 8, repeats: int = 20) -> dict:
    """``t(T)`` for T = 1..max_k + 1 new tokens at ``context`` cached tokens, batch 1 and 8."""
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    bandwidth = copy_bandwidth()
    out = {"weight_bytes": weight_bytes, "copy_bandwidth_GBps": bandwidth / 1e9,
           "roofline_ms": 1e3 * weight_bytes / bandwidth, "by_batch": {}}
    for batch in (1, 8):
        cache = ms.ContiguousKVCache.for_model(target, num_slots=batch,
                                               max_seq_len=context + max_k + 2)
        slots = [cache.allocate() for _ in range(batch)]
        with torch.no_grad():
            ids = torch.randint(0, 1000, (batch, context), device="cuda")
            target(ids, torch.arange(context, device="cuda")[None].expand(batch, -1), cache, slots)
            times = {}
            for t in range(1, max_k + 2):
                x = torch.randint(0, 1000, (batch, t), device="cuda")
                pos = torch.arange(context, context + t, device="cuda")[None].expand(batch, -1)
                for _ in range(3):
                    target(x, pos, cache, slots)
                samples = []
                for _ in range(repeats):
                    t0 = now()
                    target(x, pos, cache, slots)
                    samples.append(now() - t0)
                times[t] = sorted(samples)[len(samples) // 2]
        out["by_batch"][batch] = {
            "step_ms": 1e3 * times[1],
            "r": {k: times[k + 1] / times[1] for k in range(1, max_k + 1)}}
    out["step_over_roofline"] = out["by_batch"][1]["step_ms"] / out["roofline_ms"]
    return out


def speedups(target, tokenizer, per_category: int, new_tokens: int, k: int) -> dict:
    """Batch 1 on the multi-task set; per category and overall, each method's time and tokens per
    target forward, checked token for token against plain greedy."""
    head = ms.load_drafter(f"{MODEL}-eagle", target)
    methods = {
        "prompt lookup": lambda: (ms.PromptLookupDrafter(), True),
        "suffix": lambda: (ms.SuffixDrafter(), True),
        "eagle": lambda: (head, True),
        "eagle fixed k": lambda: (head, False),
        "hybrid": lambda: (ms.HybridDrafter(head=head), True),
    }
    first = next(iter(multitask().values()))[0]
    ms.generate(target, first, 16, tokenizer=tokenizer)               # warm every method once
    for make in methods.values():
        drafter, adaptive = make()
        ms.speculative_generate(target, drafter, first, 16, k=k, tokenizer=tokenizer,
                                adaptive=adaptive)
    rows: dict[str, dict] = {}
    for category, prompts in multitask().items():
        for messages in prompts[:per_category]:
            t0 = now()
            plain = ms.generate(target, messages, new_tokens, tokenizer=tokenizer)
            row = rows.setdefault(category, {"plain": [0.0, 0, 0]})
            row["plain"][0] += now() - t0
            row["plain"][1] += len(plain.tokens)
            row["plain"][2] += plain.stats.target_forwards
            for name, make in methods.items():
                drafter, adaptive = make()
                t0 = now()
                out = ms.speculative_generate(target, drafter, messages, new_tokens, k=k,
                                              tokenizer=tokenizer, adaptive=adaptive)
                seconds = now() - t0
                if out.tokens != plain.tokens:
                    raise AssertionError(f"{name} on {category}: tokens differ from greedy")
                cell = row.setdefault(name, [0.0, 0, 0])
                cell[0] += seconds
                cell[1] += len(out.tokens)
                cell[2] += out.stats.target_forwards
    table = {}
    for category, row in rows.items():
        table[category] = {name: {"seconds": s, "tokens": n, "tokens_per_forward": n / f,
                                  "speedup": row["plain"][0] / s}
                           for name, (s, n, f) in row.items()}
    totals = {name: [sum(rows[c][name][i] for c in rows) for i in range(3)]
              for name in rows[next(iter(rows))]}
    table["overall"] = {name: {"seconds": s, "tokens": n, "tokens_per_forward": n / f,
                               "speedup": totals["plain"][0] / s}
                        for name, (s, n, f) in totals.items()}
    return table


def engine_table(target, tokenizer, batch_sizes: list[int], new_tokens: int, k: int) -> dict:
    """Tokens per second of the engine by batch size and mode; outputs equal to plain's."""
    prompts = [m for ps in multitask().values() for m in ps]
    head = ms.load_drafter(f"{MODEL}-eagle", target)
    modes = {"plain": {}, "ngram": {"drafter": ms.NGramDrafter(), "k": k},
             "eagle": {"drafter": head, "k": k},
             "eagle fixed k": {"drafter": head, "k": k, "adaptive": False}}
    table = {}
    for batch in batch_sizes:
        reqs = [prompts[i % len(prompts)] for i in range(2 * batch)]
        row, reference = {}, None
        for name, kwargs in modes.items():
            engine = ms.Engine(target, max_batch_size=batch, tokenizer=tokenizer, **kwargs)
            engine.generate(reqs[:batch], max_new_tokens=8, progress=False)          # warm
            t0 = now()
            results = engine.generate(reqs, max_new_tokens=new_tokens, progress=False)
            seconds = now() - t0
            tokens = [r.tokens for r in results]
            reference = reference or tokens
            if tokens != reference:
                raise AssertionError(f"engine {name} at B={batch}: tokens differ from plain")
            row[name] = {"tokens_per_s": sum(map(len, tokens)) / seconds}
        for name in row:
            row[name]["vs_plain"] = row[name]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        table[batch] = row
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/gpu"))
    parser.add_argument("--per-category", type=int, default=2, help="prompts per category")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4, help="drafts per round (goodput's bound)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--sections", nargs="+",
                        default=["parity", "costs", "speedups", "engine"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = ms.load(MODEL, device="cuda", dtype=torch.float32)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "model": MODEL, "dtype": "float32", "args": vars(args) | {"out": str(args.out)}}
    jobs = {"parity": lambda: parity(target, tokenizer,
                                     [ps[0] for ps in multitask().values()]),
            "costs": lambda: costs(target),
            "speedups": lambda: speedups(target, tokenizer, args.per_category, args.new_tokens,
                                         args.k),
            "engine": lambda: engine_table(target, tokenizer, args.batch_sizes, 64, args.k)}
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            report[name] = jobs[name]()
        except Exception:                                   # keep the other sections' numbers
            report[name] = {"error": traceback.format_exc()}
        report.setdefault("seconds", {})[name] = time.perf_counter() - t0
        (args.out / "gpu.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(name, json.dumps(report[name], default=str)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
