"""EAGLE-style heads side by side: tokens per target forward by category of the multi-task set.

Tokens per forward do not depend on the clock, so this compares heads on a loaded machine too.
Every output is checked against plain greedy decoding. ::

    python benchmarks/heads.py --heads smollm2-135m-instruct-eagle path/to/another/head

An older shipped head is in git: ``git archive COMMIT minispec/zoo/smollm2-135m-instruct-eagle |
tar -x -C old`` puts it in ``old/minispec/zoo/smollm2-135m-instruct-eagle``.
"""

from __future__ import annotations

import argparse
import os

import torch

import minispec as ms
from minispec.tools.workloads import multitask


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", nargs="+", default=["smollm2-135m-instruct-eagle"],
                        help="shipped head names or directories written by save_head")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--per-category", type=int, default=2, help="prompts per category")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4, help="drafts per round (fixed)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = ms.load(args.model, fast=True)
    heads = {name: ms.load_drafter(name, target) for name in args.heads}
    counts: dict[str, dict[str, list[int]]] = {}
    print(f"{args.model}, fast path, fixed k = {args.k}, {args.new_tokens} new tokens, "
          f"{args.per_category} prompts per category: tokens per target forward")
    for category, prompts in multitask().items():
        for messages in prompts[: args.per_category]:
            plain = ms.generate(target, messages, args.new_tokens, tokenizer=tokenizer).tokens
            for name, head in heads.items():
                out = ms.speculative_generate(target, head, messages, args.new_tokens, k=args.k,
                                              tokenizer=tokenizer, adaptive=False)
                if out.tokens != plain:
                    raise AssertionError(f"{name} on {category}: tokens differ from greedy")
                cell = counts.setdefault(category, {}).setdefault(name, [0, 0])
                cell[0] += out.stats.new_tokens
                cell[1] += out.stats.target_forwards
        print(f"{category:<14}" + "".join(f"{n / f:>8.2f}" for n, f in counts[category].values()),
              flush=True)
    totals = [[sum(counts[c][name][i] for c in counts) for i in (0, 1)] for name in heads]
    print(f"{'overall':<14}" + "".join(f"{n / f:>8.2f}" for n, f in totals))
    print("columns: " + ", ".join(heads))


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
