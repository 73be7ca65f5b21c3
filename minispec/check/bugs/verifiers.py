"""Buggy verifiers (Algorithm 1's accept loop) and tree walks, each with one real mistake.

Signatures: ``fn(draft_tokens [k], draft_probs [k, V] | None, target_probs [k+1, V], generator)
-> tokens`` for [`check.verifier`][minispec.check.markov.verifier];
``fn(tree, target_probs [N, V], draft_probs | None, generator) -> tokens`` for
[`check.tree_verifier`][minispec.check.markov.tree_verifier].
"""

from __future__ import annotations

import torch
from torch import Tensor

from minispec.core.sampling import one_hot
from minispec.core.speculative import residual, verify
from minispec.core.tree import Proposal


def _draw(probs: Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _q(draft_probs: Tensor | None, x: int, i: int, vocab: int) -> Tensor:
    """Row ``i`` of ``q`` (one-hot at the draft when ``draft_probs`` is None)."""
    return one_hot(torch.tensor(x), vocab) if draft_probs is None else draft_probs[i]


def _accepts(draft_probs, target_probs, i: int, x: int, generator) -> tuple[bool, Tensor]:
    """Algorithm 1's test of draft ``x`` at position ``i``, and the ``q`` row it used."""
    q = _q(draft_probs, x, i, target_probs.shape[-1])
    return bool(torch.rand((), generator=generator) * q[x] < target_probs[i, x]), q


def verify_resample_from_p(draft_tokens, draft_probs, target_probs, generator):
    """Bug: on a rejection, the correction is drawn from ``p_i`` instead of the residual.

    The classic mistake, in the loop: every position that can reject over-represents the tokens
    ``q`` is generous with (they are accepted *and* resampled).
    """
    drafts = draft_tokens.tolist()
    for i, x in enumerate(drafts):
        if not _accepts(draft_probs, target_probs, i, x, generator)[0]:
            return drafts[:i] + [_draw(target_probs[i], generator)]   # should be the residual
    return drafts + [_draw(target_probs[len(drafts)], generator)]


def verify_bonus_from_wrong_row(draft_tokens, draft_probs, target_probs, generator):
    """Bug: when all ``k`` drafts are accepted, the bonus token is drawn from row ``k - 1``.

    Row ``k - 1`` is the law of ``d_k`` itself, not of the token after it: an off-by-one in the
    bonus index. Only the joint law of the stream sees it (the first token is right).
    """
    rows = target_probs.clone()
    rows[-1] = target_probs[-2]               # the bonus row replaced by the one before it
    return verify(Proposal.chain(draft_tokens, draft_probs), rows, generator).tokens


def verify_one_uniform_for_all_positions(draft_tokens, draft_probs, target_probs, generator):
    """Bug: one uniform ``u`` drawn per round and reused for every position.

    The accept events of ``d_1..d_k`` must be independent given the drafts; with one shared ``u``
    accepting ``d_1`` makes accepting ``d_2`` more likely, so long accepted runs are too frequent.
    """
    u = torch.rand((), generator=generator)
    return verify(Proposal.chain(draft_tokens, draft_probs), target_probs, generator,
                  uniforms=u.expand(len(draft_tokens))).tokens


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
        return verify(Proposal.chain(draft_tokens, draft_probs), target_probs, generator,
                      uniforms=self.uniforms[k]).tokens


def verify_continues_after_rejection(draft_tokens, draft_probs, target_probs, generator):
    """Bug: after a rejection the loop replaces that draft and goes on testing the next ones.

    The drafts after a rejected one were drafted (and scored by the target) after a token that is
    no longer there; Algorithm 1 must stop at the first rejection.
    """
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        accepted, q = _accepts(draft_probs, target_probs, i, x, generator)
        out.append(x if accepted else _draw(residual(target_probs[i], q), generator))
    return out + [_draw(target_probs[len(draft_tokens)], generator)]


def verify_seed_ignored(draft_tokens, draft_probs, target_probs, generator):
    """Bug: the right rule, with random numbers from torch's global generator.

    The law is exact; the tokens do not depend on the request's seed. Mirrors vLLM #13196
    (https://github.com/vllm-project/vllm/issues/13196): "Speculative decoding output does not
    change when changing seed".
    """
    return verify(Proposal.chain(draft_tokens, draft_probs), target_probs, None).tokens


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
    rows[:-1] = rows[:-1].sqrt() / rows[:-1].sqrt().sum(dim=-1, keepdim=True)
    return verify(Proposal.chain(draft_tokens, draft_probs), rows, generator).tokens


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


def tree_siblings_against_p(tree, target_probs, draft_probs, generator):
    """Bug: each child of a node is tested against the node's ``p``, not against what the earlier
    siblings' rejections left (the residual).

    Applying the single-proposal rule to every child independently over-accepts: a later sibling
    is judged as if the earlier ones had never been tried. SpecInfer's multi-round rule
    (Stratos §2) updates ``p <- norm(max(0, p - q_j))`` after each rejected child. The same
    question was argued in EAGLE #110, #183 and #221
    (https://github.com/SafeAILab/EAGLE/issues/221) for top-k tree drafting at T > 0.
    """
    node, depth, out = 0, 0, []
    while True:
        p, q, chosen = target_probs[node], None, None
        for j, nodes in enumerate(tree.draft_nodes):          # the drafts through this node
            if len(nodes) > depth and (nodes[depth - 1] if depth else 0) == node:
                x = tree.tokens[nodes[depth]]
                q = _q(None if draft_probs is None else draft_probs[j], x, depth, p.shape[-1])
                if torch.rand((), generator=generator) * q[x] < p[x]:   # p: never updated
                    chosen = nodes[depth]
                    break
        if chosen is None:
            return out + [_draw(p if q is None else residual(p, q), generator)]
        out.append(tree.tokens[chosen])
        node, depth = chosen, depth + 1


def tree_bonus_from_parent_row(tree, target_probs, draft_probs, generator):
    """Bug: at a leaf (every draft token on the path accepted), the bonus token is drawn from the
    parent's row instead of the leaf's own: the tree form of the bonus off-by-one."""
    rows = target_probs.clone()
    for node in range(1, len(tree)):
        if not tree.children(node):         # a leaf's row only ever gives its bonus token
            rows[node] = target_probs[tree.parents[node]]
    return verify(Proposal.from_tree(tree, draft_probs), rows, generator).tokens
