"""Benchmark draft trees against draft chains at equal depth, and r(N), the cost of
verifying N nodes.

For held-out prompts it runs, on the shipped pair (greedy by default, EOS ignored so the work is
equal; with ``--model NAME``, a real chat model on minispec's five workloads instead, where only the
n-gram table drafts, since there is no draft model):

* plain ``minispec.generate`` (the baseline: one target forward per token);
* the chain: ``speculative_generate(k=depth)`` with the draft model and with n-gram drafting;
* trees of the same depth (``speculative_generate(k=depth, branching=...)``) for each
  ``--branching``, with the draft model and with the n-gram table; ``(1,)`` is the chain
  through the tree machinery.

and prints, side by side: tokens per target forward, draft forwards per token, seconds per token
(process CPU time, the median over ``--repeats`` runs interleaved by ``minispec.tools.lockstep``:
the machine is shared) and the speedup over plain decoding; every output is checked token-equal
to plain greedy. Then r(N): the median time of one target forward that scores a tree of N nodes
after a context of ``--context`` tokens, divided by the time of one token. A tree pays only while
r(N) stays low.

Examples::

    python benchmarks/tree.py --threads 1 --repeats 5   # the shipped pair, default branchings
    python benchmarks/tree.py --threads 1 --temperature 0.8  # sampled (trees draw i.i.d. children)
    python benchmarks/tree.py --branching 3,2,1,1 4,2 2,2,2,2 --repeats 5 --threads 2
    python benchmarks/tree.py --model smollm2-135m-instruct --threads 1 --repeats 1 \
        --max-new-tokens 48 --branching 1 3,2,1,1 2,2,2,2 --context 300
    python benchmarks/tree.py --model smollm2-135m-instruct --eagle smollm2-135m-instruct-eagle \
        --threads 1 --repeats 3 --max-new-tokens 48 --chains 4 2 --branching 3,2,1,1 2,2,1,1 3,1:2

With ``--eagle HEAD`` (needs ``--model``) the shipped EAGLE head drafts instead of the n-gram table:
chains of each ``--chains`` length and trees of each ``--branching``; a spec ``B:K`` gives a tree
its own depth ``K``. Draft compute is counted two ways, both printed per round: head FORWARDS (a
chain of k costs k: the catch-up forward over the real pairs, then one per further draft; a tree of
depth k costs k too: the catch-up, then ONE tree-attention forward per fed depth, however wide) and
head ROWS (tokens fed to the head past the catch-up, plus 1: a chain of k feeds k, a tree feeds its
root and every node above the last depth). Chain k=4 and tree (3,2,1,1) spend equal forwards; chain
k=4 and tree (3,1) of depth 2 (3 + 1 rows) equal rows.

Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

import minispec as ms
from minispec.decoding.request import GenerationResult
from minispec.drafters.trees import check_branching
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import TreeAttention
from minispec.tools import workloads
from minispec.tools.lockstep import interleave

SNIPPET = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout_snippet.txt"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=4, help="k: drafts on the longest path")
    parser.add_argument("--branching", nargs="+",
                        default=["1", "2", "3,2,1,1", "4,2,1,1", "2,2,2,2"],
                        help="children per depth, comma separated (padded with 1s)")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per mode (median)")
    parser.add_argument("--context", type=int, default=128, help="context length for r(N)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 5, 9, 13, 21, 32, 64])
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (outputs checked equal); > 0: sampled, seed 0 per run")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's)")
    parser.add_argument("--eagle", default=None, help="an EAGLE head for --model (e.g. "
                        "smollm2-135m-instruct-eagle): chains and trees drafted by the head")
    parser.add_argument("--chains", type=int, nargs="+", default=[4, 2],
                        help="with --eagle: chain lengths k to compare")
    parser.add_argument("--model", default=None,
                        help="a chat model (e.g. smollm2-135m-instruct) on the five workloads of "
                             "minispec.tools.workloads instead of the shipped pair; "
                             "n-gram drafting only")
    return parser.parse_args(argv)


def sampling(args) -> ms.SamplingParams:
    return ms.SamplingParams(temperature=args.temperature, seed=0)


def tree_run(target, drafter, prompt, args, branching, depth=None) -> GenerationResult:
    """A tree of ``branching`` and depth ``depth`` (default ``--depth``) each round, EOS ignored."""
    return ms.speculative_generate(target, drafter, prompt, args.max_new_tokens,
                                   k=depth or args.depth, sampling=sampling(args),
                                   branching=branching, eos_token_id=[])


def parse_spec(spec: str, depth: int) -> tuple[tuple[int, ...], int]:
    """``"3,2,1,1"`` -> ((3, 2, 1, 1), depth); ``"3,1:2"`` -> ((3, 1), 2)."""
    branching, _, k = spec.partition(":")
    return tuple(int(b) for b in branching.split(",")), int(k) if k else depth


def head_rows(branching: tuple[int, ...], depth: int) -> int:
    """Rows a round feeds the head past its catch-up, plus one: the root and every fed node."""
    branching = check_branching(branching, depth)
    rows, width = 1, 1
    for b in branching[:-1]:                               # the last depth is never fed
        width *= b
        rows += width
    return rows


def eagle_modes(target, head, args) -> dict:
    """name -> function(prompt): plain, EAGLE chains, EAGLE trees (greedy or sampled)."""
    out = {"plain": lambda p: ms.generate(target, p, args.max_new_tokens, sampling(args),
                                          eos_token_id=[])}
    for k in args.chains:
        out[f"chain eagle k={k} [{k} fwd, {k} rows]"] = (
            lambda p, k=k: ms.speculative_generate(target, head, p, args.max_new_tokens, k=k,
                                                   sampling=sampling(args), eos_token_id=[],
                                                   adaptive=False))
    for spec in args.branching:
        branching, depth = parse_spec(spec, args.depth)
        name = (f"tree eagle {','.join(map(str, branching))} k={depth} "
                f"[{depth} fwd, {head_rows(branching, depth)} rows]")
        out[name] = lambda p, b=branching, d=depth: tree_run(target, head, p, args, b, d)
    return out


def modes(target, draft, args) -> dict:
    """name -> function(prompt) -> GenerationResult (no draft-model modes when ``draft`` is
    None)."""
    out = {
        "plain": lambda p: ms.generate(target, p, args.max_new_tokens, sampling(args),
                                       eos_token_id=[]),
        "chain draft": lambda p: ms.speculative_generate(target, ms.ModelDrafter(draft), p,
                                                         args.max_new_tokens, k=args.depth,
                                                         sampling=sampling(args), eos_token_id=[],
                                                         adaptive=False),
        "chain ngram": lambda p: ms.speculative_generate(target, "ngram", p, args.max_new_tokens,
                                                         k=args.depth, sampling=sampling(args),
                                                         eos_token_id=[], adaptive=False),
    }
    for spec in args.branching:
        branching = tuple(int(b) for b in spec.split(","))
        out[f"tree draft {spec}"] = lambda p, b=branching: tree_run(target, draft, p, args, b)
        out[f"tree ngram {spec}"] = lambda p, b=branching: tree_run(target, "ngram", p, args, b)
    return {name: run for name, run in out.items() if draft is not None or "draft" not in name}


def compare(target, draft, prompts, args, head=None) -> None:
    runs = modes(target, draft, args) if head is None else eagle_modes(target, head, args)
    timed = interleave({name: (lambda run=run: lambda: [run(p) for p in prompts])
                        for name, run in runs.items()}, args.repeats, clock=time.process_time)
    times = {name: t.seconds for name, t in timed.items()}
    results: dict[str, list[GenerationResult]] = {name: t.output for name, t in timed.items()}
    base = [r.tokens for r in results["plain"]]
    base_time = statistics.median(times["plain"]) / sum(len(t) for t in base)
    width = max(24, *(len(name) for name in runs))
    print(f"\n{'mode':{width}} {'tokens/fwd':>10} {'draft fwd/tok':>13} {'ms/token':>9} "
          f"{'speedup':>8} equal")
    for name in runs:
        res = results[name]
        tokens = sum(len(r.tokens) for r in res)
        fwd = sum(r.stats.target_forwards for r in res)
        dfwd = sum(r.stats.draft_forwards for r in res)
        per_token = statistics.median(times[name]) / tokens
        equal = (all(r.tokens == b for r, b in zip(res, base, strict=True))
                 if args.temperature == 0 else "n/a (sampled)")
        print(f"{name:{width}} {tokens / fwd:10.2f} {dfwd / tokens:13.2f} {per_token * 1e3:9.3f} "
              f"{base_time / per_token:7.2f}x {equal}")


def r_of_n(target, context: list[int], nodes: list[int], repeats: int = 30) -> None:
    """Median time of one forward scoring a chain-shaped tree of N nodes, over one token."""
    n = len(context)
    cache = ContiguousKVCache.for_model(target, num_slots=1)
    slot = cache.allocate()
    target(torch.tensor([context[:-1]]), torch.arange(n - 1)[None], cache, [slot])
    g = torch.Generator().manual_seed(0)

    def step(size: int):
        """A task for ``interleave``: a random tree of ``size`` nodes (untimed), then its forward
        and the cache rolled back."""
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, size)]
        tree = ms.DraftTree(list(torch.randint(0, target.config.vocab_size, (size,),
                                               generator=g).tolist()),
                            parents)
        depth = [0] * size
        for i in range(1, size):
            depth[i] = depth[parents[i]] + 1
        ids = torch.tensor([[context[-1]] + tree.tokens[1:]])
        pos = torch.tensor([[n - 1 + d for d in depth]])
        attn = TreeAttention.for_nodes(tree.ancestor_mask(), start=n - 1)
        return lambda: (target(ids, pos, cache, [slot], tree=attn), cache.truncate_to(slot, n - 1))

    timed = interleave({size: partial(step, size) for size in nodes}, repeats, warmup=1,
                       clock=time.process_time)                # one untimed repeat per shape
    median = {size: t.median for size, t in timed.items()}
    print(f"\nr(N) after {n} context tokens (median of {repeats}, process CPU time)")
    print(f"{'N':>4} {'ms':>8} {'r(N)':>6}")
    for size in nodes:
        print(f"{size:4d} {median[size] * 1e3:8.3f} {median[size] / median[nodes[0]]:6.2f}")


@torch.inference_mode()
def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.eagle and args.model is None:
        raise SystemExit("--eagle needs --model (the target the head was trained for)")
    head = None
    if args.model is None:
        target, tok = ms.load("shakespeare-target")
        draft, _ = ms.load("shakespeare-draft")
        ids = tok.encode(SNIPPET.read_text())
        step = max(1, (len(ids) - args.prompt_tokens) // max(1, args.prompts))
        prompts = [ids[i * step:i * step + args.prompt_tokens] for i in range(args.prompts)]
        label = "shipped pair"
    else:
        target, tok = ms.load(args.model)
        draft = None
        if args.eagle:
            head = ms.load_drafter(args.eagle, target)
        prompts = list(workloads.encode_tasks(tok).values())
        ids = [t for p in prompts for t in p]
        label = f"{args.model} on the {len(prompts)} workloads"
        if args.eagle:
            label += f", drafted by {args.eagle}"
    mode = "greedy" if args.temperature == 0 else f"sampled at T={args.temperature}"
    print(f"{label}, {mode}, depth k={args.depth}, {len(prompts)} prompts x {args.max_new_tokens} "
          f"new tokens, {torch.get_num_threads()} threads, median of {args.repeats}")
    compare(target, draft, prompts, args, head)
    r_of_n(target, (ids * 4)[: args.context], args.nodes)


if __name__ == "__main__":
    main()
