"""A continuous-batching speculative decoding engine: many requests, one batched round per step.

Requests come and go while the engine runs (continuous batching): :meth:`Engine.add_request`
queues one, :meth:`Engine.step` runs one speculative round for every running request and returns
the tokens it produced, :meth:`Engine.generate` drives the loop for a list of prompts. See
:class:`Engine` for what one step does, :mod:`minispec.scheduler` for admission and preemption,
:mod:`minispec.sequence` for a request's state.
"""

from __future__ import annotations

import copy
import itertools
import os
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from tqdm import tqdm

from minispec.decoding import GenerationResult, Round
from minispec.drafters import ModelDrafter, NGramDrafter, PromptLookupDrafter
from minispec.kv_cache import ContiguousKVCache
from minispec.model import Llama
from minispec.sampling import SamplingParams, probs_from_logits, sample
from minispec.scheduler import KVCacheSpace, Scheduler
from minispec.sequence import Sequence
from minispec.speculative import verify_batch
from minispec.stats import SpecStats

__all__ = ["DRAFTERS", "Engine", "StepOutput"]

#: Deterministic drafters the engine can make per request, by name.
DRAFTERS: dict[str, Callable[[], object]] = {"ngram": NGramDrafter, "prompt_lookup": PromptLookupDrafter}


@dataclass(frozen=True)
class StepOutput:
    """One emitted token of one request (a speculative round may emit several per request).

    Attributes: request_id; token — the token id (``None`` only for a request that ends without
    any token: ``max_new_tokens=0`` or a prompt filling the context); index — its position among
    the request's new tokens; finish_reason and stats (the request's ``SpecStats``) — set on the
    request's last output only.
    """

    request_id: str
    token: int | None
    index: int
    finish_reason: str | None = None
    stats: SpecStats | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class _Accepted:
    """A plain greedy row's verdict: the tokens to append and how many drafts were accepted."""

    tokens: list[int]
    num_accepted: int


@dataclass
class _Proposal:
    """One row's drafts: ``tokens`` (k_row ids) and ``probs`` (k_row, V) or ``None`` (one-hot q)."""

    tokens: list[int]
    probs: Tensor | list[Tensor] | None


