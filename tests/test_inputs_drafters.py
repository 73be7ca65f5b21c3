"""Every input checked, drafters and engine (issue "Every input checked", items 6-8): constructor
numbers refused with one ``ValueError`` naming the argument; a copy of a ``SuffixDrafter``
subclass keeps its overrides in the engine; KV caches larger than the machine refused before
allocation; and tenants never see each other's text through a shared suffix store."""

from __future__ import annotations

import copy
import math

import pytest
from test_eagle import random_head
from tinymodels import tiny_llama

import minispec as ms
from minispec.drafters.base import Drafter
from minispec.extra_drafters.eagle import EagleDrafter
from minispec.extra_drafters.hybrid import HybridDrafter
from minispec.extra_drafters.suffix import SuffixDrafter, SuffixStore
from minispec.serving.engine import Engine
from minispec.serving.scheduler import Scheduler

pytestmark = pytest.mark.usefixtures("one_thread")

NAN, INF = math.nan, math.inf
PROMPTS = [[1, 2, 3, 1, 2, 3, 1], [5, 6, 5, 6, 5], list(range(10, 22))]
NEW = 10


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=1)


@pytest.fixture(scope="module")
def baselines(target):
    return [ms.generate(target, p, NEW).tokens for p in PROMPTS]


# ---------------------------------------------------------------------- 1. constructor numbers


@pytest.mark.parametrize("make, message", [
    (lambda: SuffixStore(max_tokens=NAN), "SuffixStore: max_tokens must be an integer >= 1 or "
                                          "None, got nan"),
    (lambda: SuffixStore(max_tokens=2.5), "SuffixStore: max_tokens must be an integer"),
    (lambda: SuffixStore(max_docs=True), "SuffixStore: max_docs must be an integer >= 1, got True"),
    (lambda: SuffixDrafter(max_match="3"), "SuffixDrafter: max_match must be an integer >= 1, "
                                           "got '3'"),
    (lambda: SuffixDrafter(max_match=2.5), "SuffixDrafter: max_match must be an integer"),
    (lambda: SuffixDrafter(draft_factor=NAN), "SuffixDrafter: draft_factor must be a finite "
                                              "number > 0 or None, got nan"),
    (lambda: SuffixDrafter(draft_factor=INF), "draft_factor"),
    (lambda: SuffixDrafter(min_match=5, max_match=4), r"min_match must be an integer in "
                                                      r"\[1, max_match=4\], got 5"),
    (lambda: SuffixDrafter(min_match="2", max_match="3"), "max_match"),     # the first bad one
    (lambda: SuffixDrafter(min_prob=NAN), "SuffixDrafter: min_prob must be a number in"),
    (lambda: SuffixDrafter(max_candidates=True), "SuffixDrafter: max_candidates"),
    (lambda: SuffixDrafter(store="shared"), "SuffixDrafter: store must be a SuffixStore or None"),
    (lambda: SuffixDrafter(tenant=7), "SuffixDrafter: tenant must be a string or None, got 7"),
    (lambda: HybridDrafter(head=Drafter(), min_match="2"), "HybridDrafter: min_match must be an "
                                                           "integer >= 1, got '2'"),
    (lambda: HybridDrafter(head=Drafter(), head_cost=NAN), "HybridDrafter: head_cost must be a "
                                                           "finite number >= 0, got nan"),
    (lambda: HybridDrafter(head=Drafter(), decay=INF), "HybridDrafter: decay must be a number "
                                                       r"in \(0, 1\], got inf"),
    (lambda: HybridDrafter(SuffixDrafter(), None), "HybridDrafter: head must be a batched"),
], ids=lambda x: "" if callable(x) else x.split(",")[0][:40])
def test_constructors_refuse_bad_numbers_naming_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_good_numbers_are_still_taken():
    SuffixStore(max_tokens=None, max_docs=1)
    d = SuffixDrafter(SuffixStore(), max_match=1, min_match=1, draft_factor=None, min_prob=0,
                      max_candidates=1, tenant="alice")
    assert d.tenant == "alice"
    SuffixDrafter(draft_factor=2, min_prob=1)                  # an int where a float is asked
    HybridDrafter(head=Drafter(), head_cost=0, decay=1)


@pytest.mark.parametrize("kwargs", [dict(max_batch_size=0), dict(max_batch_size=2.0),
                                    dict(k=-1), dict(k=True), dict(watermark_blocks=NAN),
                                    dict(extra_positions="1")])
def test_the_scheduler_checks_its_numbers(kwargs):
    args = dict(max_batch_size=2, k=1) | kwargs
    with pytest.raises(ValueError, match=f"Scheduler: {next(iter(kwargs))} must be an integer"):
        Scheduler(None, **args)


# ---------------------------------------------------------------------- 2. a copy keeps the class


def test_a_copy_keeps_the_subclass_and_the_engine_runs_its_override(target, baselines):
    calls: list[int] = []                                      # shared by every copy

    class Recording(SuffixDrafter):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.mine: list[int] = []                          # each copy's own

        def lookup(self, context: list[int], k: int) -> list[int]:
            calls.append(len(context))
            self.mine.append(len(context))
            return super().lookup(context, k)

    store = SuffixStore()
    proto = Recording(store, max_match=3, tenant="t")
    proto.lookup([1, 2, 1], 2)
    twin = copy.deepcopy(proto)
    assert type(twin) is Recording and twin.store is store and twin.max_match == 3
    assert twin.tenant == "t" and twin.own.docs[0] == [] and twin.doc is None
    assert twin.mine == [3] and twin.mine is not proto.mine   # its own state, copied
    calls.clear()
    engine = Engine(target, drafter=Recording(store), k=2, max_batch_size=2, block_size=4,
                    adaptive=False)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    assert [r.tokens for r in results] == baselines
    assert len(calls) >= len(PROMPTS)                          # the override drafted every request


