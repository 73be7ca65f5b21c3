"""Is the default engine ever slower than the plain one? Engines run step by step, in lockstep.

`benchmarks/engine.py` times each engine's whole run; runs of equal work made seconds apart on a
shared 2-core VM differ by 10-30 %, more than the few per cent in question. Here every engine
serves the same requests *at the same time*: one step of the plain engine, one step of each
drafting engine, and again, each step timed by itself (this process's CPU time, one thread), the
order of the engines reversed every step. A slow spell of the machine then lands on all engines
alike, and what is left to average out is the noise within a step, over hundreds of steps.

For every batch size ``B`` and drafter it serves ``2 x B`` requests, at least 4 (64 new tokens
each, EOS ignored, so the work is equal), through

* the plain engine (no drafter);
* the engine with the drafter as a user gets it: goodput ``k`` (``minispec.speed.goodput``);
* a control: the same engine with a policy that never drafts, which does the plain engine's work
  plus the drafter's bookkeeping and the policy's, so its ratio is the price of that machinery,
  and its spread over repeats is the measurement's;
* optionally (``--fixed``) the engine with a fixed ``k``;

after every engine has served a first, untimed wave of other prompts (a server's steady state:
``--cold`` times fresh engines instead). It prints each engine's generated tokens per CPU second
as a multiple of the plain engine's (the median over ``--repeats`` lockstep runs, with their
range), the mean ``k`` the default chose, and whether every output equals single-request greedy
decoding. Results go to ``<out>/lockstep.json``.

Before timing, the objects alive after start-up (models, tokenizer, transformers' modules: about
357,000 of them here) are moved out of the garbage collector's reach (``gc.freeze``). A full
collection scans every tracked object: it took 168-171 ms, on whichever engine's step happened to
cross the collector's threshold, and one such step made that engine 10 % slower than the others
in a 1.7 s run at ``B = 32`` (in 2 of 4 runs; with the heap frozen a full collection took 2-3 ms).
Serving stacks do the same (SGLang has a ``freeze_gc`` call, and warns of long collections).

Examples::

    python benchmarks/lockstep.py                                  # the shipped pair, B 1..32
    python benchmarks/lockstep.py --batch-sizes 8 16 --repeats 5 --fixed
    python benchmarks/lockstep.py --model smollm2-135m-instruct --fast --drafters eagle

Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
from pathlib import Path

import torch
from engine import NeverDrafts, load_models, make_prompts  # benchmarks/engine.py

import minispec as ms
from minispec.serving.engine import Engine
from minispec.speed.packed import make_fast
from minispec.tools import records
from minispec.tools.lockstep import lockstep  # one step of each engine in turn, CPU time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=24, help="approximate prompt length")
    parser.add_argument("--k", type=int, default=4, help="the most drafts per round")
    parser.add_argument("--repeats", type=int, default=3, help="lockstep runs per batch size")
    parser.add_argument("--model", default=None, help="a registered target instead of the "
                        "shipped pair (which has no draft model)")
    parser.add_argument("--drafters", nargs="+", default=["draft", "ngram"],
                        choices=["draft", "ngram", "eagle"],
                        help="draft: the shipped draft model; eagle: <model>-eagle (needs --model)")
    parser.add_argument("--fast", action="store_true",
                        help="the target on the packed CPU path (minispec.speed.packed.make_fast)")
    parser.add_argument("--fixed", action="store_true", help="also each drafter at a fixed k")
    parser.add_argument("--cold", action="store_true", help="time fresh engines (no first wave)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    for name in ("max_new_tokens", "k", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.batch_sizes) < 1:
        parser.error("--batch-sizes must be at least 1")
    if "eagle" in args.drafters and args.model is None:
        parser.error("eagle needs --model (the shipped pair has no EAGLE head)")
    if "draft" in args.drafters and args.model is not None:
        parser.error(f"{args.model} has no draft model: --drafters ngram or eagle")
    return args


def make_engines(target, drafters: dict, batch: int, args) -> dict[str, Engine]:
    """The plain engine, and per drafter its default, its never-drafting control (and fixed k)."""
    size = dict(max_batch_size=batch, max_seq_len=2 * (args.prompt_tokens + args.max_new_tokens))
    engines = {"plain": Engine(target, **size)}      # (a KV pool for these requests, not 8k each)
    for name, spec in drafters.items():
        engines[f"{name} default"] = Engine(target, drafter=spec, k=args.k, **size)
        engines[f"{name} never"] = Engine(target, drafter=spec, k=args.k, **size)
        engines[f"{name} never"].policy = NeverDrafts(args.k)
        if args.fixed:
            engines[f"{name} k={args.k}"] = Engine(target, drafter=spec, k=args.k, adaptive=False,
                                                   **size)
    return engines


def run_batch(target, drafters: dict, tok, batch: int, args) -> dict:
    """``--repeats`` lockstep runs at one batch size, each on fresh engines warmed by a first wave;
    every output is checked against single-request greedy decoding."""
    n = max(4, 2 * batch)                       # the requests benchmarks/engine.py serves
    prompts = make_prompts(n, args.prompt_tokens, tok, target.config.vocab_size)
    warm = make_prompts(n, args.prompt_tokens, tok, target.config.vocab_size, other=True)
    reference = [ms.generate(target, p, max_new_tokens=args.max_new_tokens, eos_token_id=[]).tokens
                 for p in prompts]
    runs = []
    for _ in range(args.repeats):
        engines = make_engines(target, drafters, batch, args)
        if not args.cold:
            lockstep(engines, warm, args.max_new_tokens)
        runs.append(lockstep(engines, prompts, args.max_new_tokens))
    row = dict(batch_size=batch, requests=n, modes={})
    for name in runs[0]:
        speeds = [r[name]["tokens"] / r[name]["seconds"] for r in runs]
        ratios = sorted(r[name]["tokens"] / r[name]["seconds"]
                        / (r["plain"]["tokens"] / r["plain"]["seconds"]) for r in runs)
        ks = [k for r in runs for k in r[name]["ks"]]
        row["modes"][name] = dict(
            tokens_per_s=statistics.median(speeds), ratio=statistics.median(ratios),
            ratios=ratios, mean_k=statistics.mean(ks) if ks else None,
            same=all(r[name]["outputs"] == reference for r in runs))
    return row


def print_row(row: dict) -> None:
    modes = row["modes"]
    cells = "  ".join(f"{name} {m['ratio']:.3f}x [{m['ratios'][0]:.2f}-{m['ratios'][-1]:.2f}]"
                      + (f" k {m['mean_k']:.2f}" if m["mean_k"] is not None and "default" in name
                         else "")
                      for name, m in modes.items() if name != "plain")
    same = all(m["same"] for m in modes.values())
    same = "all outputs equal greedy" if same else "OUTPUTS DIFFER from greedy"
    print(f"B={row['batch_size']:>2}  plain {modes['plain']['tokens_per_s']:.0f} tok/s  {cells}  "
          f"({same})", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft, tok, _, label = load_models(False, False, Path(tmp), args.model)
    if args.fast:
        make_fast(target)
        label += ", packed path"
    make = {"draft": lambda: draft, "ngram": lambda: "ngram",
            "eagle": lambda: ms.load_drafter(f"{args.model}-eagle", target)}
    drafters = {name: make[name]() for name in args.drafters}
    gc.collect()
    gc.freeze()         # a full collection no longer scans the start-up heap (module docstring)
    print(f"{label}; {args.threads} thread(s); k <= {args.k}; {args.max_new_tokens} new tokens; "
          f"process CPU time per step, engines in lockstep; median of {args.repeats} runs"
          f"{'; fresh engines' if args.cold else '; warm engines'}")
    rows = []
    for batch in args.batch_sizes:
        rows.append(run_batch(target, drafters, tok, batch, args))
        print_row(rows[-1])
    print("(each engine's tokens per CPU second x the plain engine's in the same lockstep run: "
          "median [lowest-highest] over the runs; default: goodput k, mean k chosen; never: the "
          "default's machinery with a policy that never drafts)")
    records.write(args.out / "lockstep.json", dict(label=label, k=args.k, rows=rows), "cpu")
    print(f"wrote {args.out / 'lockstep.json'}")


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
