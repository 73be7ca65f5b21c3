"""A continuous-batching speculative decoding engine: many requests, one batched round per step.

Requests come and go while the engine runs (continuous batching):
[`Engine.add_request`][minispec.serving.engine.Engine.add_request] queues one,
[`Engine.step`][minispec.serving.engine.Engine.step] runs one speculative round for every running
request and returns the tokens it produced,
[`Engine.generate`][minispec.serving.engine.Engine.generate] and
[`Engine.stream`][minispec.serving.engine.Engine.stream] drive the loop for a list of prompts,
[`Engine.abort`][minispec.serving.engine.Engine.abort] cancels one. The round itself is
[`SpeculativeRunner`][minispec.decoding.runner.SpeculativeRunner]'s, the same one
[`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate] drives for a single
sequence; the engine only adds scheduling
([`minispec.serving.scheduler`][minispec.serving.scheduler]) and the guarantee that one bad request
never hurts another.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from minispec.core.sampling import SamplingParams, is_int
from minispec.core.sequence import Sequence
from minispec.core.stats import SpecStats
from minispec.core.tree import tree_size
from minispec.decoding.request import (
    GenerationResult,
    as_drafter_for,
    context_limit,
    make_sequence,
)
from minispec.decoding.runner import (
    ChainVerifier,
    FixedK,
    SpeculativeRunner,
    collaborators,
    run_round,
)
from minispec.drafters.base import keeps_cache
from minispec.models.block_manager import ceil_div
from minispec.models.kv_cache import BLOCK_BOOKKEEPING, ContiguousKVCache, device_memory
from minispec.models.llama import Forward, Llama
from minispec.models.paged_cache import PagedKVCache
from minispec.serving.scheduler import KVCacheSpace, Scheduler

__all__ = ["Engine", "StepOutput", "check_kv_memory"]


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
        draft: a draft model (the same as ``drafter=draft``; kept for the familiar spelling).
        drafter: what drafts, as for
            [`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate]: a draft
            model, a ``Drafter`` (``ModelDrafter``, ``EagleDrafter``, ...; the engine drafts with
            its ``clone``), ``"ngram"``, ``"prompt_lookup"``, ``"suffix"``, or a class or factory
            making a drafter; ``None`` for plain decoding.
        k: drafts per round (gamma; the depth of a tree), an integer >= 1 with a drafter; ignored
            without one.
        max_batch_size: most requests running at once.
        kv_cache: ``"paged"`` (a block pool shared by all requests) or ``"contiguous"``.
        block_size: positions per block of the paged pool.
        num_blocks: blocks in the paged pool (default: room for every slot to be full); a draft
            model's pool gets as many. A small pool forces preemption. Paged only. The caches
            these settings size are refused before allocation if they exceed the device's
            memory ([`check_kv_memory`][minispec.serving.engine.check_kv_memory]).
        max_seq_len: limit on prompt + new tokens (default and maximum: the models' context).
        tokenizer: for chat-message prompts and stop strings (optional).
        adaptive: choose each step's draft length per request (0..k) to maximise the batch's
            expected tokens per second, from each request's acceptance and the step costs the
            engine measures (the goodput policy,
            [`minispec.speed.goodput`][minispec.speed.goodput]); the choices are in
            ``k_choices`` and each request's ``stats.k_per_round``. ``None`` (the default): on
            whenever a drafter drafts chains, so speculation is never chosen where it does not
            pay. ``False``: every request drafts ``k`` (shrunk only near its limits). A sampled
            request with a ``seed`` always drafts ``k``: its tokens must be a function of its own
            prompt, sampling and seed, and a ``k`` chosen from the batch and the clock is not.
        max_num_batched_tokens: a per-step token budget (vLLM's name): the running requests'
            rounds come first, and prompts are prefilled in chunks with what is left, so a long
            prompt never stalls the requests already decoding (chunked prefill). ``None``: each
            admitted prompt is prefilled whole in the step that admits it.
        branching: draft trees instead of chains: ``branching[t]`` children per node at depth
            ``t`` (e.g. ``(3, 2, 1, 1)``), verified in the same batched forward with tree attention
            and compacted to the accepted path (a paged cache frees the rejected nodes' blocks);
            or a [`DynamicTree`][minispec.extra_drafters.dynamic.DynamicTree] (a draft model or an
            EAGLE head: shaped by its confidence, EAGLE-2).
        graphs: run the target's steps (and a draft model's chain steps) as static shapes padded
            to a batch bucket, captured as CUDA graphs on a GPU
            ([`minispec.speed.static_step`][minispec.speed.static_step]); ``None`` (the
            default): on a GPU only; ``True`` on the CPU runs the same step eagerly.
        policy: a draft-length policy instead of the one ``adaptive`` names (as
            [`FixedK`][minispec.decoding.runner.FixedK]: ``round(runner, seqs, caps)``).
        forward: how both models run a step (a ``Forward``) instead of the one ``graphs`` names.
        verify: a chain verifier with the graders' signature, ``fn(draft_tokens, draft_probs,
            target_probs, generator) -> tokens``, run on every row instead of
            [`verify`][minispec.core.speculative.verify] (chains only).

    Attributes:
        drafter: the batched drafter, the engine's own clone of the one given (``None`` for plain
            decoding).

    One [`step`][minispec.serving.engine.Engine.step]:

    1. **schedule** -- retire finished requests, reserve the cache positions each running
       request's round writes (preempting the newest by recompute when the pool is short), admit
       waiting requests (FIFO) while the batch and the pool have room, keeping a watermark;
    2. **prefill** the newly admitted (one batched target forward; a draft model is prefilled
       lazily by its first draft step);
    3. **draft**, 4. **verify**, 5. **roll back**, 6. **emit** -- the runner's round over all
       running requests ([`SpeculativeRunner`][minispec.decoding.runner.SpeculativeRunner]).

    A request with something wrong is refused by
    [`add_request`][minispec.serving.engine.Engine.add_request] with a ``ValueError``; one that
    fails inside a step (non-finite logits, its drafter raising or proposing nonsense) finishes
    alone with ``finish_reason="error"``, its memory is freed and the other requests go on. No
    round is ever retried, so every request draws its random numbers exactly as it would alone.
    """

    def __init__(self, target: Llama, draft: Llama | None = None, drafter: Any = None, k: int = 4,
                 max_batch_size: int = 8, kv_cache: str = "paged", block_size: int = 16,
                 num_blocks: int | None = None, max_seq_len: int | None = None,
                 tokenizer: Any = None, adaptive: bool | None = None,
                 max_num_batched_tokens: int | None = None,
                 branching: Seq[int] | None = None, graphs: bool | None = None,
                 policy: Any = None, forward: Forward | None = None,
                 verify: ChainVerifier | None = None) -> None:
        spec = _check_engine_args(target, draft, drafter, kv_cache, block_size, num_blocks,
                                  max_batch_size, max_num_batched_tokens)
        self.max_num_batched_tokens = max_num_batched_tokens
        drafter, self.k, self.branching, extra = as_drafter_for(spec, k, branching)
        self.target, self.tokenizer = target, tokenizer
        chosen = collaborators(adaptive, graphs, self.k, self.branching is None, target.device)
        self.policy, forward = policy or chosen[0], forward or chosen[1]
        self.max_seq_len = context_limit(target, drafter, max_seq_len)
        paged = kv_cache == "paged"
        self._make_caches(drafter, paged, max_batch_size, block_size, num_blocks, extra)
        self.drafter = None if drafter is None else drafter.clone()   # the engine owns a fresh one
        if self.draft_cache is not None:                # a draft model's or a head's cache
            self.drafter.attach(self.draft_cache, forward)
        space = KVCacheSpace(self.target_cache, self.draft_cache)
        watermark = max(1, self.target_cache.num_blocks // 100) if paged else 0
        self.scheduler = Scheduler(space, max_batch_size, self.k, watermark, extra)
        self.runner = SpeculativeRunner(target, self.target_cache, self.drafter, self.branching,
                                        forward, verify)
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}       # unfinished requests
        self._owners: dict[str, deque[StepOutput]] = {}  # request -> its stream's output queue
        self._pending: list[StepOutput] = []            # outputs for the next step() call
        self._results: dict[str, GenerationResult] = {}  # finished requests a stream owns

    def _make_caches(self, drafter: Any, paged: bool, max_batch_size: int, block_size: int,
                     num_blocks: int | None, extra: int) -> None:
        """The target's cache and a draft model's (or a head's), of one kind and one shape,
        refused before allocation when they would not fit in memory."""
        drafts = keeps_cache(drafter)
        check_kv_memory([self.target] + ([drafter.model] if drafts else []), paged,
                        max_batch_size, self.max_seq_len + extra, block_size, num_blocks)
        kind = PagedKVCache if paged else ContiguousKVCache
        settings = {"block_size": block_size, "num_blocks": num_blocks} if paged else {}
        make = lambda m: kind.for_model(m, max_batch_size, self.max_seq_len, extra, **settings)
        self.target_cache = make(self.target)
        self.draft_cache = make(drafter.model) if drafts else None

    @property
    def adaptive(self) -> bool:
        """Whether each step's ``k`` is chosen per request (a policy other than ``FixedK``)."""
        return not isinstance(self.policy, FixedK)

    @property
    def k_choices(self) -> Seq[Any]:
        """The policy's latest choices of ``k``, one per step, with their inputs (none with a
        fixed ``k``)."""
        return self.policy.choices

    @property
    def costs(self) -> Any:
        """The step costs the policy has measured (``None`` with a fixed ``k``)."""
        return self.policy.costs

    @property
    def target_forwards(self) -> int:
        """Batched target verify forwards so far (one per step, whatever the batch size)."""
        return self.runner.target_forwards

    @property
    def draft_forwards(self) -> int:
        """Batched drafter forwards so far (lazy prefills included; 0 without a drafter)."""
        return 0 if self.drafter is None else self.drafter.forwards

    @property
    def prefill_forwards(self) -> int:
        """Batched target prefill forwards so far."""
        return self.runner.prefill_forwards

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt_ids: Any, sampling: SamplingParams | None = None,
                    request_id: str | None = None, max_new_tokens: int = 64,
                    stop_token_ids: Seq[int] = (), stop: str | Seq[str] = (),
                    eos_token_id: int | Seq[int] | None = None, tenant: str | None = None) -> str:
        """Queue a request; returns its id. Its outputs are returned by
        [`step`][minispec.serving.engine.Engine.step]. Arguments as
        [`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate], and:

        Args:
            tenant: who sends it. A drafter that shares text between requests (a
                [`SuffixDrafter`][minispec.extra_drafters.suffix.SuffixDrafter] with a store, also
                in a ``HybridDrafter`` or a tree) writes the request into that tenant's documents
                and drafts it only from them, so tenants never see each other's text in their
                drafts. ``None``: the pool of requests without a tenant (as the drafter's own
                ``tenant``).

        Raises:
            ValueError: for a bad request (the same checks as ``speculative_generate``: ids outside
                the vocabulary, a non-integral ``max_new_tokens``, a too long prompt, ...), a
                tenant that is not a string, a duplicate id, or a request that could never fit in
                the KV pool.
        """
        request_id = self._new_id() if request_id is None else str(request_id)
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        if tenant is not None and not isinstance(tenant, str):
            raise ValueError(f"tenant must be a string or None, got {tenant!r}")
        seq = make_sequence(request_id, self.target, prompt_ids, sampling,
                            max_new_tokens=max_new_tokens, max_seq_len=self.max_seq_len, k=self.k,
                            tokenizer=self.tokenizer, stop=stop, stop_token_ids=stop_token_ids,
                            eos_token_id=eos_token_id)
        seq.tenant = tenant
        if (reason := seq.done_before_start()) is None:
            self.scheduler.add(seq)                     # ValueError if it can never fit
        self._sequences[request_id] = seq
        if reason is not None:                          # ends before any round
            seq.finish(reason)
            self._route(self._last_output(seq, []))
        return request_id

    def abort(self, request_id: str) -> None:
        """Cancel a waiting or running request: it finishes with ``"abort"`` and its blocks are
        freed.

        Raises:
            KeyError: for an unknown or already finished request.
        """
        seq = self._sequences.get(str(request_id))
        if seq is None or seq.is_finished:
            raise KeyError(f"no unfinished request {request_id!r}")
        seq.finish("abort")
        self._route(self._last_output(seq, []))

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running, or outputs are still to be returned."""
        return self.scheduler.has_unfinished() or bool(self._pending)

    # ------------------------------------------------------------------ one step

    def step(self) -> list[StepOutput]:
        """Run one step (see [`Engine`][minispec.serving.engine.Engine]); return the outputs of the
        requests queued with [`add_request`][minispec.serving.engine.Engine.add_request] (those of
        a stream or ``generate`` go to it, whoever drives the engine)."""
        self._step()
        outputs, self._pending = self._pending, []
        return outputs

    @torch.inference_mode()
    def _step(self) -> None:
        """Schedule, prefill, draft, verify, roll back, emit; route every output."""
        scheduled = self.scheduler.schedule()
        filling = [seq for seq in scheduled.running if seq.prefill_left > 0]
        self._guarded(lambda seqs: self.runner.prefill(seqs, self._chunks(seqs, scheduled.running)),
                      filling)
        batch = [seq for seq in scheduled.running if not seq.is_finished and seq.prefill_left == 0]
        emitted = self._guarded(self._round, batch) or [[] for _ in batch]
        for seq in filling:
            if seq.is_finished and seq not in batch:            # failed in its prefill
                self._route(self._last_output(seq, []))
        for seq, tokens in zip(batch, emitted, strict=True):   # one output per token; a finished
            start = len(seq.generated) - len(tokens)           # request's last says how it ended
            for i, token in enumerate(tokens[:-1] if seq.is_finished else tokens):
                self._route(StepOutput(seq.request_id, token, start + i))
            if seq.is_finished:
                self._route(self._last_output(seq, tokens))

    def _guarded(self, phase: Callable[[list[Sequence]], Any], batch: list[Sequence]) -> Any:
        """Run a batched phase; if it raises (a fault of the batch, with no single request to
        blame), every request in it fails with the error, visibly, and the engine goes on."""
        if not batch:
            return None
        try:
            return phase(batch)
        except Exception as error:
            for seq in batch:
                if not seq.is_finished:
                    seq.fail(error)
            return None

    def _chunks(self, filling: list[Sequence], running: list[Sequence]) -> list[int] | None:
        """Prefill tokens each filling request gets this step: the budget left after the decoding
        requests' rounds (a chain's ``k + 1`` tokens, a tree's nodes), first come first served; at
        least one token."""
        if self.max_num_batched_tokens is None:
            return None
        decoding = sum(self._round_tokens(seq) for seq in running if seq.prefill_left == 0)
        left = max(1, self.max_num_batched_tokens - decoding)
        chunks = []
        for seq in filling:
            chunks.append(min(seq.prefill_left, left))
            left -= chunks[-1]
        return chunks

    def _round_tokens(self, seq: Sequence) -> int:
        """Tokens the request's next round feeds the target at most: ``k + 1``, or a tree's
        nodes."""
        k = seq.round_k(self.k)
        return k + 1 if self.branching is None else tree_size(self.branching[:k])

    def _round(self, batch: list[Sequence]) -> list[list[int]]:
        """The round for every running request, the policy choosing each one's ``k``; the tokens
        each emitted."""
        return run_round(self.policy, self.runner, batch, self.k)

    def _last_output(self, seq: Sequence, tokens: list[int]) -> StepOutput:
        """The request's final output (its last token, or none); forgets the request."""
        token, index = (tokens[-1], len(seq.generated) - 1) if tokens else (None, -1)
        del self._sequences[seq.request_id]
        self.scheduler.release(seq)                   # its blocks are free from now on
        if self.drafter is not None:
            self.drafter.release(seq)
        self.policy.forget(seq.request_id)
        if seq.request_id in self._owners:
            self._results[seq.request_id] = GenerationResult.of(seq)
        return StepOutput(seq.request_id, token, index, seq.finish_reason, seq.stats, seq.error)

    def _route(self, out: StepOutput) -> None:
        """An output goes to the stream that owns its request, else to the next ``step()``."""
        self._owners.get(out.request_id, self._pending).append(out)

    # ------------------------------------------------------------------ driving the loop

    def generate(self, prompts: Seq[Any],
                 sampling: SamplingParams | Seq[SamplingParams] | None = None,
                 progress: bool = True, max_new_tokens: int = 64, stop_token_ids: Seq[int] = (),
                 stop: str | Seq[str] = (), eos_token_id: int | Seq[int] | None = None,
                 tenant: str | Seq[str | None] | None = None) -> list[GenerationResult]:
        """Run ``prompts`` to completion; results in prompt order (the type ``generate`` returns).

        Args:
            prompts: a list of prompts: token ids, strings or chat messages (the last two need the
                engine's tokenizer).
            sampling: one ``SamplingParams`` for all (each request seeds its own generator from
                it), or one per prompt.
            progress: a tqdm bar counting finished requests (off when ``TQDM_DISABLE`` is set).
            max_new_tokens: as [`add_request`][minispec.serving.engine.Engine.add_request], for
                every prompt.
            stop_token_ids: as [`add_request`][minispec.serving.engine.Engine.add_request], for
                every prompt.
            stop: as [`add_request`][minispec.serving.engine.Engine.add_request], for every prompt.
            eos_token_id: as [`add_request`][minispec.serving.engine.Engine.add_request] (``[]``:
                every request runs to ``max_new_tokens``).
            tenant: as [`add_request`][minispec.serving.engine.Engine.add_request]: one for all
                prompts, or one per prompt.

        Raises:
            ValueError: for any bad prompt; then no request of this call is left behind.
        """
        ids, queue = self._add_all(prompts, sampling, max_new_tokens, stop_token_ids, stop,
                                   eos_token_id, tenant)
        disable = not progress or os.environ.get("TQDM_DISABLE", "") not in ("", "0")
        with tqdm(total=len(ids), disable=disable, desc="requests", unit="req") as bar:
            for out in self._drive(ids, queue, keep_results=True):
                bar.update(out.finished)
        return [self._results.pop(rid) for rid in ids]

    def stream(self, prompts: Seq[Any],
               sampling: SamplingParams | Seq[SamplingParams] | None = None,
               max_new_tokens: int = 64, stop_token_ids: Seq[int] = (), stop: str | Seq[str] = (),
               eos_token_id: int | Seq[int] | None = None,
               tenant: str | Seq[str | None] | None = None) -> Iterator[StepOutput]:
        """Like [`generate`][minispec.serving.engine.Engine.generate], but yield each ``StepOutput``
        of these prompts as it is accepted (several per step when drafts are accepted).

        The stream yields exactly its own requests' outputs, whoever else drives the engine
        (``step()``, another stream, ``generate``). Leaving it early (``break``, or closing it)
        aborts its unfinished requests and frees their slots.
        """
        ids, queue = self._add_all(prompts, sampling, max_new_tokens, stop_token_ids, stop,
                                   eos_token_id, tenant)
        yield from self._drive(ids, queue, keep_results=False)

    def _drive(self, ids: list[str], queue: deque[StepOutput], keep_results: bool
               ) -> Iterator[StepOutput]:
        """Step the engine until every request in ``ids`` has finished, yielding their outputs;
        on an early exit, abort the unfinished ones. Their results are dropped at the end unless
        ``keep_results`` (``generate`` returns them)."""
        try:        # a request's last output is queued when it leaves self._sequences
            while queue or any(rid in self._sequences for rid in ids):
                if queue:
                    yield queue.popleft()
                else:
                    self._step()
        finally:
            self._close(ids, keep_results)

    def _close(self, ids: list[str], keep_results: bool = False) -> None:
        """Abort the unfinished requests of ``ids``; no stream owns them any more."""
        for rid in ids:
            if rid in self._sequences:
                self.abort(rid)
            self._owners.pop(rid, None)
            if not keep_results:
                self._results.pop(rid, None)

    def _add_all(self, prompts, sampling, max_new_tokens, stop_token_ids, stop, eos_token_id,
                 tenant) -> tuple[list[str], deque[StepOutput]]:
        """Queue every prompt, or none: on a bad one, the ones queued already are aborted. The ids
        and the queue their outputs go to."""
        if not isinstance(prompts, (list, tuple)):                  # a string is one prompt
            raise ValueError(f"prompts must be a list of prompts (token ids, strings or chat "
                             f"messages), got {type(prompts).__name__}; "
                             "wrap a single prompt: [prompt]")
        samplings, tenants = (_per_prompt(sampling, prompts, "SamplingParams"),
                              _per_prompt(tenant, prompts, "tenants"))
        ids: list[str] = []
        queue: deque[StepOutput] = deque()
        try:
            for prompt, sp, who in zip(prompts, samplings, tenants, strict=True):
                ids.append(self._new_id())
                self._owners[ids[-1]] = queue             # owned before its first output
                self.add_request(prompt, sp, ids[-1], max_new_tokens, stop_token_ids, stop,
                                 eos_token_id, who)
        except Exception:
            self._close(ids)
            raise
        return ids, queue

    def _new_id(self) -> str:
        """The next automatic request id not already in use."""
        while (rid := str(next(self._ids))) in self._sequences or rid in self._owners:
            pass
        return rid


