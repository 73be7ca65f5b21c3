"""Grade a KV cache's rollback: after ``truncate_to`` the cache must behave exactly like one that
never saw the rejected tokens; and a scheduler's reservation of paged blocks for a round.

The cache under test implements minispec's [`KVCache`][minispec.models.kv_cache.KVCache]
interface (``allocate``, ``length``, ``truncate_to`` and the ``prepare`` / ``update`` /
``commit`` steps a forward uses); the check receives a *factory*
``cache_factory(model, num_slots, max_seq_len) -> cache``, e.g.
[`ContiguousKVCache.for_model`][minispec.models.kv_cache.ContiguousKVCache.for_model].
[`reservation`][minispec.check.caches.reservation] grades a plain function
``fn(held, needs, block_size, free_blocks) -> preempted``, the rule of
[`Scheduler`][minispec.serving.scheduler.Scheduler].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from minispec.check import harness
from minispec.check.harness import TIMEOUT, Failure, StudentError, call, run_cases, run_table
from minispec.check.models import tiny_llama
from minispec.check.report import CheckReport, Counterexample
from minispec.models.block_manager import BlockManager
from minispec.models.llama import Llama
from minispec.serving.scheduler import KVCacheSpace, Scheduler

K, ROUNDS, MAX_LEN = 3, 6, 48


def _forward(model: Llama, cache: Any, slot: int, ids: list[int], start: int) -> torch.Tensor:
    """Feed ``ids`` at positions ``start..`` of ``slot``; logits ``(T, V)``."""
    positions = torch.arange(start, start + len(ids))[None]                  # (1, T)
    inputs = {"slot": slot, "positions": positions[0].tolist()}
    with torch.inference_mode():
        return call(model, torch.tensor([ids]), positions, cache, [slot], inputs=inputs)[0]


def _compare(got: torch.Tensor, model: Llama, ids: list[int], what: str, inputs: dict) -> None:
    """``got``, the logits of the last tokens of ``ids``, must equal a forward with no cache."""
    with torch.inference_mode():
        want = model(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -len(got):]
    error = float((got - want).abs().max())
    if error > 1e-4 * max(1.0, float(want.abs().max())):
        raise Failure(Counterexample(what, inputs, [("max |logit difference|", 0.0, error)]))


def _bookkeeping(cache: Any, slot: int, n: int, inputs: dict) -> None:
    """The length after truncation, and (paged caches) the blocks kept: ``ceil(n / block)``."""
    length = call(cache.length, slot, inputs=inputs)
    if harness.as_int(length) != n:
        raise Failure(Counterexample(f"after truncate_to(slot, {n}) the cache reports length "
                                     f"{length}", inputs))
    if hasattr(cache, "block_table"):
        held = len(call(cache.block_table, slot, inputs=inputs))
        need = math.ceil(n / cache.block_size)
        if held != need:
            raise Failure(Counterexample(
                f"after truncate_to(slot, {n}) the slot holds {held} blocks of "
                f"{cache.block_size} positions; it needs ceil({n} / {cache.block_size}) = {need} "
                "(blocks whose first position is >= n go back to the pool; the partly used "
                "last block stays)", inputs))


def _round(model, cache, slot, context, g, one_by_one: bool) -> list[int]:
    """One verify round on ``slot``: feed ``[last, d_1..d_k]``, keep ``a`` drafts, truncate."""
    V, n = model.config.vocab_size, len(context)
    drafts = torch.randint(0, V, (K,), generator=g).tolist()
    fed = [context[-1]] + drafts                                 # positions n-1 .. n-1+K
    if one_by_one:      # a draft model writes its drafts one forward at a time
        got = torch.cat([_forward(model, cache, slot, [x], n - 1 + i) for i, x in enumerate(fed)])
    else:
        got = _forward(model, cache, slot, fed, n - 1)
    inputs = {"slot": slot, "context_length": n, "fed": fed}
    _compare(got, model, context + drafts, "the logits of a verify block differ from a cache-free "
             "forward over the kept tokens (a rolled-back entry is still seen, or a kept one was "
             "lost)", inputs)
    accepted = int(torch.randint(0, K + 1, (), generator=g))
    inputs = dict(inputs, accepted=accepted, truncate_to=n + accepted)
    call(cache.truncate_to, slot, n + accepted, inputs=inputs)
    _bookkeeping(cache, slot, n + accepted, inputs)
    return context + drafts[:accepted] + [int(torch.randint(0, V, (), generator=g))]


def _make(factory: Callable, model: Llama, num_slots: int) -> Any:
    """``factory(model, num_slots, MAX_LEN)``, failing unless it returns a KV cache."""
    inputs = {"num_slots": num_slots, "max_seq_len": MAX_LEN}
    cache = call(factory, model, num_slots, MAX_LEN, inputs=inputs)
    if not all(hasattr(cache, m) for m in ("allocate", "length", "truncate_to")):
        raise Failure(Counterexample("the factory must return a KV cache (with allocate, length, "
                                     f"truncate_to), not {type(cache).__name__}", inputs))
    return cache


def _rounds_case(factory: Callable, model: Llama, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    cache = _make(factory, model, 2)
    slots = [call(cache.allocate), call(cache.allocate)]
    V = model.config.vocab_size
    contexts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (7, 11)]
    for slot, context in zip(slots, contexts, strict=True):          # prefill all but the last
        _forward(model, cache, slot, context[:-1], 0)
    for r in range(ROUNDS):
        for i, slot in enumerate(slots):
            contexts[i] = _round(model, cache, slot, contexts[i], g, one_by_one=(r + i) % 2 == 1)
    return "every verify block matches a cache-free forward; lengths and blocks right"


def _contract_case(factory: Callable, model: Llama, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    cache = _make(factory, model, 1)
    slot = call(cache.allocate)
    ids = torch.randint(0, model.config.vocab_size, (20,), generator=g).tolist()
    _forward(model, cache, slot, ids[:19], 0)
    inputs, raised = {"length": 19, "n": 20}, None
    try:
        call(cache.truncate_to, slot, 20, inputs=inputs)
    except StudentError as err:
        if isinstance(err.error, NotImplementedError):
            raise                                               # a stub: not implemented yet
        raised = err.error
    if not isinstance(raised, ValueError):
        got = f"it raised {type(raised).__name__}: {raised}" if raised else "it returned"
        raise Failure(Counterexample("truncate_to(slot, n) with n > length must raise ValueError "
                                     f"(there is nothing to keep past the cached length); {got}",
                                     inputs))
    inputs = {"length": 19, "truncate_to": 0}
    call(cache.truncate_to, slot, 0, inputs=inputs)                  # forget everything,
    _bookkeeping(cache, slot, 0, inputs)
    got = _forward(model, cache, slot, ids[5:12], 0)                 # then reuse the slot
    _compare(got, model, ids[5:12], "after truncate_to(slot, 0) the slot still remembers its "
             "old tokens", inputs)
    return "n > length raises ValueError; truncating to 0 empties the slot"


def rollback(cache_factory: Callable, *, seed: int = 0,
             timeout: float = TIMEOUT, budget: float = harness.GRADE_BUDGET) -> CheckReport:
    """Check that ``truncate_to`` makes a cache equal to one that never saw the rejected tokens.

    A tiny random Llama (2 layers, GQA, 64 tokens) decodes with a cache from
    ``cache_factory(model, num_slots, max_seq_len)``. Cases:

    1. 6 speculative rounds on 2 slots, interleaved: each round feeds ``[last, d_1..d_3]`` (in one
       forward, or one token per forward as a draft model does), keeps a random number of drafts
       ``a`` and calls ``truncate_to(slot, n + a)``. Every verify block's logits must equal a
       forward over the kept tokens with *no cache* (within ``1e-4`` of the logit scale, for
       float rounding); the cache's ``length`` must be ``n + a``; a paged cache (one with
       ``block_table``) must hold exactly ``ceil((n + a) / block_size)`` blocks;
    2. the contract: ``truncate_to`` past the length raises ``ValueError``; truncating to 0 then
       reusing the slot gives the logits of a fresh sequence.

    Deterministic: no false alarms (the tolerance is about 100 times the float32 rounding of these
    logits, and a stale or lost entry moves them by orders of magnitude more).

    Args:
        cache_factory: makes the cache under test.
        seed: seeds the tokens and the acceptance lengths.
        timeout: seconds each call of the cache (or the factory, or a forward through it) may
            take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    model = tiny_llama(64, seed=seed + 200, max_positions=MAX_LEN)
    cases = [(f"{ROUNDS} rounds of verify and rollback on 2 slots, k={K}",
              lambda: _rounds_case(cache_factory, model, seed)),
             ("truncate_to's contract", lambda: _contract_case(cache_factory, model, seed + 1))]
    return run_cases("rollback", cases, 0.0, timeout, budget)


