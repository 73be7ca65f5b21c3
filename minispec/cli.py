"""The ``minispec`` command line: ``python -m minispec demo`` and friends.

Each subcommand is a small function that takes parsed arguments; ``main`` only dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

import minispec as ms

WORDS = ["the", "a", "king", "queen", "doth", "speak", "my", "lord"]


def _bar(value: float, width: int = 30) -> str:
    filled = round(value * width)
    return "#" * filled + "." * (width - filled)


def demo_distributions(samples: int, seed: int, k: int) -> int:
    """Speculative sampling on two explicit distributions: the law is p, the acceptance is sum min(p, q)."""
    g = torch.Generator().manual_seed(seed)
    # A target p and a draft q that disagree: q overrates "the" and "doth", underrates "king".
    p = torch.tensor([0.30, 0.10, 0.20, 0.10, 0.05, 0.10, 0.10, 0.05])
    q = torch.tensor([0.45, 0.10, 0.05, 0.10, 0.15, 0.05, 0.05, 0.05])
    tokens, accepted = ms.speculative_sample_batch(p, q, samples, g)
    freq = torch.bincount(tokens, minlength=len(p)).float() / samples
    beta = float(ms.theory.acceptance_rate(p, q))

    print("Speculative sampling: draw x ~ q, keep it iff u < p(x)/q(x), else resample from norm(max(0, p - q)).")
    print(f"{samples:,} draws, seed {seed}\n")
    print(f"{'token':>6}  {'q (draft)':>9}  {'p (target)':>10}  {'measured':>8}  measured law")
    for word, qx, px, fx in zip(WORDS, q.tolist(), p.tolist(), freq.tolist(), strict=True):
        print(f"{word:>6}  {qx:9.3f}  {px:10.3f}  {fx:8.3f}  {_bar(fx / 0.5)}")
    tv = 0.5 * (freq - p).abs().sum().item()
    # Expected total variation of an exact sampler from multinomial noise alone: sum E|N(0, p(1-p)/n)| / 2.
    noise = 0.5 * (2 * p * (1 - p) / (torch.pi * samples)).sqrt().sum().item()
    print(f"\ntotal variation(measured, p) = {tv:.4f}  (pure sampling noise alone gives about {noise:.4f})")
    print(f"acceptance: measured {accepted.float().mean().item():.4f}, theory sum min(p, q) = {beta:.4f}")

    # One round of Algorithm 1 with k drafts from q, every position using the same p and q.
    drafts = ms.sample(q.expand(k, -1), g)
    verdict = ms.verify(drafts, q.expand(k, -1), p.expand(k + 1, -1), generator=g)
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
    print(f"  Eq. (1): a round yields {expected:.2f} tokens on average at alpha = {beta:.2f}, k = {k}")
    return 0


def _drafter(args: argparse.Namespace):
    """The drafter the flags ask for, or None for plain decoding."""
    if args.ngram:
        return ms.NGramDrafter()
    if args.prompt_lookup:
        return ms.PromptLookupDrafter()
    if args.draft:
        draft, _ = ms.load(args.draft)
        return ms.ModelDrafter(draft)
    return None


def generate_command(args: argparse.Namespace) -> int:
    """Generate from a prompt with the chosen drafter; print the text (or the trace) and the stats."""
    target, tokenizer = ms.load(args.target)
    if tokenizer is None:
        print(f"minispec generate: {args.target} has no tokenizer", file=sys.stderr)
        return 2
    sampling = ms.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                 seed=args.seed)
    drafter = _drafter(args)
    out = ms.speculative_generate(target, drafter, args.prompt, args.max_new_tokens,
                                  k=args.k if drafter is not None else 0, sampling=sampling,
                                  tokenizer=tokenizer)
    print(args.prompt, end="")
    print(ms.viz.trace(out, tokenizer) if args.trace else out.text)
    print(f"\n[{out.finish_reason}] {out.stats.summary()}")
    return 0


def demo_shipped_pair(max_new_tokens: int, k: int) -> int:
    """Greedy decoding of the shipped pair three ways: same tokens, fewer target forwards."""
    target, tokenizer = ms.load("shakespeare-target")
    draft, _ = ms.load("shakespeare-draft")
    prompt = "ROMEO. But soft, what light"
    runs = {
        "target alone": ms.generate(target, prompt, max_new_tokens, tokenizer=tokenizer),
        f"draft model, k={k}": ms.speculative_generate(target, draft, prompt, max_new_tokens, k=k,
                                                       tokenizer=tokenizer),
        f"n-gram, k={k}": ms.speculative_generate(target, ms.NGramDrafter(), prompt, max_new_tokens,
                                                  k=k, tokenizer=tokenizer),
    }
    base = runs["target alone"].tokens
    print(f"\nThe shipped pair, greedy, prompt {prompt!r}. Green: accepted drafts, red: rejected, blue: target's own token.\n")
    print(prompt + str(ms.viz.trace(runs[f"draft model, k={k}"], tokenizer)) + "\n")
    for name, out in runs.items():
        same = "identical to target alone" if out.tokens == base else "DIFFERENT (a bug)"
        print(f"{name:>18}: {out.stats.target_forwards:3d} target forwards, "
              f"{out.stats.tokens_per_target_forward:.2f} tokens/forward, "
              f"acceptance {out.stats.acceptance_rate:.2f}, {out.stats.total_time * 1e3:6.1f} ms, {same}")
    return 0 if all(out.tokens == base for out in runs.values()) else 1


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
    demo.add_argument("--samples", type=int, default=200_000, help="number of draws (default 200000)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("-k", type=int, default=4, help="drafts per round (default 4)")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate with the shipped pair")

    gen = sub.add_parser("generate", help="generate text with speculative decoding",
                         description="Generate from a prompt with a target model and a drafter "
                                     "(a draft model, n-gram tables or prompt lookup).")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--target", default="shakespeare-target",
                     help="shipped name, local Hugging Face directory or hub id (default shakespeare-target)")
    drafters = gen.add_mutually_exclusive_group()
    drafters.add_argument("--draft", help="draft model (shipped name, directory or hub id), e.g. shakespeare-draft")
    drafters.add_argument("--ngram", action="store_true", help="draft with akunu's n-gram tables")
    drafters.add_argument("--prompt-lookup", action="store_true", help="draft by prompt lookup")
    gen.add_argument("-k", type=int, default=4, help="drafts per round (default 4)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1 = off)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    gen.add_argument("--trace", action="store_true", help="colour accepted / rejected / corrected tokens")
    return parser


def _shipped_pair_present() -> bool:
    from minispec import zoo

    try:
        return all(zoo.path(name) for name in zoo.NAMES)
    except FileNotFoundError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minispec`` command."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        if args.samples < 1 or args.k < 1 or args.max_new_tokens < 1:
            print("minispec demo: --samples, -k and --max-new-tokens must be >= 1", file=sys.stderr)
            return 2
        status = demo_distributions(args.samples, args.seed, args.k)
        if not _shipped_pair_present():
            print("\n(The shipped model pair is not built in this checkout: skipping the model demo.)")
            return status
        return status or demo_shipped_pair(args.max_new_tokens, args.k)
    if args.command == "generate":
        try:
            return generate_command(args)
        except (ValueError, FileNotFoundError, NotImplementedError) as err:
            print(f"minispec generate: {err}", file=sys.stderr)
            return 2
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