# ---------------------------------------------------------------------- helpers


def _check_engine_args(target, draft, drafter, kv_cache, block_size, num_blocks, max_batch_size,
                       max_num_batched_tokens) -> Any:
    """``ValueError`` with a clear message for arguments that contradict each other, an
    inconsistent cache configuration or a size that is not a positive integer (``None``, where
    allowed, asks for the default), ``TypeError`` for a target that is not a model; the drafter
    spec to use."""
    if not isinstance(target, Llama):
        raise TypeError(f"target must be a minispec Llama (from ms.load), got "
                        f"{type(target).__name__}")
    if draft is not None and drafter is not None:
        raise ValueError("give either a draft model (draft=) or a drafter (drafter=), not both")
    if kv_cache not in ("paged", "contiguous"):
        raise ValueError(f"kv_cache must be 'paged' or 'contiguous', got {kv_cache!r}")
    if kv_cache == "contiguous" and num_blocks is not None:
        raise ValueError("num_blocks sizes the paged pool; a contiguous cache has one slot per "
                         "request")
    sizes = (("max_batch_size", max_batch_size, False), ("block_size", block_size, False),
             ("num_blocks", num_blocks, True),
             ("max_num_batched_tokens", max_num_batched_tokens, True))    # True: None allowed
    for name, value, may_be_none in sizes:
        if not (is_int(value) and value >= 1) and not (may_be_none and value is None):
            allowed = "a positive integer or None" if may_be_none else "a positive integer"
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return draft if draft is not None else drafter


