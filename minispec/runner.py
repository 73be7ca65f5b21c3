"""The model work of one continuous-batching step: prefill, batched draft, batched verify, rollback.

:class:`SpeculativeRunner` (named after the design it follows) owns the target model, the optional
draft model and their two KV caches. The :class:`~minispec.engine.Engine` decides *which* sequences
run (through the scheduler) and what becomes of the tokens (stop conditions, outputs); the runner
turns a batch of sequences into one verdict per sequence, touching only the caches and the stats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from minispec.model import Llama
from minispec.sampling import SamplingParams, probs_from_logits, sample
from minispec.sequence import Sequence
from minispec.speculative import verify_batch, verify_greedy

__all__ = ["SpeculativeRunner"]


@dataclass
class _Proposal:
    """One row's drafts: ``tokens`` (k_row ids) and ``probs`` (k_row, V) or ``None`` (one-hot q)."""

    tokens: list[int]
    probs: Tensor | list[Tensor] | None


class SpeculativeRunner:
    """Batched prefill, draft, verify and rollback over the target's (and draft's) KV cache.

    1. **prefill** (:meth:`prefill`) the newly admitted: one batched target forward over
       ``context[:-1]`` (rows right-padded with position -1). The draft model is *not* prefilled
       here: on a request's first draft step its whole context is fed (lazy prefill, also after a
       preemption);
    2. **draft**, batched: ``k`` draft-model forwards over all running requests -- the first feeds
       each row what its draft cache lacks (1 token, 2 after a fully accepted round since the
       draft lags by one, left-padded with -1), the next ones feed the previous draft; every row
       turns its logits into ``q`` with its own ``SamplingParams`` and samples with its own
       generator. With an n-gram drafter, each request's own table proposes up to ``k`` tokens;
    3. **verify**: one target forward over ``[B, k+1]`` -- row ``b`` feeds ``[last, d_1..d_kb]`` at
       positions ``n_b-1..`` (short rows padded with -1) -- then ``verify_batch`` per group of rows
       with the same number of drafts (greedy and sampled rows mixed, one generator per row), so
       each request draws exactly what :func:`minispec.speculative_generate` would;
    4. **rollback** each request's target cache to ``n + accepted`` and its draft cache to what
       it validly holds.

    Steps 2-4 are one :meth:`round`. The counters ``target_forwards``, ``draft_forwards`` and
    ``prefill_forwards`` count batched forwards, whatever the batch size.

    Args:
        target: the target model ``p``; the runner works on its device.
        draft: the draft model ``q``, or ``None`` (then each sequence's own drafter proposes, or
            nothing does: plain decoding).
        target_cache, draft_cache: the KV caches, with the slots the scheduler gave each sequence
            (``seq.slot``, ``seq.draft_slot``) already reserved for the round.
    """

    def __init__(self, target: Llama, draft: Llama | None, target_cache, draft_cache=None) -> None:
        self.target, self.draft, self.device = target, draft, target.device
        self.target_cache, self.draft_cache = target_cache, draft_cache
        self.target_forwards = self.draft_forwards = self.prefill_forwards = 0

    def prefill(self, seqs: list[Sequence]) -> None:
        """Batched target prefill of ``context[:-1]`` (right-padded); logits are discarded."""
        rows = [(s, s.context[:-1]) for s in seqs if s.num_tokens > 1]
        if not rows:
            return
        width = max(len(ids) for _, ids in rows)
        ids = [t + [0] * (width - len(t)) for _, t in rows]
        pos = [list(range(len(t))) + [-1] * (width - len(t)) for _, t in rows]
        self._forward(self.target, self.target_cache, ids, pos, [s.slot for s, _ in rows])
        self.prefill_forwards += 1
        for seq, t in rows:
            seq.stats.prefill_tokens += len(t)

    def round(self, batch: list[Sequence], ks: list[int]) -> list[tuple[_Proposal, object]]:
        """Draft ``ks[b]`` tokens for row ``b``, verify all rows at once, roll back each cache.

        Records the round in every sequence's stats and returns one ``(proposal, verdict)`` per
        row; a verdict has ``tokens`` (1..k_b+1 ids to append) and ``num_accepted``. The
        sequences' tokens are not touched: appending and stopping are the engine's job.
        """
        t0 = time.perf_counter()
        if self.draft is not None:
            proposals = self._draft_model(batch, ks)
        else:
            proposals = [self._draft_table(seq, k) for seq, k in zip(batch, ks, strict=True)]
        t1 = time.perf_counter()
        logits = self._verify_forward(batch, proposals)                  # (B, K+1, V)
        verdicts = self._verify(batch, proposals, logits)
        t2 = time.perf_counter()
        for seq, prop, verdict in zip(batch, proposals, verdicts, strict=True):
            seq.stats.draft_time += t1 - t0      # the batch's time, shared by its requests
            seq.stats.verify_time += t2 - t1
            seq.stats.record_round(len(prop.tokens), verdict.num_accepted)
            self._rollback(seq, verdict.num_accepted)
        return list(zip(proposals, verdicts, strict=True))

    # ------------------------------------------------------------------ draft

    def _draft_table(self, seq: Sequence, k: int) -> _Proposal:
        """A per-request deterministic drafter's proposal (or none without a drafter)."""
        if k == 0 or seq.drafter is None:
            return _Proposal([], None)
        draft = seq.drafter.propose(seq.context, k, seq.sampling, seq.generator)
        probs = None if draft.probs is None else draft.probs[:k].to(self.device)
        return _Proposal(draft.tokens.tolist()[:k], probs)

    def _draft_model(self, batch: list[Sequence], ks: list[int]) -> list[_Proposal]:
        """``max(ks)`` batched draft forwards; row ``b`` samples ``ks[b]`` tokens with its own q."""
        props = [_Proposal([], []) for _ in batch]
        active = [b for b, k in enumerate(ks) if k > 0]
        feeds = {b: batch[b].context[batch[b].draft_len:] for b in active}  # what the cache lacks
        long = [b for b in active if len(feeds[b]) > 2]         # lazy prefill / after preemption
        if long:
            self._draft_forward([batch[b] for b in long], [feeds[b][:-1] for b in long])
            for b in long:
                feeds[b] = feeds[b][-1:]
        for j in range(max(ks, default=0)):
            rows = [b for b in active if ks[b] > j]
            seqs = [batch[b] for b in rows]
            logits = self._draft_forward(seqs, [feeds[b] for b in rows])          # (R, V)
            argmax = logits.argmax(dim=-1).tolist()                               # (R,)
            slow = [r for r, s in enumerate(seqs) if not _plain_greedy(s.sampling)]
            q = dict(zip(slow, self._probs(logits[slow], [seqs[r] for r in slow],
                                           [props[rows[r]].tokens for r in slow]), strict=True))
            for r, (seq, b) in enumerate(zip(seqs, rows, strict=True)):
                if r not in q:            # plain greedy: the argmax, no distribution needed
                    token = argmax[r]
                else:                     # q[r] (V,): sampled with the request's own generator
                    token = int(q[r].argmax()) if seq.sampling.greedy else int(sample(q[r], seq.generator))
                    props[b].probs.append(q[r])
                props[b].tokens.append(token)
                feeds[b] = [token]     # fed next step; the last draft of a row is never fed
        for p in props:
            p.probs = torch.stack(p.probs) if p.probs else None                  # (k_b, V)
        return props

    def _draft_forward(self, seqs: list[Sequence], feeds: list[list[int]]) -> Tensor:
        """Feed each row's tokens (left-padded) to the draft model; logits after the last (R, V)."""
        width = max(len(f) for f in feeds)
        ids = [[0] * (width - len(f)) + f for f in feeds]
        pos = [[-1] * (width - len(f)) + list(range(s.draft_len, s.draft_len + len(f)))
               for s, f in zip(seqs, feeds, strict=True)]
        logits = self._forward(self.draft, self.draft_cache, ids, pos, [s.draft_slot for s in seqs])
        self.draft_forwards += 1
        for seq, f in zip(seqs, feeds, strict=True):
            seq.draft_len += len(f)
            seq.stats.draft_forwards += 1
        return logits[:, -1]                                                      # (R, V)

    # ------------------------------------------------------------------ verify and rollback

    def _verify_forward(self, batch: list[Sequence], props: list[_Proposal]) -> Tensor:
        """One target forward: row b feeds ``[last, d_1..d_kb]`` at ``n_b-1..``; (B, K+1, V)."""
        width = 1 + max(len(p.tokens) for p in props)
        ids, pos = [], []
        for seq, p in zip(batch, props, strict=True):
            row, pad, n = [seq.context[-1]] + p.tokens, width - 1 - len(p.tokens), seq.num_tokens
            ids.append(row + [0] * pad)
            pos.append(list(range(n - 1, n - 1 + len(row))) + [-1] * pad)
        self.target_forwards += 1
        return self._forward(self.target, self.target_cache, ids, pos, [s.slot for s in batch])

    def _verify(self, batch: list[Sequence], props: list[_Proposal], logits: Tensor) -> list:
        """Per-request accept/reject (``logits`` (B, K+1, V)); returns one verdict per row.

        Plain greedy rows accept drafts while they equal the target's argmax (what ``verify``
        does on one-hot rows, without building them); the others go through ``verify_batch``,
        one call per group of rows with the same number of drafts, one generator per row.
        """
        verdicts: list = [None] * len(batch)
        fast = [b for b, seq in enumerate(batch) if _plain_greedy(seq.sampling)]
        best = logits[fast].argmax(dim=-1).tolist() if fast else []              # (F, K+1)
        for b, row in zip(fast, best, strict=True):
            verdicts[b] = verify_greedy(props[b].tokens, row)
        groups: dict[int, list[int]] = {}
        for b in range(len(batch)):
            if verdicts[b] is None:
                groups.setdefault(len(props[b].tokens), []).append(b)
        for kk, rows in groups.items():
            drafts = torch.tensor([props[b].tokens for b in rows], dtype=torch.long,
                                  device=self.device).reshape(len(rows), kk)     # (G, kk)
            q = None
            if kk > 0 and any(props[b].probs is not None for b in rows):
                q = torch.stack([_one_hot_if_none(props[b], logits.shape[-1], self.device) for b in rows])
            # row b, position t: p(. | context, d_1..d_t)
            p = torch.stack([self._probs(logits[b, :kk + 1], [batch[b]] * (kk + 1),
                                         [props[b].tokens[:t] for t in range(kk + 1)]) for b in rows])
            for b, v in zip(rows, verify_batch(drafts, q, p, [batch[b].generator for b in rows]),
                            strict=True):
                verdicts[b] = v                                                   # p: (G, kk+1, V)
        return verdicts

    def _probs(self, logits: Tensor, seqs: list[Sequence], drafts: list[list[int]]) -> Tensor:
        """Adjusted distributions (N, V) of ``logits`` (N, V); row i uses ``seqs[i]``'s sampling
        and sees ``seqs[i].context + drafts[i]`` (for the repetition penalty)."""
        if not seqs:
            return logits.float()
        contexts = None
        if any(s.sampling.repetition_penalty != 1 for s in seqs):
            contexts = [s.context + d for s, d in zip(seqs, drafts, strict=True)]
        return _adjusted_probs(logits, [s.sampling for s in seqs], contexts)

    def _rollback(self, seq: Sequence, accepted: int) -> None:
        """Keep ``[.., last, accepted drafts]`` in the target cache, the valid prefix in the draft's."""
        keep = seq.num_tokens + accepted
        self.target_cache.truncate_to(seq.slot, keep)
        if self.draft_cache is not None and seq.draft_len > keep:
            self.draft_cache.truncate_to(seq.draft_slot, keep)
            seq.draft_len = keep

    def _forward(self, model: Llama, cache, ids: list[list[int]], pos: list[list[int]],
                 slots: list[int]) -> Tensor:
        """``model`` on (B, T) ids at (B, T) positions (-1 = padding) of cache ``slots``; (B, T, V)."""
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)          # (B, T)
        pos_t = torch.tensor(pos, dtype=torch.long, device=self.device)          # (B, T)
        return model(ids_t, pos_t, cache, slots)