kv_cache = rollback
"""Alias of [`rollback`][minispec.check.caches.rollback] (the issue's second name for it)."""


def preempted(held: list[int], needs: list[int], block_size: int, free_blocks: int) -> list[int]:
    """The requests minispec's [`Scheduler`][minispec.serving.scheduler.Scheduler] preempts, in
    order, when running requests holding ``held`` blocks reserve rounds of ``needs`` positions.

    The scheduler sees the pool through [`KVCacheSpace`][minispec.serving.scheduler.KVCacheSpace]
    over one [`BlockManager`][minispec.models.block_manager.BlockManager] (request ``i`` is its
    sequence ``i``, holding ``held[i]`` blocks, with ``free_blocks`` more in the pool); each
    request is seen as its index, and the positions its round needs."""
    blocks = BlockManager(sum(held) + free_blocks, block_size)
    for i, n in enumerate(held):
        blocks.allocate(i)
        blocks.grow(i, n * block_size)
    scheduler = Scheduler(KVCacheSpace(blocks), len(held), k=0)
    scheduler.running = [SimpleNamespace(index=i, slot=i, draft_slot=None, is_finished=False,
                                         round_len=lambda k, n=n: n, preempt=lambda: None)
                         for i, n in enumerate(needs)]
    try:
        return [seq.index for seq in scheduler.schedule().preempted]
    except RuntimeError:        # all preempted: "stuck", they wait in the reverse order
        return [seq.index for seq in reversed(scheduler.waiting)]