def _per_prompt(value: Any, prompts: Seq[Any], what: str) -> list[Any]:
    """One value for every prompt, or a list or tuple of one per prompt."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * len(prompts)
    if len(values) != len(prompts):
        raise ValueError(f"{len(values)} {what} for {len(prompts)} prompts")
    return values


def check_kv_memory(models: list[Llama], paged: bool, num_slots: int, seq_len: int,
                    block_size: int, num_blocks: int | None) -> None:
    """``ValueError``, before anything is allocated, when the KV caches of ``models`` would need
    more than [`device_memory`][minispec.models.kv_cache.device_memory]: keys and values of every
    layer at every position (``num_slots * seq_len`` positions, or a paged pool of ``num_blocks *
    block_size``, by default room for every slot to be full), plus
    ``BLOCK_BOOKKEEPING`` bytes per block."""
    blocks = (num_blocks or num_slots * ceil_div(seq_len, block_size)) if paged else 0
    positions = blocks * block_size if paged else num_slots * seq_len
    per_position = sum(2 * m.config.num_hidden_layers * m.config.num_key_value_heads
                       * m.config.head_dim * m.dtype.itemsize for m in models)
    need = positions * per_position + blocks * BLOCK_BOOKKEEPING * len(models)
    have = device_memory(models[0].device)
    if need > have:
        raise ValueError(
            f"the KV cache would need {need / 2**30:,.1f} GiB ({positions:,} positions x "
            f"{per_position:,} bytes of keys and values{', two models' if len(models) > 1 else ''}"
            f"), more than the {have / 2**30:,.1f} GiB of memory on {models[0].device}: lower "
            "max_batch_size, num_blocks, block_size or max_seq_len")