# ---------------------------------------------------------------------- helpers


def _adjusted_probs(logits: Tensor, params: list[SamplingParams],
                    contexts: list[list[int]] | None) -> Tensor:
    """``probs_from_logits`` row by row with each row's params, batched per equal transform.

    Args: logits (N, V); params — one per row; contexts — row i's context for the repetition
    penalty (None when no row uses one). Returns (N, V) float32.
    """
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)   # (N, V)
    groups: dict[tuple, list[int]] = {}
    for r, sp in enumerate(params):
        groups.setdefault((sp.temperature, sp.top_k, sp.top_p, sp.repetition_penalty), []).append(r)
    for rows in groups.values():
        sp = params[rows[0]]
        ctx = [contexts[r] for r in rows] if contexts is not None and sp.repetition_penalty != 1 else None
        index = torch.tensor(rows, device=logits.device)
        out[index] = probs_from_logits(logits[index], sp, context_ids=ctx)
    return out


def _plain_greedy(sampling: SamplingParams) -> bool:
    """Greedy without a repetition penalty: the argmax of the raw logits decides."""
    return sampling.greedy and sampling.repetition_penalty == 1


def _one_hot_if_none(prop: _Proposal, vocab: int, device: torch.device) -> Tensor:
    """A row's q (k, V); one-hot at the drafts when the drafter is deterministic."""
    if prop.probs is not None:
        return prop.probs
    tokens = torch.tensor(prop.tokens, dtype=torch.long, device=device)[:, None]   # (k, 1)
    return torch.zeros(len(prop.tokens), vocab, device=device).scatter_(-1, tokens, 1.0)
