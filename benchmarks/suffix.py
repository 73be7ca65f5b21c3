"""Suffix, EAGLE and hybrid drafting on SmolLM2-135M-Instruct: tokens per target forward and time
against plain greedy, on minispec's workloads (``minispec.tools.workloads``: chat, summarize,
document_qa, code_complete, code_edit).

For every task, back to back (so a change in the machine's load hits them alike), one greedy run
each of: plain ``generate``; ``speculative_generate`` with prompt lookup, the suffix drafter, the
shipped EAGLE head and the hybrid (suffix + head), all with ``k`` drafts per round; with
``--store``, also the suffix drafter and the hybrid drawing on a ``SuffixStore`` that one untimed
pass over every task has filled (the case of a request seen before: SuffixDecoding's agentic
workloads -- optimistic for anything else); with ``--branching B``, also the suffix drafter's
draft trees (``B`` cut or padded to depth ``k``). Every output is checked token-equal to plain
greedy.

Printed per task and over all tasks: new tokens, target forwards (exact counts, prefill excluded),
tokens per target forward, CPU milliseconds per round (target forward + drafting), and the time
ratio against plain greedy on two clocks: wall time (``time.perf_counter``) and this process's
CPU time (``time.process_time``; with one thread it leaves out the time other jobs take the core
away, so it is the steadier number on a shared machine). One run, not a median: tokens per
forward are exact, the ratios are noisy.

``--calibrate`` prints what the hybrid's rule is built on (``minispec.extra_drafters.hybrid``):
drafts accepted per round by the suffix drafter after a match of 1..6+ tokens, by the head, and a
head round's draft time relative to its verify time.

Examples::

    python benchmarks/suffix.py --threads 1 --max-new-tokens 64
    python benchmarks/suffix.py --threads 1 --max-new-tokens 64 --store --calibrate
    python benchmarks/suffix.py --tasks chat summarize --k 3 --no-fast --branching 2,2,1

Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

import minispec as ms
from minispec.drafters.ngram import PromptLookupDrafter
from minispec.extra_drafters.hybrid import HybridDrafter
from minispec.extra_drafters.suffix import SuffixDrafter, SuffixStore
from minispec.speed.timing import TimedRounds
from minispec.tools import workloads


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--head", default="smollm2-135m-instruct-eagle")
    parser.add_argument("--tasks", nargs="+", default=list(workloads.TASKS),
                        choices=list(workloads.TASKS))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="drafts per round (all drafters)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-fast", dest="fast", action="store_false",
                        help="eager model instead of the packed fast path")
    parser.add_argument("--store", action="store_true",
                        help="also suffix and hybrid with a store filled by an earlier pass")
    parser.add_argument("--branching", type=lambda v: tuple(int(b) for b in v.split(",")),
                        help="also the suffix drafter's trees, e.g. 2,2,1,1 (depth = k)")
    parser.add_argument("--calibrate", action="store_true",
                        help="print the numbers the hybrid's rule is built on")
    return parser.parse_args(argv)


class RecordingSuffix(SuffixDrafter):
    """A suffix drafter that records the match length of every non-empty draft."""

    def __init__(self, matches: list[int], store: SuffixStore | None = None) -> None:
        super().__init__(store)
        self.matches = matches

    def __deepcopy__(self, memo: dict) -> RecordingSuffix:
        memo[id(self.matches)] = self.matches     # each request's copy records into one list
        return super().__deepcopy__(memo)

    def lookup(self, context: list[int], k: int) -> list[int]:
        out = super().lookup(context, k)
        if out:
            self.matches.append(self.last_match)
        return out


def methods(head, k: int, store: SuffixStore | None, branching: tuple[int, ...] | None
            ) -> dict[str, Callable[[], Any]]:
    """Name -> a factory of the drafter (``None``: plain greedy); a name with ``tree`` in it
    drafts trees with ``branching``."""
    table: dict[str, Callable[[], Any]] = {
        "greedy": lambda: None,
        f"prompt lookup k={k}": PromptLookupDrafter,
        f"suffix k={k}": SuffixDrafter,
        f"eagle k={k}": lambda: head,
        f"hybrid k={k}": lambda: HybridDrafter(SuffixDrafter(), head),
    }
    if branching is not None:
        table[f"suffix tree {','.join(map(str, branching))}"] = SuffixDrafter
    if store is not None:
        table[f"suffix+store k={k}"] = lambda: SuffixDrafter(store)
        table[f"hybrid+store k={k}"] = lambda: HybridDrafter(SuffixDrafter(store), head)
    return table


def run_one(target, drafter, ids: list[int], args, tree: bool = False) -> dict[str, Any]:
    """One greedy run, timed on both clocks."""
    wall, cpu = time.perf_counter(), time.process_time()
    if drafter is None:
        out = ms.generate(target, ids, args.max_new_tokens)
    else:
        out = ms.speculative_generate(target, drafter, ids, args.max_new_tokens, k=args.k,
                                      branching=args.branching if tree else None,
                                      adaptive=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row = dict(tokens=out.tokens, new=len(out.tokens), forwards=out.stats.target_forwards,
               wall=wall, cpu=cpu)
    if isinstance(drafter, HybridDrafter):
        row["sources"] = dict(drafter.rounds)
    return row


def fill_store(target, prompts: dict[str, list[int]], args) -> SuffixStore:
    """A store holding one earlier greedy pass over every task (prompt and output)."""
    store = SuffixStore(max_tokens=65536)
    for ids in prompts.values():
        ms.speculative_generate(target, SuffixDrafter(store), ids, args.max_new_tokens, k=args.k,
                                adaptive=False)
    return store


def report(results: dict[str, dict[str, dict]], names: list[str]) -> str:
    """Per task and overall: tokens, forwards, tokens/forward, time ratios, identical?"""
    lines = [f"{'task':<14} {'method':<20} {'tokens':>6} {'fwd':>4} {'tok/fwd':>7} "
             f"{'wall s':>7} {'x wall':>6} {'x cpu':>6} {'cpu/fwd':>7}  same  sources (hybrid)"]
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for task, rows in results.items():
        base = rows["greedy"]
        for name in names:
            r = rows[name]
            for key in ("new", "forwards", "wall", "cpu"):
                totals[name][key] += r[key]
            totals[name]["same"] += r["tokens"] == base["tokens"]
            lines.append(f"{task:<14} {name:<20} {r['new']:>6} {r['forwards']:>4} "
                         f"{r['new'] / r['forwards']:>7.2f} {r['wall']:>7.2f} "
                         f"{base['wall'] / r['wall']:>6.2f} {base['cpu'] / r['cpu']:>6.2f} "
                         f"{r['cpu'] / r['forwards'] * 1e3:>7.1f}  "
                         f"{'yes' if r['tokens'] == base['tokens'] else 'NO':<4}  "
                         f"{r.get('sources', '')}")
    lines.append("")
    base = totals["greedy"]
    for name in names:
        t = totals[name]
        lines.append(f"{'all':<14} {name:<20} {int(t['new']):>6} {int(t['forwards']):>4} "
                     f"{t['new'] / t['forwards']:>7.2f} {t['wall']:>7.2f} "
                     f"{base['wall'] / t['wall']:>6.2f} {base['cpu'] / t['cpu']:>6.2f} "
                     f"{t['cpu'] / t['forwards'] * 1e3:>7.1f}  {int(t['same'])}/{len(results)}")
    return "\n".join(lines)


def calibrate(target, head, prompts: dict[str, list[int]], args) -> str:
    """Accepted drafts per round: suffix by match length, the head; the head's draft cost."""
    by_match: dict[int, list[int]] = defaultdict(list)
    head_accepted, draft_time, verify_time = [], 0.0, 0.0
    for ids in prompts.values():
        matches: list[int] = []
        out = ms.speculative_generate(target, RecordingSuffix(matches), ids, args.max_new_tokens,
                                      k=args.k, adaptive=False)
        drafted = [a for d, a in zip(out.stats.drafted_per_round, out.stats.accepted_per_round,
                                     strict=True) if d > 0]
        for m, a in zip(matches, drafted, strict=True):
            by_match[min(m, 6)].append(a)
        clock = TimedRounds()
        out = ms.speculative_generate(target, head, ids, args.max_new_tokens, k=args.k,
                                      policy=clock)
        head_accepted += [a for d, a in zip(out.stats.drafted_per_round,
                                            out.stats.accepted_per_round, strict=True) if d > 0]
        draft_time, verify_time = (draft_time + clock.seconds["draft"],
                                   verify_time + clock.seconds["score"])
    lines = [f"suffix k={args.k}: drafts accepted per round by match length (rounds)"]
    for m in sorted(by_match):
        lines.append(f"  match {m}{'+' if m == 6 else ' '}  "
                     f"{sum(by_match[m]) / len(by_match[m]):.2f}  ({len(by_match[m])})")
    lines.append(f"eagle k={args.k}: {sum(head_accepted) / len(head_accepted):.2f} per round "
                 f"({len(head_accepted)} rounds); draft time / verify time = "
                 f"{draft_time / verify_time:.2f} (perf_counter)")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = ms.load(args.model, fast=args.fast)
    head = ms.load_drafter(args.head, target)
    prompts = {t: ids for t, ids in workloads.encode_tasks(tokenizer, tuple(args.tasks)).items()}
    print(f"{args.model} (fast={args.fast}), {torch.get_num_threads()} thread(s), greedy, "
          f"{args.max_new_tokens} new tokens, k={args.k}; prompt tokens: "
          f"{ {t: len(ids) for t, ids in prompts.items()} }")
    ms.generate(target, prompts[args.tasks[0]], 8)                   # warm-up, untimed
    store = fill_store(target, prompts, args) if args.store else None
    table = methods(head, args.k, store, args.branching)
    results: dict[str, dict[str, dict]] = {}
    for task, ids in prompts.items():
        results[task] = {name: run_one(target, make(), ids, args, "tree" in name)
                         for name, make in table.items()}
        print(f"  {task} done", flush=True)
    print(report(results, list(table)))
    if args.calibrate:
        print(calibrate(target, head, prompts, args))


if __name__ == "__main__":
    main()
