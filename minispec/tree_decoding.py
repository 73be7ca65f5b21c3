"""Tree speculative decoding of one sequence: a tree of drafts verified in one target forward.

A round, as in [`speculative_generate`][minispec.decoding.speculative_generate] but with a tree instead of a chain:

1. **draft**: a tree drafter ([`minispec.tree_drafters`][minispec.tree_drafters]) proposes a tree of depth ``k`` with
   ``branching[t]`` children per node at depth ``t``;
2. **verify**: ONE target forward scores the root (the last context token) and every node, with
   tree attention ([`TreeAttention`][minispec.model.TreeAttention]): node ``i`` sits at RoPE position
   ``n - 1 + depth(i)``, is stored at cache position ``n - 1 + i`` and sees the context and its
   own ancestors only. Then the walk down the tree: greedy, [`verify_tree`][minispec.tree.verify_tree]
   (the longest path whose every token is the target's argmax, Stratos App. A); sampled,
   [`iterative_speculative_sample`][minispec.tree.iterative_speculative_sample] at each node over the draws made there
   (SpecInfer's multi-step speculative sampling, Stratos §2): the output has the target's law;
3. **compact**: both caches keep exactly the accepted path, moved to consecutive positions
   ([`KVCache.compact`][minispec.kv_cache.KVCache.compact]);
4. **emit**: the accepted tokens plus the target's own next token, until a stop rule fires.

[`decode_tree`][minispec.tree_decoding.decode_tree] runs one validated
[`Sequence`][minispec.sequence.Sequence]; it sits below [`minispec.decoding`][minispec.decoding] so that ``speculative_generate(..., branching=...)`` can hand it a request.

Statistics: ``drafted_per_round`` records the tree's depth (so ``acceptance_rate`` is the chance to
go one level deeper), ``target_forwards`` one per round.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from minispec.drafters import ModelDrafter
from minispec.eagle import EagleDrafter
from minispec.kv_cache import ContiguousKVCache, cache_args_for_model
from minispec.model import Llama, TreeAttention
from minispec.ngram import NGramDrafter
from minispec.sampling import one_hot, probs_for_rows, sample
from minispec.sequence import Sequence
from minispec.tree import iterative_speculative_sample, verify_tree
from minispec.tree_drafters import (
    EagleTreeDrafter,
    NGramTreeDrafter,
    TreeModelDrafter,
    TreeProposal,
    check_branching,
    tree_size,
)

__all__ = ["as_tree_drafter", "decode_tree", "score_tree", "tree_round", "verify_proposal"]


def as_tree_drafter(drafter: Any, max_seq_len: int, max_nodes: int):
    """A draft model, a [`ModelDrafter`][minispec.drafters.ModelDrafter], an
    [`EagleDrafter`][minispec.eagle.EagleDrafter] (its head), ``"ngram"``, an
    [`NGramDrafter`][minispec.ngram.NGramDrafter] or a tree drafter -> a tree drafter. ValueError
    for anything else."""
    if isinstance(drafter, (TreeModelDrafter, NGramTreeDrafter, EagleTreeDrafter)):
        return drafter
    if isinstance(drafter, (Llama, ModelDrafter)):
        return TreeModelDrafter(drafter, max_seq_len, max_nodes)
    if isinstance(drafter, EagleDrafter):
        return EagleTreeDrafter(drafter, max_seq_len, max_nodes)
    if drafter == "ngram" or isinstance(drafter, NGramDrafter):
        return NGramTreeDrafter(None if drafter == "ngram" else drafter)
    raise ValueError(f"a tree drafter is a draft model, a ModelDrafter, an EagleDrafter, 'ngram' "
                     f"or an NGramDrafter, got {drafter!r}")


@torch.inference_mode()
def decode_tree(target: Llama, drafter: Any, seq: Sequence, k: int,
                branching: tuple[int, ...] = (3, 2, 1, 1)) -> Sequence:
    """Run ``seq`` to its end with a draft tree of depth ``k`` per round (module docstring).

    The caller validates the request (``seq`` made by [`Sequence.new`][minispec.sequence.Sequence.new] with ``max_seq_len``
    already checked against both models); this makes the caches, prefills and loops.

    Args:
        target: the target model ``p``.
        drafter: a draft [`Llama`][minispec.model.Llama], a
            [`ModelDrafter`][minispec.drafters.ModelDrafter] or an
            [`EagleDrafter`][minispec.eagle.EagleDrafter] (top-b children when greedy, b i.i.d.
            draws when sampled; the EAGLE head gets the target's features of the prefill and of
            each round's accepted path only), ``"ngram"`` or an
            [`NGramDrafter`][minispec.ngram.NGramDrafter] (the b most frequent continuations).
        seq: a new, validated request; its ``sampling`` and ``generator`` are used.
        k: depth of the tree (drafts on the longest path), >= 1; shrunk near the limits.
        branching: children per node at each depth (padded with 1s to ``k``, cut to ``k``).

    Returns:
        ``seq``, finished: greedy output is token for token the target's greedy output, sampled
        output has the target's law.

    Raises:
        ValueError: for a bad ``k``, ``branching`` or drafter, or NaN logits.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 with a drafter, got {k!r}")
    branching = check_branching(branching, k)
    nodes = tree_size(branching)
    tree_drafter = as_tree_drafter(drafter, seq.max_seq_len, nodes)
    wants_hidden = getattr(tree_drafter, "wants_hidden", False)
    if wants_hidden:
        tree_drafter.check_target(target)
    args = cache_args_for_model(target, seq.max_seq_len)
    args["max_seq_len"] += nodes                      # the tree is stored past the context
    cache = ContiguousKVCache(num_slots=1, **args)
    seq.slot = cache.allocate()
    if (reason := seq.done_before_start()) is not None:
        seq.finish(reason)
    elif seq.num_tokens > 1:                          # prefill all but the last prompt token
        n = seq.num_tokens
        out = target(torch.tensor([seq.context[:-1]], device=target.device),
                     torch.arange(n - 1, device=target.device)[None], cache, [seq.slot],
                     return_hidden=wants_hidden)
        if wants_hidden:                              # the head's first real pairs
            tree_drafter.observe_prefill(out[1][0])
        seq.stats.prefill_tokens = n - 1
    while not seq.is_finished:
        tree_round(target, cache, tree_drafter, seq, branching[:seq.round_k(k)])
    return seq


def tree_round(target: Llama, cache, drafter, seq: Sequence, branching: tuple[int, ...]) -> None:
    """One round: propose, score the tree in one forward, walk down it, compact, emit."""
    t0, before = time.perf_counter(), drafter.forwards
    if branching:                                     # 1. the drafter proposes a tree
        proposal = drafter.propose(seq, branching)
    else:                                             # no room for drafts: the root alone
        proposal = TreeProposal.build([-1], [seq.context[-1]], [[]])
    seq.stats.draft_forwards += drafter.forwards - before
    t1 = time.perf_counter()
    wants_hidden = getattr(drafter, "wants_hidden", False)
    probs, hidden = score_tree(target, cache, seq, proposal, return_hidden=True)
    path, tokens = verify_proposal(proposal, probs, seq)   # 2. one forward, walk down the tree
    n = seq.num_tokens
    cache.compact(seq.slot, n, [n - 1 + node for node in path])   # 3. keep the accepted path
    if wants_hidden:                                  # a feature head: the root's and the
        drafter.observe(proposal, path, hidden[[0] + path])   # accepted path's features only
    elif branching:
        drafter.observe(proposal, path)               # the draft cache too
    seq.stats.draft_time += t1 - t0
    seq.stats.verify_time += time.perf_counter() - t1
    seq.stats.record_round(proposal.depth, len(path))
    seq.append(tokens, main_chain(proposal, path), len(path))   # 4. emit, until a stop rule


def score_tree(target: Llama, cache, seq: Sequence, proposal: TreeProposal,
               return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The target's adjusted distribution at every node, from one forward: ``(N, V)`` (and, with
    ``return_hidden``, the target's final-normed hidden states at the nodes, ``(N, D)``)."""
    tree, n, device = proposal.tree, seq.num_tokens, target.device
    depth = [0] * len(tree)
    for i in range(1, len(tree)):
        depth[i] = depth[tree.parents[i]] + 1
    ids = torch.tensor([[seq.context[-1]] + tree.tokens[1:]], device=device)          # (1, N)
    positions = torch.tensor([[n - 1 + d for d in depth]], device=device)             # (1, N)
    attn = TreeAttention.for_nodes(tree.ancestor_mask().to(device), start=n - 1)
    logits, hidden = target(ids, positions, cache, [seq.slot], tree=attn, return_hidden=True)
    logits, hidden = logits[0], hidden[0]                                             # (N, V), (N, D)
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if seq.sampling.raw_argmax:
        probs = one_hot(logits.argmax(dim=-1), logits.shape[-1])
    else:
        paths = [seq.context]
        for i in range(1, len(tree)):
            paths.append(paths[tree.parents[i]] + [tree.tokens[i]])
        probs = probs_for_rows(logits, [seq.sampling] * len(tree), paths)
    return (probs, hidden) if return_hidden else probs


def verify_proposal(proposal: TreeProposal, probs: Tensor, seq: Sequence) -> tuple[list[int], list[int]]:
    """Walk down the tree; returns ``(accepted nodes, emitted tokens)`` (accepted + one more).

    Greedy: [`verify_tree`][minispec.tree.verify_tree]. Sampled: at each node the draws made there are
    tried in order by [`iterative_speculative_sample`][minispec.tree.iterative_speculative_sample] against the target's
    ``p`` at that node; the first accepted one is the next node, and if all are rejected the token
    is drawn from what is left (a leaf: from ``p``).
    """
    tree = proposal.tree
    if seq.sampling.greedy:
        verdict = verify_tree(tree, probs, greedy=True)
        return verdict.path, verdict.tokens
    node, path = 0, []
    while True:
        draws = proposal.draws[node]
        if not draws:
            return path, [tree.tokens[i] for i in path] + [int(sample(probs[node], seq.generator))]
        qs = torch.stack([one_hot(torch.tensor(tree.tokens[c]), probs.shape[-1]).to(probs)
                          if q is None else q.to(probs) for c, q in draws])             # (K, V)
        result = iterative_speculative_sample(probs[node], qs, seq.generator,
                                              proposals=[tree.tokens[c] for c, _ in draws])
        if result.accepted_index is None:
            return path, [tree.tokens[i] for i in path] + [result.token]
        node = draws[result.accepted_index][0]
        path.append(node)


def main_chain(proposal: TreeProposal, path: list[int]) -> list[int]:
    """For traces: the accepted tokens, then the first child at each node below (a chain's drafts)."""
    tree = proposal.tree
    chain = [tree.tokens[i] for i in path]
    node = path[-1] if path else 0
    while proposal.draws[node]:
        node = proposal.draws[node][0][0]
        chain.append(tree.tokens[node])
    return chain
