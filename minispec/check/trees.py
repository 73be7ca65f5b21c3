"""Grade a student's draft-tree verifier (SpecInfer's walk, Stratos §2) by the law of the stream.

The function under test walks a tree built from several drafts:

    fn(tree: DraftTree, target_probs [N, V], draft_probs list of [depth_j, V] | None, generator)
        -> the emitted tokens (a list, a tensor, or an object with ``.tokens``)

``tree`` is a [`minispec.DraftTree`][minispec.core.tree.DraftTree] built from several drafts
(``tree.tokens``, ``tree.parents``, ``tree.draft_nodes``, ``tree.children(node)``); row ``i`` of
``target_probs`` is the target's distribution after the path to node ``i`` (row 0: the root, after
the context); ``draft_probs[j]`` row ``t`` is the ``q`` draft ``j``'s token ``t`` was drawn from,
or ``None`` for deterministic drafts (one-hot proposals).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from minispec.check.harness import TIMEOUT, call
from minispec.check.markov import Chain, emitted, grade_streams
from minispec.check.report import CheckReport
from minispec.core.tree import DraftTree


def _drafts(chain: Chain, last: int, width: int, depth: int, g: torch.Generator,
            sampled: bool) -> tuple[list[list[int]], list | None]:
    """``width`` drafts of ``depth`` tokens: independent samples from ``Q``, or deterministic:
    the ``j``-th most likely first token, then the argmax chain (one-hot proposals)."""
    if sampled:
        pairs = [chain.draft(last, depth, g, True) for _ in range(width)]
        return [t for t, _ in pairs], [q for _, q in pairs]
    firsts = torch.argsort(chain.Q[last], descending=True, stable=True)[:width].tolist()
    return [[x] + chain.draft(x, depth - 1, g, False)[0] for x in firsts], None


def make_round(fn: Callable, chain: Chain, width: int, sampled: bool,
               g: torch.Generator) -> Callable[[int], list[int]]:
    """The grader's tree round: ``round_(last) -> emitted tokens``.

    Args:
        fn: the tree verifier under test.
        chain: the toy target and draft.
        width: drafts (of depth 2) per round.
        sampled: draw the drafts from ``Q`` (else the top-``width`` first tokens, then argmax).
        g: draws the drafts and is handed to ``fn``.
    """

    def round_(last: int) -> list[int]:
        drafts, qs = _drafts(chain, last, width, 2, g, sampled)
        tree = DraftTree.from_drafts(drafts)
        p = chain.rows(last, tree.tokens[1:])         # (N, V): Markov, row i = P[token of node i]
        inputs: dict[str, Any] = {"drafts": drafts, "draft_probs": qs, "target_probs": p,
                                  "tree_parents": tree.parents}
        return emitted(call(fn, tree, p, qs, g, inputs=inputs), drafts, chain.vocab, inputs)

    return round_


def tree_verifier(fn: Callable, *, sampled: bool = True, greedy: bool = True, seed: int = 0,
                  timeout: float = TIMEOUT) -> CheckReport:
    """Check that ``fn`` is a lossless tree verifier: the emitted stream has the target's law.

    As [`minispec.check.verifier`][minispec.check.chains.verifier], on draft trees: every round
    builds a tree from several drafts of depth 2 after the last token, scores every node with the
    toy Markov target, and calls ``fn``; streams of 4 tokens are compared with the target's exact
    law (81 outcomes). Cases: 3 drafts sampled from ``q`` (600 streams; siblings may repeat a
    token), 2 deterministic drafts with ``draft_probs=None`` (400 streams: the first two tokens
    by ``q``, as top-k tree drafting does), reproducibility under a fixed seed, and greedy mode
    (one-hot target rows: every stream must be the target's greedy chain). The emitted tokens
    before the last must follow a path of the tree from its root. Any lossless walk passes:
    SpecInfer's iterative rule does (``lambda tree, p, q, g: ms.verify(ms.Proposal.from_tree(tree,
    q), p, g)``).

    **False alarms.** 4 Pearson tests (first token and whole stream for each sampled case), each
    at ``alpha = 6.25e-5``: at most ``1e-3`` for a correct walk, by the same argument as the chain
    verifier's; the greedy and path cases are exact.

    **Sample sizes.** 600 and 400 streams: the tree bugs of the lab fail with their statistic
    several times the threshold (testing siblings against ``p`` instead of the residual) or with
    an impossible stream (the bonus from the parent's row); about 2500 calls, a few seconds.

    Args:
        fn: the tree verifier under test (signature in the module docstring).
        sampled: run the sampled-mode cases.
        greedy: run the greedy-mode cases.
        seed: seeds the drafts and the generator handed to ``fn``.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    return grade_streams("tree_verifier", functools.partial(make_round, fn),
                         [(3, True, 0), (2, False, 1)],
                         lambda width: (f"{width} drafts of depth 2",
                                        {"drafts per round": width, "depth": 2}),
                         sampled=sampled, greedy=greedy, seed=seed, timeout=timeout)
