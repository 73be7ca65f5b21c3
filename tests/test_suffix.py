"""Suffix drafting (minispec/extra_drafters/suffix.py): the bookkeeping without tensors, the store's
memory bound, and, on tiny random targets, greedy parity, the engine against single runs, and the
target's law under sampling (chains and trees, with and without a store shared by requests)."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from lawcheck import chi_square_pvalue
from tinymodels import exact_two_token_law, tiny_llama

import minispec as ms
from minispec.drafters.ngram import DRAFTERS
from minispec.extra_drafters.suffix import SuffixDrafter, SuffixStore
from minispec.serving.engine import Engine

NEW = 20
PROMPTS = [[1, 2], [3, 4, 5], [5, 6, 5, 6, 5], [9] * 6, list(range(10, 22)), [40, 41, 42, 40, 41],
           [7, 8, 9, 10, 11, 7, 8, 9]]

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------- 1. bookkeeping, no model


def test_the_longest_match_is_continued():
    d = SuffixDrafter(draft_factor=None)
    context = [1, 2, 3, 4, 9, 2, 3, 5, 7, 9, 2, 3]       # "9 2 3" occurred before, then 5
    assert d.lookup(context, 2) == [5, 7]
    assert (d.last_match, d.last_source) == (3, "context")


def test_the_most_frequent_continuation_then_the_newest():
    d = SuffixDrafter(max_match=1)                        # every occurrence of 1 matches alike
    assert d.lookup([1, 5, 1, 6, 1, 5, 9, 1], 1) == [5]   # 5 twice, 6 once
    assert SuffixDrafter(max_match=1).lookup([1, 6, 1, 5, 9, 1], 1) == [5]   # a tie: the newest
    rare = [t for i in range(11) for t in (1, 20 + i)] + [1]     # 11 different continuations
    assert SuffixDrafter(max_match=1, min_prob=0.1).lookup(rare, 1) == []   # each 1/11 < 0.1
    assert SuffixDrafter(max_match=1, min_prob=0.05).lookup(rare, 1) == [30]


def test_the_draft_length_follows_the_match_and_wraps_into_itself():
    assert SuffixDrafter().lookup([1, 2, 1, 2, 1], 6) == [2, 1, 2]              # match 3: 3 tokens
    assert SuffixDrafter(draft_factor=None).lookup([1, 2, 1, 2, 1], 6) == [2, 1, 2, 1, 2, 1]
    assert SuffixDrafter(draft_factor=0.5).lookup([1, 2, 1, 2, 1], 6) == [2, 1]
    assert SuffixDrafter(min_match=4).lookup([1, 2, 1, 2, 1], 6) == []
    assert SuffixDrafter().lookup([4, 5, 6], 3) == []                              # no match
    assert SuffixDrafter().draft([3, 1, 3], 2).probs is None                     # one-hot q


def test_a_new_request_starts_over_and_a_continuation_does_not():
    d = SuffixDrafter()
    assert d.lookup([1, 2, 3, 1, 2], 2) == [3, 1]
    assert d.lookup([1, 2, 3, 1, 2, 3, 1], 2) == [2, 3]      # the same request, grown
    assert d.own.docs[0] == [1, 2, 3, 1, 2, 3, 1]
    assert d.lookup([7, 8, 7], 2) == [8]                     # another request: 1 2 3 forgotten
    assert d.own.docs[0] == [7, 8, 7]


def test_requests_draft_from_each_other_through_a_store():
    store = SuffixStore(max_tokens=100)
    a, b = SuffixDrafter(store), SuffixDrafter(store)
    assert a.lookup([5, 6, 7, 8, 9, 10], 4) == []
    assert b.lookup([0, 5, 6, 7], 4) == [8, 9, 10]           # a's text, match 3 -> 3 drafts
    assert b.last_source == "store"
    assert store.find([5, 6, 7], exclude=a.doc).length == 0  # a's own document is never used
    assert SuffixDrafter().lookup([0, 5, 6, 7], 4) == []     # no store: nothing to copy
    c = SuffixDrafter(store)
    assert c.lookup([9, 10, 3, 9, 10], 1) == [3]             # own text and store match alike:
    assert c.last_source == "context"                        # the own text wins


def test_a_copy_shares_the_store_and_nothing_else():
    store = SuffixStore()
    d = SuffixDrafter(store, max_match=8, min_prob=0.2)
    d.lookup([1, 2, 3], 2)
    c = copy.deepcopy(d)
    assert c.store is store and c.own.docs[0] == [] and c.doc is None
    assert c.max_match == 8 and c.min_prob == 0.2
    assert isinstance(DRAFTERS["suffix"](), SuffixDrafter)


def test_the_store_evicts_the_oldest_documents():
    store = SuffixStore(max_tokens=10)
    docs = [store.open() for _ in range(3)]
    for doc, first in zip(docs, (100, 200, 300), strict=True):
        store.extend(doc, list(range(first, first + 4)))
    assert list(store.docs) == docs[1:] and store.num_tokens == 8
    assert store.find([100, 101]).length == 0 and store.find([200, 201]).length == 2
    store.extend(docs[1], [7] * 20)                          # longer than max_tokens: dropped
    assert list(store.docs) == docs[2:] and store.num_tokens == 4
    store.extend(docs[1], [1, 2])                            # an evicted document stays gone
    assert docs[1] not in store.docs
    few = SuffixStore(max_docs=2)
    for _ in range(3):
        few.extend(few.open(), [1, 2])
    assert len(few.docs) == 2


def test_memory_stays_bounded_under_a_long_stream():
    rng = random.Random(0)
    store = SuffixStore(max_tokens=300, max_docs=8)
    drafters = [SuffixDrafter(store) for _ in range(5)]
    contexts = [[] for _ in drafters]
    for _ in range(600):
        i = rng.randrange(len(drafters))
        if rng.random() < 0.02:
            contexts[i] = []                                  # that drafter starts a new request
        contexts[i] += [rng.randrange(12) for _ in range(rng.randrange(1, 6))]
        drafters[i].lookup(contexts[i], 4)
        assert store.num_tokens == sum(len(t) for t in store.docs.values()) <= 300
        assert store.num_positions == sum(len(p) for p in store.positions.values())
        assert store.num_positions <= 2 * store.num_tokens and len(store.docs) <= 8
    assert store.num_tokens > 100                             # it was filled, not emptied


def test_bad_arguments():
    for kwargs in (dict(min_match=0), dict(min_match=5, max_match=4), dict(max_candidates=0),
                   dict(draft_factor=0), dict(min_prob=1.5)):
        with pytest.raises(ValueError):
            SuffixDrafter(**kwargs)
    for kwargs in (dict(max_tokens=0), dict(max_docs=0)):
        with pytest.raises(ValueError):
            SuffixStore(**kwargs)


# ---------------------------------------------------------------------- 2. greedy parity


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=1)


@pytest.fixture(scope="module")
def baselines(target):
    return [ms.generate(target, p, NEW).tokens for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("make", [SuffixDrafter, lambda: "suffix",
                                  lambda: SuffixDrafter(SuffixStore(max_tokens=40))],
                         ids=["instance", "name", "store"])
def test_greedy_output_is_the_targets(target, baselines, make, k):
    drafter, accepted = make(), 0
    for prompt, base in zip(PROMPTS, baselines, strict=True):
        out = ms.speculative_generate(target, drafter, prompt, NEW, k=k, adaptive=False)
        assert out.tokens == base and out.finish_reason == "length"
        accepted += out.stats.accepted          # (a fixed k: goodput k may choose not to draft)
    assert accepted > 0


def test_a_store_of_earlier_requests_raises_acceptance_not_outputs(target, baselines):
    store = SuffixStore()
    passes = []
    for _ in range(2):       # a fixed k: forwards counted under goodput k depend on the clock
        outs = [ms.speculative_generate(target, SuffixDrafter(store), p, NEW, k=4, adaptive=False)
                for p in PROMPTS]
        assert [o.tokens for o in outs] == baselines
        passes.append(sum(o.stats.target_forwards for o in outs))
    assert passes[1] < passes[0] * 0.5                        # the second pass copies the first


@pytest.mark.parametrize("branching", [(2, 2, 1), (3, 1, 1, 1)])
def test_greedy_trees_from_a_store(target, baselines, branching):
    drafter = SuffixDrafter(SuffixStore(), max_match=2)      # short matches: several continuations
    wide = 0
    for prompt, base in zip(PROMPTS * 2, baselines * 2, strict=True):
        out = ms.speculative_generate(target, drafter, prompt, NEW, k=len(branching),
                                      branching=branching)
        assert out.tokens == base
    seq = ms.Sequence.new("t", [5, 6, 5, 7, 5, 8, 5], None, max_new_tokens=4, max_seq_len=64,
                          vocab_size=48)
    state = drafter.for_request(seq)                          # the tree form: the same class
    assert type(state) is SuffixDrafter and state.store is drafter.store
    proposal = SuffixDrafter(max_match=1, min_prob=0).propose([seq], [(3, 1)])[0]
    wide = len(proposal.draws[0])
    assert wide == 3 and sorted(proposal.tree.tokens[c] for c, _ in proposal.draws[0]) == [6, 7, 8]


# ---------------------------------------------------------------------- 3. the engine


@pytest.mark.parametrize("spec", ["suffix", "instance", "store", "tree"])
def test_engine_equals_single_runs(target, baselines, spec):
    drafter = {"suffix": "suffix", "instance": SuffixDrafter(), "tree": "suffix",
               "store": SuffixDrafter(SuffixStore(max_tokens=50))}[spec]
    branching = (2, 1, 1) if spec == "tree" else None
    engine = Engine(target, drafter=drafter, k=3, max_batch_size=4, block_size=4,
                    branching=branching, adaptive=False)
    results = engine.generate(PROMPTS, progress=False, max_new_tokens=NEW)
    assert [r.tokens for r in results] == baselines
    assert sum(r.stats.accepted for r in results) > 0
    assert engine.target_cache.num_used_blocks == 0
    if spec in ("suffix", "instance"):                        # no store: each drafts as if alone
        for prompt, result in zip(PROMPTS, results, strict=True):
            single = ms.speculative_generate(target, SuffixDrafter(), prompt, NEW, k=3,
                                             adaptive=False)
            assert result.stats.accepted_per_round == single.stats.accepted_per_round


# ---------------------------------------------------------------------- 4. sampled law


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_k=3)],
                         ids=["t1", "top_k"])
@pytest.mark.parametrize("mode", ["chain", "store-tree"])
def test_sampled_output_has_the_targets_law(params, mode):
    """The first two of three tokens follow the target's exact law. The prompt repeats "1 2", so
    the first round drafts "3 1" from the context; with a store shared by all 1200 requests, later
    rounds also draft what other requests wrote, as trees of up to two children."""
    target = tiny_llama(vocab=5, seed=3, scale=0.5)
    params = ms.SamplingParams(**params)
    prompt = [1, 2, 3, 1, 2]
    law = exact_two_token_law(target, prompt, params)
    n = 1200
    drafter = SuffixDrafter(SuffixStore(max_tokens=2000), max_match=2) if mode == "store-tree" \
        else SuffixDrafter()
    engine = Engine(target, drafter=drafter, k=2, max_batch_size=64, block_size=4,
                    branching=(2, 1) if mode == "store-tree" else None)
    wide = []
    if mode == "store-tree":                                  # count trees that branch
        propose = engine.drafter.propose
        engine.drafter.propose = lambda seqs, shapes: [
            wide.append(len(p.draws[0]) > 1) or p for p in propose(seqs, shapes)]
    results = engine.generate([prompt] * n, [dataclasses.replace(params, seed=s) for s in range(n)],
                              progress=False, max_new_tokens=3)
    assert mode == "chain" or sum(wide) > 10
    counts = torch.zeros(25)
    for result in results:
        counts[result.tokens[0] * 5 + result.tokens[1]] += 1
    accepted = sum(r.stats.accepted for r in results)
    assert 0 < accepted < sum(r.stats.tested for r in results)      # both paths taken
    keep = law * n >= 5                                                # merge rare cells into one
    merged_counts = torch.cat([counts[keep], counts[~keep].sum()[None]])
    merged_law = torch.cat([law[keep], law[~keep].sum()[None]])
    assert chi_square_pvalue(merged_counts, merged_law) > 1e-3