class Engine:
    """Continuous batching with speculative decoding: batched draft, one batched verify per step.

    Args:
        target: the target model ``p``; the engine runs on its device.
        draft: a draft model ``q`` (same vocabulary and EOS ids), or ``None``.
        drafter: instead of ``draft``, a deterministic drafter: ``"ngram"``, ``"prompt_lookup"``,
            an ``NGramDrafter``/``PromptLookupDrafter`` to copy, or a factory; one per request.
        k: drafts per round (gamma), >= 1 with a draft or drafter; ignored without (plain decoding).
        max_batch_size: most requests running at once.
        kv_cache: ``"paged"`` (a block pool shared by all requests) or ``"contiguous"``.
        block_size, num_blocks: the paged pool's shape (default: room for every slot to be full);
            the draft's pool gets the same number of blocks. A small pool forces preemption.
        max_seq_len: limit on prompt + new tokens (default and maximum: the models' context).

    One :meth:`step`:

    1. **schedule** -- retire finished requests, reserve ``n + k_round`` cache positions for each
       running request (preempting the newest by recompute when the pool is short), admit waiting
       requests (FIFO) while the batch and the pool have room;
    2. **prefill** the newly admitted: one batched target forward over ``context[:-1]`` (rows
       right-padded with position -1). The draft model is *not* prefilled here: on a request's
       first draft step its whole context is fed (lazy prefill, also after a preemption);
    3. **draft**, batched: ``k`` draft-model forwards over all running requests -- the first feeds
       each row what its draft cache lacks (1 token, 2 after a fully accepted round since the
       draft lags by one, left-padded with -1), the next ones feed the previous draft; every row
       turns its logits into ``q`` with its own ``SamplingParams`` and samples with its own
       generator. With an n-gram drafter, each request's own table proposes up to ``k`` tokens;
    4. **verify**: one target forward over ``[B, k+1]`` -- row ``b`` feeds ``[last, d_1..d_kb]`` at
       positions ``n_b-1..`` (short rows padded with -1) -- then ``verify_batch`` per group of rows
       with the same number of drafts (greedy and sampled rows mixed, one generator per row), so
       each request draws exactly what :func:`minispec.speculative_generate` would;
    5. **rollback** each request's target cache to ``n + accepted`` and its draft cache to what
       it validly holds; **emit** one :class:`StepOutput` per token, ending a request exactly at
       an EOS / stop token / ``max_new_tokens`` inside the accepted block, or at ``max_seq_len``.

    ``k`` shrinks per request near ``max_seq_len`` and ``max_new_tokens`` as in the single-sequence
    loop, so greedy output equals ``speculative_generate`` and plain ``generate`` token for token
    (up to float near-ties between batched and unbatched matmuls), and sampled output keeps the
    target's law. Without a draft, every step is one plain decoding step for the whole batch.
    """

    def __init__(self, target: Llama, draft: Llama | None = None, drafter=None, k: int = 4,
                 max_batch_size: int = 8, kv_cache: str = "paged", block_size: int = 16,
                 num_blocks: int | None = None, max_seq_len: int | None = None) -> None:
        if isinstance(draft, ModelDrafter):
            draft = draft.model
        _validate(target, draft, drafter, k, max_batch_size, kv_cache, block_size, num_blocks, max_seq_len)
        self.target, self.draft, self.device = target, draft, target.device
        self.new_drafter = _drafter_factory(drafter)
        self.k = k if (draft is not None or drafter is not None) else 0
        models = [target] if draft is None else [target, draft]
        self.max_seq_len = min([max_seq_len or target.config.max_position_embeddings]
                               + [m.config.max_position_embeddings for m in models])
        make = _cache_factory(kv_cache, max_batch_size, self.max_seq_len, block_size, num_blocks)
        self.target_cache = make(target)
        self.draft_cache = make(draft) if draft is not None else None
        self.scheduler = Scheduler(KVCacheSpace(self.target_cache, self.draft_cache),
                                   max_batch_size, self.k, self.max_seq_len)
        self.eos = set(target.config.eos_token_ids)
        self.target_forwards = self.draft_forwards = self.prefill_forwards = 0
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}
        self._pending: list[StepOutput] = []
        self._collect: set[str] = set()
        self._results: dict[str, GenerationResult] = {}

    # ------------------------------------------------------------------ public API

    def add_request(self, prompt_ids: Seq[int], sampling: SamplingParams | None = None,
                    request_id: str | None = None, max_new_tokens: int = 64,
                    stop_token_ids: Seq[int] = ()) -> str:
        """Queue a request; returns its id. ``sampling`` defaults to greedy.

        Raises ValueError for an empty or too long prompt, a negative ``max_new_tokens``, a
        duplicate id, or a request that could never fit in the KV pool.
        """
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(prompt_ids) > self.max_seq_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens but max_seq_len is {self.max_seq_len}")
        seq = Sequence(request_id, list(prompt_ids), sampling or SamplingParams(temperature=0.0),
                       max_new_tokens, frozenset(stop_token_ids), self.device,
                       self.new_drafter() if self.new_drafter else None)
        seq.stats = SpecStats(k=self.k, prefill_tokens=0)
        if max_new_tokens == 0 or seq.num_tokens >= self.max_seq_len:   # ends before any round
            seq.finish("length" if max_new_tokens == 0 else "max_seq_len")
            self._pending.append(StepOutput(request_id, None, -1, seq.finish_reason, seq.stats))
        else:
            self.scheduler.add(seq)
        self._sequences[request_id] = seq
        if seq.is_finished:
            self._done(seq)
        return request_id

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running, or outputs are still to be returned."""
        return self.scheduler.has_unfinished() or bool(self._pending)

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Schedule, prefill, draft, verify, roll back, emit (see :class:`Engine`)."""
        outputs, self._pending = self._pending, []
        plan = self.scheduler.schedule()
        if plan.admitted:
            self._prefill(plan.admitted)
        if plan.running:
            outputs += self._round(plan.running)
            self.scheduler.retire()
        return outputs

    def generate(self, prompts: Seq[Seq[int]], sampling: SamplingParams | Seq[SamplingParams] | None = None,
                 progress: bool = True, max_new_tokens: int = 64,
                 stop_token_ids: Seq[int] = ()) -> list[GenerationResult]:
        """Run ``prompts`` to completion; results in prompt order (the type ``generate`` returns).

        ``sampling``: one ``SamplingParams`` for all (each request seeds its own generator from
        it), or one per prompt. A tqdm bar counts finished requests unless ``progress=False`` or
        the environment sets ``TQDM_DISABLE``.
        """
        samplings = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(samplings) != len(prompts):
            raise ValueError(f"{len(samplings)} SamplingParams for {len(prompts)} prompts")
        ids = []
        for prompt, sp in zip(prompts, samplings, strict=True):
            rid = str(next(self._ids))
            self._collect.add(rid)
            ids.append(self.add_request(prompt, sp, rid, max_new_tokens, stop_token_ids))
        disable = not progress or os.environ.get("TQDM_DISABLE", "") not in ("", "0")
        with tqdm(total=len(ids), disable=disable, desc="requests", unit="req") as bar:
            wanted = set(ids)
            while any(rid not in self._results for rid in ids):
                bar.update(sum(out.finished and out.request_id in wanted for out in self.step()))
        return [self._results.pop(rid) for rid in ids]

    # ------------------------------------------------------------------ one step

    def _prefill(self, seqs: list[Sequence]) -> None:
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

    def _round(self, batch: list[Sequence]) -> list[StepOutput]:
        """One speculative round for every running request; returns the emitted tokens."""
        ks = [seq.round_k(self.k, self.max_seq_len) for seq in batch]
        t0 = time.perf_counter()
        if self.draft is not None:
            proposals = self._draft_model(batch, ks)
        else:
            proposals = [self._draft_table(seq, k) for seq, k in zip(batch, ks, strict=True)]
        t1 = time.perf_counter()
        logits = self._verify_forward(batch, proposals)                  # (B, K+1, V)
        verdicts = self._verify(batch, proposals, logits)
        t2 = time.perf_counter()
        outputs: list[StepOutput] = []
        for seq, prop, verdict in zip(batch, proposals, verdicts, strict=True):
            seq.stats.draft_time += t1 - t0      # the batch's time, shared by its requests
            seq.stats.verify_time += t2 - t1
            seq.stats.record_round(len(prop.tokens), verdict.num_accepted)
            self._rollback(seq, verdict.num_accepted)
            outputs += self._emit(seq, prop, verdict)
        return outputs

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
            drafts, accepted = props[b].tokens, 0
            while accepted < len(drafts) and drafts[accepted] == row[accepted]:
                accepted += 1
            verdicts[b] = _Accepted(drafts[:accepted] + [row[accepted]], accepted)
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

    def _emit(self, seq: Sequence, prop: _Proposal, verdict) -> list[StepOutput]:
        """Append the verdict's tokens, stopping exactly at EOS / stop id / max_new_tokens."""
        emitted, finish = [], None
        for token in verdict.tokens:
            emitted.append(token)
            seq.generated.append(token)
            if token in self.eos or token in seq.stop_token_ids:
                finish = "eos" if token in self.eos else "stop"
            elif len(seq.generated) >= seq.max_new_tokens:
                finish = "length"
            else:
                continue
            break
        if finish is None and seq.num_tokens >= self.max_seq_len:
            finish = "max_seq_len"
        seq.rounds.append(Round(prop.tokens, verdict.num_accepted, emitted))
        start = len(seq.generated) - len(emitted)
        outs = [StepOutput(seq.request_id, t, start + i) for i, t in enumerate(emitted)]
        if finish is not None:
            seq.finish(finish)
            outs[-1] = replace(outs[-1], finish_reason=finish, stats=seq.stats)
            self._done(seq)
        return outs

    def _done(self, seq: Sequence) -> None:
        """Forget a finished request, keeping its result if ``generate`` waits for it."""
        del self._sequences[seq.request_id]
        if seq.request_id in self._collect:
            self._collect.discard(seq.request_id)
            self._results[seq.request_id] = GenerationResult(
                list(seq.generated), None, seq.finish_reason, seq.stats, seq.rounds)

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


