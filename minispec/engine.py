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
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from minispec.decoding import GenerationResult, Round
from minispec.drafters import ModelDrafter, NGramDrafter, PromptLookupDrafter
from minispec.kv_cache import ContiguousKVCache
from minispec.model import Llama
from minispec.runner import SpeculativeRunner
from minispec.sampling import SamplingParams
from minispec.scheduler import KVCacheSpace, Scheduler
from minispec.sequence import Sequence
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
    2. **prefill**, 3. **draft**, 4. **verify** -- the model work, done by
       :class:`~minispec.runner.SpeculativeRunner`: one batched target prefill of the newly
       admitted (the draft model is prefilled lazily), ``k`` batched draft forwards (or each
       request's own n-gram drafter), one target forward over ``[B, k+1]`` and per-request
       accept/reject with each request's own generator;
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
        self.runner = SpeculativeRunner(target, draft, self.target_cache, self.draft_cache)
        self.eos = set(target.config.eos_token_ids)
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}
        self._pending: list[StepOutput] = []
        self._collect: set[str] = set()
        self._results: dict[str, GenerationResult] = {}

    @property
    def target_forwards(self) -> int:
        """Batched target verify forwards so far (one per step, whatever the batch size)."""
        return self.runner.target_forwards

    @property
    def draft_forwards(self) -> int:
        """Batched draft-model forwards so far (lazy prefills included)."""
        return self.runner.draft_forwards

    @property
    def prefill_forwards(self) -> int:
        """Batched target prefill forwards so far."""
        return self.runner.prefill_forwards

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
            self.runner.prefill(plan.admitted)
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

    def _round(self, batch: list[Sequence]) -> list[StepOutput]:
        """One speculative round for every running request; returns the emitted tokens."""
        ks = [seq.round_k(self.k, self.max_seq_len) for seq in batch]
        outputs: list[StepOutput] = []
        for seq, (prop, verdict) in zip(batch, self.runner.round(batch, ks), strict=True):
            outputs += self._emit(seq, prop.tokens, verdict)
        return outputs

    def _emit(self, seq: Sequence, drafts: list[int], verdict) -> list[StepOutput]:
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
        seq.rounds.append(Round(drafts, verdict.num_accepted, emitted))
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


# ---------------------------------------------------------------------- helpers


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