#: ``(held, needs, block_size, free_blocks)`` at the edges of the rule, by name.
EDGES = [
    ("enough free blocks: nothing preempted", ([2, 1, 3], [9, 4, 13], 4, 2)),
    ("a round inside the blocks held takes none", ([2, 3], [8, 9], 4, 0)),
    ("the pool runs dry: the newest goes", ([2, 2, 2, 2], [12, 12, 12, 12], 4, 1)),
    ("its blocks go back to the pool: one preemption serves three", ([3, 3, 3, 4], [16] * 4,
                                                                       4, 0)),
    ("the oldest alone does not fit: every request goes, itself last", ([1, 1, 1], [40, 4, 4],
                                                                        4, 0)),
]


def _batches(seed: int) -> list[tuple[list[int], list[int], int, int]]:
    """300 seeded batches: 1 to 6 requests of 1 to 40 positions holding ``ceil(n / b)`` blocks,
    rounds of 0 to 8 more positions, ``b`` in 1, 4, 16, and 0 to 5 free blocks."""
    g, out = torch.Generator().manual_seed(seed), []
    for _ in range(300):
        count = int(torch.randint(1, 7, (), generator=g))
        size = (1, 4, 16)[int(torch.randint(0, 3, (), generator=g))]
        lengths = torch.randint(1, 41, (count,), generator=g)
        needs = lengths + torch.randint(0, 9, (count,), generator=g)
        out.append((((lengths + size - 1) // size).tolist(), needs.tolist(), size,
                    int(torch.randint(0, 6, (), generator=g))))
    return out


def _reservation_case(fn: Callable, held: list[int], needs: list[int], block_size: int,
                      free_blocks: int) -> None:
    inputs = {"held": held, "needs": needs, "block_size": block_size, "free_blocks": free_blocks}
    out = call(fn, list(held), list(needs), block_size, free_blocks, inputs=inputs)
    got = harness.as_tokens(out, inputs, len(held), "request indices")
    want = preempted(held, needs, block_size, free_blocks)
    if got != want:
        raise Failure(Counterexample(
            "the preempted requests differ: reserve ceil(needs[i] / block_size) blocks for each "
            "request, oldest first; when too few are free, preempt the newest still running (its "
            "held blocks go back to the pool) until it fits, or it was preempted itself", inputs,
            [("preempted, in order", want, got)]))


def reservation(fn: Callable, *, seed: int = 0, timeout: float = TIMEOUT,
                budget: float = harness.GRADE_BUDGET) -> CheckReport:
    """Check that ``fn(held, needs, block_size, free_blocks)`` preempts as minispec's scheduler.

    Before a step, continuous batching reserves each running request's round (``needs[i]``
    positions: ``ceil(needs[i] / block_size)`` blocks, of which it holds ``held[i]``), oldest
    (index 0) first, from ``free_blocks`` free blocks; when the pool is short it preempts the
    *newest* request still running, whose blocks go back to the pool, until the request fits or
    is itself preempted (lesson 08). ``fn`` returns the indices preempted, in order (a list, a
    tensor, any iterable of integers). Deterministic, against
    [`Scheduler`][minispec.serving.scheduler.Scheduler] on a
    [`BlockManager`][minispec.models.block_manager.BlockManager] (``preempted``): the 5 ``EDGES``,
    then 300 seeded batches (``_batches``) that cover no preemption, some, and all. The lists
    handed to ``fn`` are copies. No randomness in the verdict, hence no false alarm.

    Args:
        fn: the reservation rule under test.
        seed: seeds the batches.
        timeout: seconds each call of ``fn`` may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    groups = [(name, [args]) for name, args in EDGES] + [("300 seeded batches", _batches(seed))]
    return run_table("reservation", _reservation_case, fn, groups, "as the scheduler", timeout,
                     budget)