def _drafter_factory(drafter) -> Callable[[], object] | None:
    """A function making one fresh deterministic drafter per request (or None)."""
    if drafter is None:
        return None
    if isinstance(drafter, str):
        if drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {drafter!r}; choose one of {sorted(DRAFTERS)}")
        return DRAFTERS[drafter]
    if isinstance(drafter, ModelDrafter):
        raise ValueError("pass a draft model as draft=..., not as a ModelDrafter drafter")
    if hasattr(drafter, "propose"):
        return lambda: copy.deepcopy(drafter)
    if callable(drafter):
        return drafter
    raise ValueError(f"drafter must be a name, a drafter instance or a factory, got {drafter!r}")


def _cache_factory(kind: str, num_slots: int, max_seq_len: int, block_size: int,
                   num_blocks: int | None) -> Callable[[Llama], object]:
    if kind == "contiguous":
        return lambda m: ContiguousKVCache.for_model(m, num_slots=num_slots, max_seq_len=max_seq_len)
    from minispec.paged_cache import PagedKVCache
    return lambda m: PagedKVCache.for_model(m, num_slots, max_seq_len, block_size=block_size,
                                            num_blocks=num_blocks)


def _validate(target, draft, drafter, k, max_batch_size, kv_cache, block_size, num_blocks, max_seq_len) -> None:
    """Raise ``ValueError`` with a clear message for an inconsistent configuration."""
    spec, limit = draft is not None or drafter is not None, target.config.max_position_embeddings
    t, d = target.config, (draft.config if draft is not None else target.config)
    checks = [
        (draft is not None and drafter is not None,
         "give either a draft model (draft=) or a drafter (drafter=), not both"),
        (not isinstance(k, int) or k < (1 if spec else 0),
         f"k must be an integer >= 1 with a draft or drafter, got {k!r}"),
        (kv_cache not in ("paged", "contiguous"), f"kv_cache must be 'paged' or 'contiguous', got {kv_cache!r}"),
        (not isinstance(block_size, int) or block_size <= 0,
         f"block_size must be a positive integer, got {block_size!r}"),
        (num_blocks is not None and (not isinstance(num_blocks, int) or num_blocks < 1),
         f"num_blocks must be a positive integer or None, got {num_blocks!r}"),
        (not isinstance(max_batch_size, int) or max_batch_size < 1,
         f"max_batch_size must be an integer >= 1, got {max_batch_size!r}"),
        (max_seq_len is not None and not 1 <= max_seq_len <= limit,
         f"max_seq_len must lie in [1, {limit}] (the target's context), got {max_seq_len}"),
        (d.vocab_size != t.vocab_size,
         f"draft vocab_size {d.vocab_size} != target vocab_size {t.vocab_size}: the models must share one tokenizer"),
        (set(d.eos_token_ids) != set(t.eos_token_ids),
         f"draft eos ids {d.eos_token_ids} != target eos ids {t.eos_token_ids}: the models must share one tokenizer"),
    ]
    for failed, message in checks:
        if failed:
            raise ValueError(message)
