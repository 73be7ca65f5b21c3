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
    demo.add_argument("-k", type=int, default=4, help="drafts in the verify round shown (default 4)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minispec`` command."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        if args.samples < 1 or args.k < 1:
            print("minispec demo: --samples and -k must be >= 1", file=sys.stderr)
            return 2
        return demo_distributions(args.samples, args.seed, args.k)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