# ---------------------------------------------------------------------- 3. memory bounds


@pytest.fixture(scope="module")
def long_target():
    return tiny_llama(seed=0, layers=1, max_pos=2048)


@pytest.mark.parametrize("kwargs", [dict(block_size=10**9), dict(max_batch_size=10**7),
                                    dict(max_batch_size=10**7, kv_cache="contiguous"),
                                    dict(num_blocks=10**9)],
                         ids=["block_size", "max_batch_size", "contiguous", "num_blocks"])
def test_a_cache_larger_than_the_machine_is_refused_before_allocation(long_target, kwargs):
    with pytest.raises(ValueError, match=r"the KV cache would need [\d,]+\.\d GiB \([\d,]+ "
                                         r"positions x 128 bytes of keys and values\), more than "
                                         r"the [\d,.]+ GiB of memory on cpu"):
        Engine(long_target, **kwargs)
    with pytest.raises(ValueError, match="two models"):        # a draft model's cache counts too
        Engine(long_target, draft=long_target, max_batch_size=10**7)


@pytest.mark.parametrize("kwargs, name", [
    (dict(block_size=2.5), "block_size"), (dict(num_blocks=NAN), "num_blocks"),
    (dict(max_batch_size=True), "max_batch_size"), (dict(max_seq_len=NAN), "max_seq_len"),
    (dict(drafter="suffix", k="3"), "k"), (dict(max_num_batched_tokens=0),
                                           "max_num_batched_tokens")])
def test_the_engine_checks_its_other_numbers(target, kwargs, name):
    with pytest.raises(ValueError, match=f"{name} must be"):
        Engine(target, **kwargs)


def test_a_tenant_is_a_string(target):
    engine = Engine(target, drafter="suffix", k=2, max_batch_size=2, block_size=4)
    with pytest.raises(ValueError, match="tenant must be a string or None, got 3"):
        engine.add_request([1, 2], tenant=3)
    with pytest.raises(ValueError, match="2 tenants for 3 prompts"):
        engine.generate(PROMPTS, progress=False, tenant=["a", "b"])
    assert not engine.has_unfinished()


# ---------------------------------------------------------------------- 4. tenants

SECRET = [30, 31, 32, 33, 34, 35, 36, 37]          # a password: distinct tokens, never repeated
LEAKED = SECRET[3:6]                               # what a request stopping at SECRET[:3] could see


def test_a_store_finds_only_the_tenants_own_documents():
    store = SuffixStore()
    SuffixDrafter(store, tenant="alice").lookup([2] + SECRET, 4)       # alice's request
    prefix = [2] + SECRET[:3]
    assert SuffixDrafter(store, tenant="bob").lookup(prefix, 3) == []
    assert SuffixDrafter(store).lookup(prefix, 3) == []                # nor one without a tenant
    assert SuffixDrafter(store, tenant="alice").lookup(prefix, 3) == LEAKED
    shared = SuffixStore()
    SuffixDrafter(shared).lookup([2] + SECRET, 4)
    assert SuffixDrafter(shared).lookup(prefix, 3) == LEAKED          # untagged: shared, as before
    assert shared.find(prefix).length == 4 and store.find(prefix).length == 0


def _drafter(kind: str, target):
    suffix = SuffixDrafter(SuffixStore())
    return {"chain": suffix, "tree": suffix,
            "hybrid": HybridDrafter(suffix, EagleDrafter(random_head(target)))}[kind]


def _bob_and_alice(target, kind: str, tenants: bool, secret_first: bool) -> list:
    """Bob's and Alice's requests, both the secret's beginning, in one batch of a fresh engine;
    after a request of Alice's holding the whole secret if ``secret_first``. Their results."""
    engine = Engine(target, drafter=_drafter(kind, target), k=3, max_batch_size=4, block_size=4,
                    adaptive=False, branching=(1, 1, 1) if kind == "tree" else None)
    if secret_first:
        engine.generate([[2] + SECRET], progress=False, max_new_tokens=4,
                        tenant="alice" if tenants else None)
    prompt = [2] + SECRET[:3]
    results = engine.generate([prompt, prompt], progress=False, max_new_tokens=NEW,
                              tenant=["bob", "alice"] if tenants else None)
    assert [r.tokens for r in results] == [ms.generate(target, prompt, NEW).tokens] * 2
    return results


@pytest.mark.parametrize("kind", ["chain", "tree", "hybrid"])
def test_tenants_never_see_each_others_text(target, kind):
    """Alice's request holds a secret; Bob's prompt is its beginning. Without tenants Bob's first
    draft is Alice's secret (the leak this guards against); with tenants Bob drafts exactly what
    he drafts where Alice never wrote anything, and Alice's next request still drafts her text.
    Outputs are the target's throughout."""
    bob, _ = _bob_and_alice(target, kind, tenants=False, secret_first=True)
    assert bob.rounds[0].drafts == LEAKED                       # the leak, without tenants
    bob, alice = _bob_and_alice(target, kind, tenants=True, secret_first=True)
    bob_alone, alice_alone = _bob_and_alice(target, kind, tenants=True, secret_first=False)
    assert alice.rounds[0].drafts == LEAKED != alice_alone.rounds[0].drafts  # her own text
    assert [r.drafts for r in bob.rounds] == [r.drafts for r in bob_alone.rounds]
    assert bob.rounds[0].drafts != LEAKED
