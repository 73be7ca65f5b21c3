"""A continuous-batching speculative decoding engine: many requests, one batched round per step.

Requests come and go while the engine runs (continuous batching):
[`Engine.add_request`][minispec.engine.Engine.add_request] queues one,
[`Engine.step`][minispec.engine.Engine.step] runs one speculative round for every running request
and returns the tokens it produced, [`Engine.generate`][minispec.engine.Engine.generate] and
[`Engine.stream`][minispec.engine.Engine.stream] drive the loop for a list of prompts,
[`Engine.abort`][minispec.engine.Engine.abort] cancels one. The round itself is
[`SpeculativeRunner`][minispec.runner.SpeculativeRunner]'s, the same one
[`minispec.speculative_generate`][minispec.decoding.speculative_generate] drives for a single
sequence; the engine only adds scheduling ([`minispec.scheduler`][minispec.scheduler]) and the
guarantee that one bad request never hurts another.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from minispec.decoding import GenerationResult, check_k, context_limit, make_sequence
from minispec.drafters import as_drafter, keeps_cache
from minispec.goodput import KChoice, StepCosts, alpha_estimates, bucket, choose_ks
from minispec.kv_cache import ContiguousKVCache
from minispec.model import Llama
from minispec.paged_cache import PagedKVCache
from minispec.runner import SpeculativeRunner
from minispec.sampling import SamplingParams
from minispec.scheduler import KVCacheSpace, Scheduler
from minispec.sequence import Sequence
from minispec.stats import SpecStats

__all__ = ["Engine", "StepOutput"]


@dataclass(frozen=True)
class StepOutput:
    """One emitted token of one request (a speculative round may emit several per request).

    Attributes:
        request_id: the request.
        token: the token id; ``None`` for a request that ends without a token (``max_new_tokens=0``,
            a prompt filling the context, an error, an abort).
        index: its position among the request's new tokens (-1 without a token).
        finish_reason: set on the request's last output only (see ``GenerationResult``).
        stats: the request's ``SpecStats``, on its last output only.
        error: what went wrong, for ``finish_reason="error"``.
    """

    request_id: str
    token: int | None
    index: int
    finish_reason: str | None = None
    stats: SpecStats | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    """Continuous batching with speculative decoding: batched draft, one batched verify per step.

    Args:
        target: the target model ``p``; the engine runs on its device.
        drafter: what drafts, as for
            [`minispec.speculative_generate`][minispec.decoding.speculative_generate]: a draft
            model, a ``ModelDrafter``, ``"ngram"``, ``"prompt_lookup"``, a single-sequence drafter
            instance (copied per request) or a factory; ``None`` for plain decoding.
        draft: a draft model (the same as ``drafter=draft``; kept for the familiar spelling).
        k: drafts per round (gamma), an integer >= 1 with a drafter; ignored without one.
        max_batch_size: most requests running at once.
        kv_cache: ``"paged"`` (a block pool shared by all requests) or ``"contiguous"``.
        block_size: positions per block of the paged pool.
        num_blocks: blocks in the paged pool (default: room for every slot to be full); a draft
            model's pool gets as many. A small pool forces preemption.
        max_seq_len: limit on prompt + new tokens (default and maximum: the models' context).
        tokenizer: for chat-message prompts and stop strings (optional).
        adaptive: choose each step's draft length per request (0..k) to maximise the batch's
            expected tokens per second, from each request's acceptance and the step costs the
            engine measures ([`minispec.goodput`][minispec.goodput]); the choices are in
            `k_choices`. ``False``: every request drafts ``k`` (shrunk only near its limits).
        max_num_batched_tokens: a per-step token budget (vLLM's name): the running requests'
            rounds come first, and prompts are prefilled in chunks with what is left, so a long
            prompt never stalls the requests already decoding (chunked prefill). ``None``: each
            admitted prompt is prefilled whole in the step that admits it.

    One [`step`][minispec.engine.Engine.step]:

    1. **schedule** -- retire finished requests, reserve ``n + k_round`` cache positions for each
       running request (preempting the newest by recompute when the pool is short), admit waiting
       requests (FIFO) while the batch and the pool have room, keeping a watermark of free blocks;
    2. **prefill** the newly admitted (one batched target forward; a draft model is prefilled
       lazily by its first draft step);
    3. **draft**, 4. **verify**, 5. **roll back**, 6. **emit** -- the runner's round over all
       running requests: one batched drafter call, one target forward over ``[B, k+1]``,
       per-request accept/reject with each request's own generator, per-request truncation of both
       caches, tokens appended until each request's stop rules fire.

    A request with something wrong is refused by [`add_request`][minispec.engine.Engine.add_request]
    with a ``ValueError``; one that fails inside a step (NaN logits, a drafter raising) finishes
    alone with ``finish_reason="error"``, its memory is freed and the other requests go on.
    """

    def __init__(self, target: Llama, draft: Llama | None = None, drafter: Any = None, k: int = 4,
                 max_batch_size: int = 8, kv_cache: str = "paged", block_size: int = 16,
                 num_blocks: int | None = None, max_seq_len: int | None = None,
                 tokenizer: Any = None, adaptive: bool = False,
                 max_num_batched_tokens: int | None = None) -> None:
        if draft is not None and drafter is not None:
            raise ValueError("give either a draft model (draft=) or a drafter (drafter=), not both")
        if max_num_batched_tokens is not None and not _positive_int(max_num_batched_tokens):
            raise ValueError(f"max_num_batched_tokens must be a positive integer or None, "
                             f"got {max_num_batched_tokens!r}")
        self.max_num_batched_tokens = max_num_batched_tokens
        drafter = as_drafter(draft if draft is not None else drafter, copy_per_request=True)
        if keeps_cache(drafter):                        # a fresh one: the engine owns its cache
            drafter = drafter.clone()
        check_k(k, drafter is not None)
        _check_pool(kv_cache, block_size, num_blocks, max_batch_size)
        self.target, self.device, self.tokenizer = target, target.device, tokenizer
        self.k = k if drafter is not None else 0
        self.max_seq_len = context_limit(target, drafter, max_seq_len)
        make = _cache_factory(kv_cache, max_batch_size, self.max_seq_len, block_size, num_blocks)
        self.target_cache = make(target)
        self.draft_cache = None
        if keeps_cache(drafter):                        # a draft model's or a head's cache
            self.draft_cache = make(drafter.model)
            drafter.attach(self.draft_cache)
        space = KVCacheSpace(self.target_cache, self.draft_cache)
        watermark = max(1, space.num_blocks() // 100) if kv_cache == "paged" else 0
        self.scheduler = Scheduler(space, max_batch_size, self.k, watermark)
        self.runner = SpeculativeRunner(target, self.target_cache, drafter)
        self.adaptive = adaptive and drafter is not None
        self.costs = StepCosts()
        self.k_choices: deque[KChoice] = deque(maxlen=10_000)   # adaptive: the latest choices
        self._accepted = self._tested = 0                       # pooled over all requests
        self._asked: dict[str, list[int]] = {}     # request -> [rounds asked to draft, proposed]
        self._proposals = [0, 0]                   # the same, pooled over all requests
        self._retry: dict[int, tuple[int, int]] = {}    # bucket -> (step to draft again, interval)
        self._steps = 0
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}     # unfinished requests
        self._pending: list[StepOutput] = []          # outputs to return with the next step
        self._collect: set[str] = set()               # requests whose results generate() awaits
        self._results: dict[str, GenerationResult] = {}

    @property
    def drafter(self):
        """The batched drafter (``None`` for plain decoding)."""
        return self.runner.drafter

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

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt_ids: Any, sampling: SamplingParams | None = None,
                    request_id: str | None = None, max_new_tokens: int = 64,
                    stop_token_ids: Seq[int] = (), stop: str | Seq[str] = (),
                    eos_token_id: int | Seq[int] | None = None) -> str:
        """Queue a request; returns its id. Arguments as
        [`minispec.speculative_generate`][minispec.decoding.speculative_generate].

        Raises:
            ValueError: for a bad request (the same checks as ``speculative_generate``: ids outside
                the vocabulary, a non-integral ``max_new_tokens``, a too long prompt, ...), a
                duplicate id, or a request that could never fit in the KV pool.
        """
        request_id = self._new_id() if request_id is None else str(request_id)
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = make_sequence(request_id, self.target, prompt_ids, sampling,
                            max_new_tokens=max_new_tokens, max_seq_len=self.max_seq_len, k=self.k,
                            tokenizer=self.tokenizer, stop=stop, stop_token_ids=stop_token_ids,
                            eos_token_id=eos_token_id)
        if (reason := seq.done_before_start()) is not None:     # ends before any round
            seq.finish(reason)
        else:
            self.scheduler.add(seq)
        self._sequences[request_id] = seq
        if seq.is_finished:
            self._pending.append(self._last_output(seq, []))
        return request_id

    def abort(self, request_id: str) -> None:
        """Cancel a waiting or running request: it finishes with ``"abort"`` and its blocks are freed.

        Raises:
            KeyError: for an unknown or already finished request.
        """
        seq = self._sequences.get(str(request_id))
        if seq is None or seq.is_finished:
            raise KeyError(f"no unfinished request {request_id!r}")
        seq.finish("abort")
        self._pending.append(self._last_output(seq, []))

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running, or outputs are still to be returned."""
        return self.scheduler.has_unfinished() or bool(self._pending)

    # ------------------------------------------------------------------ one step

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Schedule, prefill, draft, verify, roll back, emit (see
        [`Engine`][minispec.engine.Engine])."""
        outputs, self._pending = self._pending, []
        self._steps += 1
        scheduled = self.scheduler.schedule()
        filling = [seq for seq in scheduled.running if seq.prefill_left > 0]
        self._isolated(lambda seqs: self.runner.prefill(seqs, self._chunks(seqs, scheduled.running)),
                       filling, prefill=True)
        outputs += [self._last_output(seq, []) for seq in filling if seq.is_finished]   # failed
        batch = [seq for seq in scheduled.running if not seq.is_finished and seq.prefill_left == 0]
        for seq, tokens in zip(batch, self._isolated(self._round, batch), strict=True):
            outputs += self._outputs(seq, tokens)
        return outputs

    def _chunks(self, filling: list[Sequence], running: list[Sequence]) -> list[int] | None:
        """Prefill tokens each filling request gets this step: the budget left after the decoding
        requests' rounds (``k + 1`` tokens each), first come first served; at least one token."""
        if self.max_num_batched_tokens is None:
            return None
        decoding = sum(seq.round_k(self.k) + 1 for seq in running if seq.prefill_left == 0)
        left = max(1, self.max_num_batched_tokens - decoding)
        chunks = []
        for seq in filling:
            chunks.append(min(seq.prefill_left, left))
            left = max(0, left - chunks[-1])
        return chunks

    def _round(self, batch: list[Sequence]) -> list[list[int]]:
        """The runner's round for every running request; the tokens each emitted."""
        ks = self._draft_lengths(batch)
        t0 = time.perf_counter()
        drafts = self.runner.draft(batch, ks)
        t1 = time.perf_counter()
        verdicts, hidden = self.runner.verify(batch, drafts)
        self.runner.rollback(batch, verdicts, hidden)
        emitted = self.runner.emit(batch, drafts, verdicts)
        t2 = time.perf_counter()          # a round's cost beyond drafting: verify, rollback, emit
        self._learn(batch, ks, drafts, verdicts, t1 - t0, t2 - t1)
        return emitted

    def _draft_lengths(self, batch: list[Sequence]) -> list[int]:
        """Each request's ``k`` this step: its cap (``k`` shrunk near its limits), or with
        ``adaptive`` the goodput-maximising choice
        ([`minispec.goodput.choose_ks`][minispec.goodput.choose_ks]). While the costs at this batch
        size are unknown, a plain step and a full step measure them."""
        caps = [seq.round_k(self.k) for seq in batch]
        if not self.adaptive or not any(caps):
            return caps
        pooled = (self._accepted + 1) / (self._tested + 2)
        alphas = alpha_estimates([s.stats.accepted for s in batch], [s.stats.tested for s in batch],
                                 pooled)
        choice = choose_ks(alphas, caps, self.k, self.costs,
                           proposal_rates=self._proposal_rates(batch))
        if choice is None:                        # explore: measure a plain step, then a full one
            plain_known = self.costs.verify_seconds(len(batch), 1) is not None
            choice = KChoice(len(batch), caps if plain_known else [0] * len(batch), alphas, {})
        elif not any(choice.ks) and self._time_to_retry(bucket(len(batch))):
            # look again (acceptance drifts) with the cheapest round that measures it: one draft
            choice = KChoice(len(batch), [min(c, 1) for c in caps], alphas, {})
        self.k_choices.append(choice)
        return choice.ks

    def _proposal_rates(self, batch: list[Sequence], strength: float = 4.0) -> list[float]:
        """How often each request's drafter proposed anything when asked: its own rounds, shrunk
        towards the pooled rate (which starts at 1: a drafter is trusted to propose until seen)."""
        asked, proposed = self._proposals
        pooled = (proposed + 1) / (asked + 1)
        counts = [self._asked.get(seq.request_id, (0, 0)) for seq in batch]
        return [(p + strength * pooled) / (a + strength) for a, p in counts]

    def _time_to_retry(self, rows: int) -> bool:
        """While drafting does not pay, draft anyway after 8, then 16, 32, ... plain steps (at this
        batch-size bucket), so that an acceptance estimate spoiled by an unlucky start, or a text
        that turned repetitive, is measured again; the cost of looking shrinks geometrically, and a
        look drafts one token per request (a verify two tokens wide), not the full ``k``."""
        due, interval = self._retry.get(rows, (self._steps + 8, 8))
        if self._steps < due:
            self._retry[rows] = (due, interval)
            return False
        self._retry[rows] = (self._steps + 2 * interval, 2 * interval)
        return True

    def _learn(self, batch: list[Sequence], ks: list[int], drafts: list, verdicts: list,
               draft_s: float, verify_s: float) -> None:
        """Feed the step's measured costs and acceptance to the goodput model.

        Acceptance is counted over the drafts proposed; how often a drafter proposes anything
        when asked is counted apart (an n-gram table without a match proposes nothing).
        """
        self.costs.record_verify(len(ks), 1 + max(len(d) for d in drafts), verify_s)
        self.costs.record_draft(sum(k > 0 for k in ks), max(ks, default=0), draft_s)
        for seq, k, d, v in zip(batch, ks, drafts, verdicts, strict=True):
            if v is not None and k > 0:
                self._accepted += v.num_accepted
                self._tested += v.num_accepted + (v.num_accepted < len(d))
                counts = self._asked.setdefault(seq.request_id, [0, 0])
                for c in (counts, self._proposals):
                    c[0] += 1
                    c[1] += len(d) > 0

    def _isolated(self, phase: Callable[[list[Sequence]], Any], batch: list[Sequence],
                  prefill: bool = False) -> list:
        """Run ``phase`` on the batch; if it raises, run it per request and fail only the culprits.

        Before a retry each request's caches go back to where the phase started (an empty target
        cache for a prefill, the ``n - 1`` cached positions for a round). Returns the phase's
        per-request results (``[]`` for a failed request; nothing for a prefill).
        """
        if not batch:
            return []
        try:
            result = phase(batch)
            return [] if prefill else result
        except Exception:
            results = []
            for seq in batch:
                self._rewind(seq, seq.num_cached if prefill else seq.num_tokens - 1)
                try:
                    result = phase([seq])
                    results.append([] if prefill else result[0])
                except Exception as error:          # this request alone is broken
                    seq.fail(error)
                    results.append([])
            return [] if prefill else results

    def _rewind(self, seq: Sequence, n: int) -> None:
        """Roll ``seq``'s caches back to at most ``n`` positions (a round or prefill is retried)."""
        self.target_cache.truncate_to(seq.slot, min(n, self.target_cache.length(seq.slot)))
        if self.draft_cache is not None:
            seq.draft_len = min(seq.draft_len, n, self.draft_cache.length(seq.draft_slot))
            self.draft_cache.truncate_to(seq.draft_slot, seq.draft_len)

    def _outputs(self, seq: Sequence, tokens: list[int]) -> list[StepOutput]:
        """One ``StepOutput`` per emitted token; a finished request's last one says how it ended."""
        start = len(seq.generated) - len(tokens)
        outs = [StepOutput(seq.request_id, t, start + i) for i, t in enumerate(tokens)]
        if seq.is_finished:
            outs[-1:] = [self._last_output(seq, tokens)]
        return outs

    def _last_output(self, seq: Sequence, tokens: list[int]) -> StepOutput:
        """The request's final output (its last token, or none); forgets the request."""
        token, index = (tokens[-1], len(seq.generated) - 1) if tokens else (None, -1)
        del self._sequences[seq.request_id]
        self._asked.pop(seq.request_id, None)
        self.scheduler.release(seq)                   # its blocks are free from now on
        if self.drafter is not None:
            self.drafter.release(seq)
        if seq.request_id in self._collect:
            self._collect.discard(seq.request_id)
            self._results[seq.request_id] = GenerationResult.of(seq)
        return StepOutput(seq.request_id, token, index, seq.finish_reason, seq.stats, seq.error)

    # ------------------------------------------------------------------ driving the loop

    def generate(self, prompts: Seq[Any], sampling: SamplingParams | Seq[SamplingParams] | None = None,
                 progress: bool = True, max_new_tokens: int = 64, stop_token_ids: Seq[int] = (),
                 stop: str | Seq[str] = (), eos_token_id: int | Seq[int] | None = None
                 ) -> list[GenerationResult]:
        """Run ``prompts`` to completion; results in prompt order (the type ``generate`` returns).

        Args:
            prompts: token ids, strings or chat messages (the last two need the engine's tokenizer).
            sampling: one ``SamplingParams`` for all (each request seeds its own generator from
                it), or one per prompt.
            progress: a tqdm bar counting finished requests (off when ``TQDM_DISABLE`` is set).
            max_new_tokens: as [`add_request`][minispec.engine.Engine.add_request], for every
                prompt.
            stop_token_ids: as [`add_request`][minispec.engine.Engine.add_request], for every
                prompt.
            stop: as [`add_request`][minispec.engine.Engine.add_request], for every prompt.
            eos_token_id: as [`add_request`][minispec.engine.Engine.add_request] (``[]``: every
                request runs to ``max_new_tokens``).

        Raises:
            ValueError: for any bad prompt; then no request of this call is left behind.
        """
        ids = self._add_all(prompts, sampling, max_new_tokens, stop_token_ids, stop, eos_token_id)
        disable = not progress or os.environ.get("TQDM_DISABLE", "") not in ("", "0")
        with tqdm(total=len(ids), disable=disable, desc="requests", unit="req") as bar:
            while any(rid not in self._results for rid in ids):
                bar.update(sum(out.finished and out.request_id in ids for out in self.step()))
        return [self._results.pop(rid) for rid in ids]

    def stream(self, prompts: Seq[Any], sampling: SamplingParams | Seq[SamplingParams] | None = None,
               max_new_tokens: int = 64, stop_token_ids: Seq[int] = (), stop: str | Seq[str] = (),
               eos_token_id: int | Seq[int] | None = None) -> Iterator[StepOutput]:
        """Like [`generate`][minispec.engine.Engine.generate], but yield each ``StepOutput`` of
        these prompts as it is accepted (several per step when drafts are accepted)."""
        ids = set(self._add_all(prompts, sampling, max_new_tokens, stop_token_ids, stop, eos_token_id))
        open_ids = set(ids)
        while open_ids:
            for out in self.step():
                if out.request_id in ids:
                    open_ids.discard(out.request_id) if out.finished else None
                    yield out
        for rid in ids:
            self._results.pop(rid, None)

    def _add_all(self, prompts, sampling, max_new_tokens, stop_token_ids, stop, eos_token_id) -> list[str]:
        """Queue every prompt, or none: on a bad one, the ones queued already are aborted."""
        samplings = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(samplings) != len(prompts):
            raise ValueError(f"{len(samplings)} SamplingParams for {len(prompts)} prompts")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, samplings, strict=True):
                ids.append(self._new_id())
                self._collect.add(ids[-1])
                self.add_request(prompt, sp, ids[-1], max_new_tokens, stop_token_ids, stop, eos_token_id)
        except Exception:
            for rid in ids:
                self._collect.discard(rid)
                if rid in self._sequences:
                    self.abort(rid)
                self._results.pop(rid, None)
            self._pending = [o for o in self._pending if o.request_id not in ids]
            raise
        return ids

    def _new_id(self) -> str:
        """The next automatic request id not already in use."""
        while (rid := str(next(self._ids))) in self._sequences or rid in self._collect:
            pass
        return rid


# ---------------------------------------------------------------------- helpers


def _check_pool(kv_cache: str, block_size: Any, num_blocks: Any, max_batch_size: Any) -> None:
    """``ValueError`` with a clear message for an inconsistent cache configuration."""
    checks = [
        (kv_cache not in ("paged", "contiguous"), f"kv_cache must be 'paged' or 'contiguous', got {kv_cache!r}"),
        (not _positive_int(block_size), f"block_size must be a positive integer, got {block_size!r}"),
        (num_blocks is not None and not _positive_int(num_blocks),
         f"num_blocks must be a positive integer or None, got {num_blocks!r}"),
        (not _positive_int(max_batch_size), f"max_batch_size must be an integer >= 1, got {max_batch_size!r}"),
    ]
    for failed, message in checks:
        if failed:
            raise ValueError(message)


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _cache_factory(kind: str, num_slots: int, max_seq_len: int, block_size: int,
                   num_blocks: int | None) -> Callable[[Llama], Any]:
    """Makes the KV cache of one model (the target's and a draft model's have the same shape)."""
    if kind == "contiguous":
        return lambda m: ContiguousKVCache.for_model(m, num_slots=num_slots, max_seq_len=max_seq_len)
    return lambda m: PagedKVCache.for_model(m, num_slots, max_seq_len, block_size=block_size,
                                            num_blocks=num_blocks)
