"""Buggy verifiers (Algorithm 1's accept loop) and tree walks, each with one real mistake.

Signatures: ``fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k+1, V], generator)
-> tokens`` for [`check.verifier`][minispec.check.chains.verifier];
``fn(tree, target_probs [N, V], draft_probs | None, generator) -> tokens`` for
[`check.tree_verifier`][minispec.check.trees.tree_verifier].
"""

from __future__ import annotations

import torch
from torch import Tensor

from minispec.core.sampling import one_hot

__all__ = ["UniformsSharedAcrossRows", "tree_bonus_from_parent_row", "tree_siblings_against_p",
           "verify_adjustment_on_bonus_row_only", "verify_bonus_from_wrong_row",
           "verify_continues_after_rejection", "verify_greedy_rows_shifted",
           "verify_one_uniform_for_all_positions", "verify_resample_from_p", "verify_seed_ignored"]


def _draw(probs: Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _q(draft_probs: Tensor | None, x: int, i: int, vocab: int) -> Tensor:
    """Row ``i`` of ``q`` (one-hot at the draft when ``draft_probs`` is None)."""
    return one_hot(torch.tensor(x), vocab) if draft_probs is None else draft_probs[i]


def _residual(p: Tensor, q: Tensor) -> Tensor:
    excess = (p - q).clamp_min(0)
    return excess / excess.sum() if excess.sum() > 0 else p


def _loop(draft_tokens, draft_probs, target_probs, generator, uniforms=None, bonus_row=None,
          resample_from_p=False, rng=True):
    """Algorithm 1 with switchable mistakes (``rng=False``: the global generator)."""
    g = generator if rng else None
    drafts, V = draft_tokens.tolist(), target_probs.shape[-1]
    k = len(drafts)
    for i, x in enumerate(drafts):
        q = _q(draft_probs, x, i, V)
        u = torch.rand((), generator=g) if uniforms is None else uniforms[i]
        if not u * q[x] < target_probs[i, x]:                  # rejected
            final = target_probs[i] if resample_from_p else _residual(target_probs[i], q)
            return drafts[:i] + [_draw(final, g)]
    return drafts + [_draw(target_probs[k if bonus_row is None else bonus_row], g)]


def verify_resample_from_p(draft_tokens, draft_probs, target_probs, generator):
    """Bug: on a rejection, the correction is drawn from ``p_i`` instead of the residual.

    The classic mistake, in the loop: every position that can reject over-represents the tokens
    ``q`` is generous with (they are accepted *and* resampled).
    """
    return _loop(draft_tokens, draft_probs, target_probs, generator, resample_from_p=True)


def verify_bonus_from_wrong_row(draft_tokens, draft_probs, target_probs, generator):
    """Bug: when all ``k`` drafts are accepted, the bonus token is drawn from row ``k - 1``.

    Row ``k - 1`` is the law of ``d_k`` itself, not of the token after it: an off-by-one in the
    bonus index. Only the joint law of the stream sees it (the first token is right).
    """
    return _loop(draft_tokens, draft_probs, target_probs, generator,
                 bonus_row=len(draft_tokens) - 1)


def verify_one_uniform_for_all_positions(draft_tokens, draft_probs, target_probs, generator):
    """Bug: one uniform ``u`` drawn per round and reused for every position.

    The accept events of ``d_1..d_k`` must be independent given the drafts; with one shared ``u``
    accepting ``d_1`` makes accepting ``d_2`` more likely, so long accepted runs are too frequent.
    """
    u = torch.rand((), generator=generator)
    return _loop(draft_tokens, draft_probs, target_probs, generator,
                 uniforms=[u] * len(draft_tokens))


class UniformsSharedAcrossRows:
    """Bug: the ``k`` uniforms are drawn once and reused for every row (and every later round).

    Batched code that draws ``torch.rand(k)`` instead of ``torch.rand(B, k)`` and broadcasts it
    gives every request in the batch the same accept decisions; here the rows are the successive
    calls. Mirrors vLLM #9441 (https://github.com/vllm-project/vllm/issues/9441) and 1Cat-vLLM
    #656 (https://github.com/1CatAI/1Cat-vLLM/issues/656): speculative output corrupted only when
    several requests share a batch.
    """

    def __init__(self) -> None:
        self.uniforms: dict[int, Tensor] = {}

    def __call__(self, draft_tokens, draft_probs, target_probs, generator):
        k = len(draft_tokens)
        if k not in self.uniforms:
            self.uniforms[k] = torch.rand(k, generator=generator)
        return _loop(draft_tokens, draft_probs, target_probs, generator, uniforms=self.uniforms[k])


def verify_continues_after_rejection(draft_tokens, draft_probs, target_probs, generator):
    """Bug: after a rejection the loop replaces that draft and goes on testing the next ones.

    The drafts after a rejected one were drafted (and scored by the target) after a token that is
    no longer there; Algorithm 1 must stop at the first rejection.
    """
    drafts, V, out = draft_tokens.tolist(), target_probs.shape[-1], []
    for i, x in enumerate(drafts):
        q = _q(draft_probs, x, i, V)
        if torch.rand((), generator=generator) * q[x] < target_probs[i, x]:
            out.append(x)
        else:
            out.append(_draw(_residual(target_probs[i], q), generator))
    return out + [_draw(target_probs[len(drafts)], generator)]


def verify_seed_ignored(draft_tokens, draft_probs, target_probs, generator):
    """Bug: the right rule, with random numbers from torch's global generator.

    The law is exact; the tokens do not depend on the request's seed. Mirrors vLLM #13196
    (https://github.com/vllm-project/vllm/issues/13196): "Speculative decoding output does not
    change when changing seed".
    """
    return _loop(draft_tokens, draft_probs, target_probs, generator, rng=False)


def verify_adjustment_on_bonus_row_only(draft_tokens, draft_probs, target_probs, generator):
    """Bug: the drafted rows and the bonus row carry different sampling adjustments.

    Here the ``k`` drafted rows get an extra temperature of 2 (``p^(1/2)``, renormalised) that the
    bonus row does not: the accepted tokens follow another law than the bonus. Mirrors the
    penalties that reached only part of the speculative path: vLLM #18902
    (https://github.com/vllm-project/vllm/issues/18902), sglang PR #28242
    (https://github.com/sgl-project/sglang/pull/28242, penalty on the bonus position only) and
    TensorRT-LLM PR #17701 (https://github.com/NVIDIA/TensorRT-LLM/pull/17701).
    """
    rows = target_probs.clone()
    k = len(draft_tokens)
    rows[:k] = rows[:k].sqrt() / rows[:k].sqrt().sum(dim=-1, keepdim=True)
    return _loop(draft_tokens, draft_probs, rows, generator)


def verify_greedy_rows_shifted(draft_tokens, draft_probs, target_probs, generator):
    """Bug: greedy verify compares ``d_i`` with the argmax of row ``i + 1`` (an off-by-one).

    Row ``i`` of ``target_probs`` is the target's law *for* ``d_{i+1}`` (it comes from the logits
    at the position before it); reading the logits one position late is the classic shift error.
    """
    drafts, best = draft_tokens.tolist(), target_probs.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == best[n + 1]:
        n += 1
    return drafts[:n] + [best[n]]


def _walk(tree, target_probs, draft_probs, generator, *, sibling_residual=True, leaf_row=None):
    """SpecInfer's walk with switchable mistakes; ``leaf_row(node)`` picks the bonus row."""
    node, depth, out, V = 0, 0, [], target_probs.shape[-1]
    p = target_probs[0]
    while True:
        through = [j for j, nodes in enumerate(tree.draft_nodes)
                   if len(nodes) > depth and (depth == 0 or nodes[depth - 1] == node)]
        chosen, q = None, None
        for j in through:
            child = tree.draft_nodes[j][depth]
            x = tree.tokens[child]
            q = _q(None if draft_probs is None else draft_probs[j], x, depth, V)
            if torch.rand((), generator=generator) * q[x] < p[x]:
                chosen = child
                break
            if sibling_residual:
                p = _residual(p, q)
        if chosen is None:
            final = p if sibling_residual or q is None else _residual(p, q)
            if not through and leaf_row is not None:
                final = target_probs[leaf_row(node)]
            return out + [_draw(final, generator)]
        out.append(tree.tokens[chosen])
        node, depth, p = chosen, depth + 1, target_probs[chosen]


def tree_siblings_against_p(tree, target_probs, draft_probs, generator):
    """Bug: each child of a node is tested against the node's ``p``, not against what the earlier
    siblings' rejections left (the residual).

    Applying the single-proposal rule to every child independently over-accepts: a later sibling
    is judged as if the earlier ones had never been tried. SpecInfer's multi-round rule
    (Stratos §2) updates ``p <- norm(max(0, p - q_j))`` after each rejected child. The same
    question was argued in EAGLE #110, #183 and #221
    (https://github.com/SafeAILab/EAGLE/issues/221) for top-k tree drafting at T > 0.
    """
    return _walk(tree, target_probs, draft_probs, generator, sibling_residual=False)


def tree_bonus_from_parent_row(tree, target_probs, draft_probs, generator):
    """Bug: at a leaf (every draft token on the path accepted), the bonus token is drawn from the
    parent's row instead of the leaf's own: the tree form of the bonus off-by-one."""
    return _walk(tree, target_probs, draft_probs, generator,
                 leaf_row=lambda node: tree.parents[node])
