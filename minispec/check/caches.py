"""Grade a KV cache's rollback: after ``truncate_to`` the cache must behave exactly like one that
never saw the rejected tokens.

The cache under test implements minispec's [`KVCache`][minispec.models.kv_cache.KVCache]
interface (``allocate``, ``length``, ``truncate_to`` and the ``prepare`` / ``update`` /
``commit`` steps a forward uses); the check receives a *factory*
``cache_factory(model, num_slots, max_seq_len) -> cache``, e.g.
[`ContiguousKVCache.for_model`][minispec.models.kv_cache.ContiguousKVCache.for_model].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from minispec.check.harness import TIMEOUT, Failure, StudentError, as_int, call, run_cases
from minispec.check.models import tiny_llama
from minispec.check.report import CheckReport, Counterexample
from minispec.models.llama import Llama

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
    if as_int(length) != n:
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
             timeout: float = TIMEOUT) -> CheckReport:
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

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    model = tiny_llama(64, seed=seed + 200, max_positions=MAX_LEN)
    cases = [(f"{ROUNDS} rounds of verify and rollback on 2 slots, k={K}",
              lambda: _rounds_case(cache_factory, model, seed)),
             ("truncate_to's contract", lambda: _contract_case(cache_factory, model, seed + 1))]
    return run_cases("rollback", cases, 0.0, timeout)


kv_cache = rollback
"""Alias of [`rollback`][minispec.check.caches.rollback] (the issue's second name for it)."""
