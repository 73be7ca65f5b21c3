"""Buggy drafters and KV caches: each breaks one promise the decoding loop relies on.

The drafters draft with a small random Llama of their own (``self.model``, weights of scale 0.2,
so ``q`` is spread out) and answer ``draft(context, k, sampling, generator) -> Draft``, for
[`check.drafter`][minispec.check.drafting.drafter]. The caches subclass minispec's and break
``truncate_to``, for [`check.rollback`][minispec.check.caches.rollback]; build them with their
``for_model(model, num_slots, max_seq_len)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minispec.check.models import tiny_llama
from minispec.core.sampling import SamplingParams, probs_from_logits
from minispec.core.speculative import Draft
from minispec.models.kv_cache import ContiguousKVCache, KVCache
from minispec.models.paged_cache import PagedKVCache


def _sample(q: Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """A token drawn from ``q`` (its argmax at temperature 0)."""
    return int(q.argmax()) if sampling.greedy else int(torch.multinomial(q, 1, generator=generator))


class _TinyDrafter:
    """Drafts from a random tiny Llama, no cache (every step re-reads the whole context)."""

    def __init__(self, seed: int = 5) -> None:
        self.model = tiny_llama(64, seed=seed, scale=0.2)

    def draft(self, context, k, sampling, generator) -> Draft:
        """``k`` drafts after ``context``, each from ``choose``, with the declared rows."""
        ids, rows = list(context), []
        for _ in range(k):
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1]
            x, q = self.choose(logits, sampling, generator)
            ids.append(x)
            rows.append(q)
        probs = None if rows[0] is None else torch.stack(rows)
        return Draft(torch.tensor(ids[len(context):], dtype=torch.long), probs)

    def choose(self, logits: Tensor, sampling: SamplingParams,
               generator) -> tuple[int, Tensor | None]:
        """The next draft token and the ``q`` declared for it (``None``: one-hot)."""
        raise NotImplementedError


class ArgmaxDeclaredAsSampled(_TinyDrafter):
    """Bug: drafts the argmax of ``q`` but declares ``q`` itself as the law it was drawn from.

    The verifier then accepts with ``min(1, p(x) / q(x))`` a token that was never random: tokens
    ``q`` ranks first are over-represented at temperature > 0. Declaring ``q(x) = 1`` (one-hot)
    would have been exact, which is EAGLE's answer in the disputes over top-k tree drafting at
    T > 0: EAGLE #110, #183 and #221 (https://github.com/SafeAILab/EAGLE/issues/183,
    https://github.com/SafeAILab/EAGLE/issues/221).
    """

    def choose(self, logits, sampling, generator):
        q = probs_from_logits(logits, sampling)
        return int(q.argmax()), q


class SampledDeclaredDeterministic(_TinyDrafter):
    """Bug: samples its drafts from ``q`` but declares none (``probs=None``: one-hot).

    The output law stays exact -- the one-hot rule (accept with probability ``p(x)``, else draw
    from ``p`` without ``x``) is lossless for any proposal -- but acceptance falls from
    ``sum min(p, q)`` to ``sum q p``. The drafter's contract is broken, and the check says so.
    Mirrors vLLM PR #16899 (https://github.com/vllm-project/vllm/pull/16899, draft probabilities
    dropped) and #40149 (https://github.com/vllm-project/vllm/issues/40149, draft models verified
    with ``draft_probs=None``).
    """

    def choose(self, logits, sampling, generator):
        return _sample(probs_from_logits(logits, sampling), sampling, generator), None


class AdjustmentOnSampleOnly(_TinyDrafter):
    """Bug: samples from the adjusted ``q`` (temperature, top-p) but declares the raw softmax.

    The ``q`` the verifier divides by is not the one the token came from. Mirrors vLLM PR #10198
    (https://github.com/vllm-project/vllm/pull/10198): sampling parameters applied to one side of
    the ratio test and not the other.
    """

    def choose(self, logits, sampling, generator):
        x = _sample(probs_from_logits(logits, sampling), sampling, generator)
        return x, torch.softmax(logits.float(), dim=-1)


class OffByOneCache(ContiguousKVCache):
    """Bug: ``truncate_to(slot, n)`` keeps ``n + 1`` positions (one rejected draft survives).

    The next write happens to overwrite it, so logits look right; the length is wrong, and when
    every draft was accepted ``n + 1`` exceeds the length and the call fails.
    """

    def truncate_to(self, slot: int, n: int) -> None:
        KVCache.truncate_to(self, slot, n + 1)


class LeakyPagedCache(PagedKVCache):
    """Bug: ``truncate_to`` rolls the length back but returns no block to the pool.

    Decoding stays right, but every rejected draft that crossed a block boundary leaks a block:
    under load the pool runs dry and requests get preempted for nothing.
    """

    def truncate_to(self, slot: int, n: int) -> None:
        KVCache.truncate_to(self, slot, n)


class PagedCacheFreesPartialBlock(PagedKVCache):
    """Bug: ``truncate_to(slot, n)`` frees every block from ``n // block_size`` on, including the
    partly used block that still holds kept positions; their keys and values are lost."""

    def truncate_to(self, slot: int, n: int) -> None:
        KVCache.truncate_to(self, slot, n)
        self.blocks.truncate_to(slot, (n // self.block_size) * self.block_size)
