"""Every value is checked where it enters, before anything is allocated (issue "Every failure stays
with its request", items 5-7): draft ids that are not integers reach the runner's check as they
are, the command lines' counts have bounds the error names, and the drafters' constructors, the
KV caches and the loader refuse a value with one ``ValueError`` naming the field, the value and
what is allowed (with the memory it would need, where the bound follows from memory)."""

from __future__ import annotations

import math
import time

import numpy
import pytest
import torch
from tinymodels import VOCAB, hf_checkpoint, tiny_llama
from tinymodels import load_refused as refused
from tinymodels import write_checkpoint as write

import minispec as ms
from minispec.drafters.trees import MAX_TREE_NODES
from minispec.loading.loader import load
from minispec.models.block_manager import BlockManager
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.paged_cache import PagedKVCache
from minispec.tools import argtypes, cli

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


# ------------------------------------------------------------------- 5. float draft ids


@pytest.mark.parametrize("ids", [[1.9, True], [1.5], [True], ["2"], [torch.tensor(1.5)]],
                         ids=["float-and-bool", "float", "bool", "str", "float-tensor"])
def test_a_draft_id_that_is_not_an_integer_is_kept_as_it_is(ids):
    tokens = ms.Proposal.chain(ids).tree.tokens[1:]
    assert len(tokens) == len(ids) and not any(type(t) is int for t in tokens), tokens
    assert tokens[0] in (1.9, 1.5, True, "2")                            # not truncated to 1


def test_integer_draft_ids_of_any_kind_become_ints():
    ids = [numpy.int64(3), torch.tensor(4), 5]
    tokens = ms.Proposal.chain(ids).tree.tokens
    assert tokens == [-1, 3, 4, 5] and all(type(t) is int for t in tokens)


class ListDrafter(ms.Drafter):
    """Proposes the list ``ids`` after a context holding ``VOCAB - 1``, else the last token."""

    def __init__(self, ids):
        self.ids = ids

    def propose(self, seqs, shapes):
        return [ms.Proposal.chain(self.ids[:k] if VOCAB - 1 in seq.context
                                  else [seq.context[-1]] * k)
                for seq, k in zip(seqs, shapes, strict=True)]


@pytest.mark.parametrize("ids", [[1.9, True], [True]], ids=["float", "bool"])
def test_float_draft_ids_fail_their_request_alone(model, ids):
    engine = ms.Engine(model, drafter=ListDrafter(ids), k=2, max_batch_size=4, adaptive=False)
    bad, good = [1, VOCAB - 1, 2], [3, 4]
    outs = engine.generate([bad, good], max_new_tokens=6, progress=False)
    assert outs[0].finish_reason == "error", outs[0]
    assert "the drafter proposed token ids" in outs[0].error and repr(ids[0]) in outs[0].error
    assert outs[1].tokens == ms.generate(model, good, 6).tokens


# ------------------------------------------------------------------- 6. command-line bounds


def _refused_flag(argv, capsys) -> str:
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    assert time.monotonic() - start < 5                   # refused, not built or run
    return err.strip().splitlines()[-1]                   # argparse's one line, after the usage


def test_a_huge_draft_length_range_is_refused_before_it_is_built(capsys):
    err = _refused_flag(["bench", "--ks", "1-1000000000000"], capsys)
    assert (f"argument --ks: must be integers from 1 to {MAX_TREE_NODES - 1}" in err
            and "got '1-1000000000000'" in err), err
    _refused_flag(["bench", "--hf-ks", "2,4,99999"], capsys)
    assert argtypes.positive_int_list(f"1-{MAX_TREE_NODES - 1}")[-1] == MAX_TREE_NODES - 1


def test_a_sample_count_beyond_minutes_is_refused(capsys):
    err = _refused_flag(["demo", "--samples", "100000000000"], capsys)
    assert (f"argument --samples: must be an integer from 1 to {argtypes.MAX_SAMPLES:,}" in err
            and "got '100000000000'" in err), err
    err = _refused_flag(["demo", "--samples", "0"], capsys)
    assert "argument --samples: must be an integer from 1" in err
    assert argtypes.sample_count(str(argtypes.MAX_SAMPLES)) == argtypes.MAX_SAMPLES


# ------------------------------------------------------------------- 7. constructors


@pytest.mark.parametrize("make, message", [
    (lambda: ms.NGramDrafter(max_order=2.5), "NGramDrafter: max_order must be an integer >= 2, "
                                             "got 2.5"),
    (lambda: ms.NGramDrafter(max_order=True), "max_order must be an integer >= 2, got True"),
    (lambda: ms.NGramDrafter(window=math.inf), r"NGramDrafter: window must be an integer >= "
                                               r"max_order \(4\), got inf"),
    (lambda: ms.NGramDrafter(window=3), r"window must be an integer >= max_order \(4\), got 3"),
    (lambda: ms.PromptLookupDrafter(max_ngram=1.5), "PromptLookupDrafter: max_ngram must be an "
                                                    "integer >= 1, got 1.5"),
    (lambda: ms.PromptLookupDrafter(min_ngram=4), r"PromptLookupDrafter: min_ngram must be an "
                                                  r"integer in \[1, max_ngram \(3\)\], got 4"),
    (lambda: ContiguousKVCache(1, 1, 8, 1, head_dim=0), "ContiguousKVCache: head_dim must be a "
                                                        "positive integer, got 0"),
    (lambda: ContiguousKVCache(1, 1, 8, 1.5, 4), "ContiguousKVCache: num_kv_heads must be a "
                                                 "positive integer, got 1.5"),
    (lambda: PagedKVCache(0, 1, 8, 1, 4), "PagedKVCache: num_layers must be a positive integer"),
    (lambda: PagedKVCache(1, 1, 8, 1, 4, block_size=2.5), "PagedKVCache: block_size must be a "
                                                          "positive integer, got 2.5"),
    (lambda: PagedKVCache(1, 1, 8, 1, 4, num_blocks=math.nan), "PagedKVCache: num_blocks must "
                                                               "be a positive integer"),
    (lambda: BlockManager(4, True), "BlockManager: block_size must be a positive integer, got "
                                    "True"),
], ids=lambda x: "" if callable(x) else x.split(",")[0][:40])
def test_constructors_refuse_a_bad_value_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_good_values_are_still_taken():
    assert ms.NGramDrafter(max_order=2, window=2).window == 2
    assert ms.PromptLookupDrafter(max_ngram=1).min_ngram == 1
    assert ContiguousKVCache(1, 2, 8, 1, 4).num_blocks == 2
    assert PagedKVCache(1, 2, 8, 1, 4, block_size=4).num_blocks == 4


GIB = r"[\d,]+\.\d GiB"


def test_a_paged_pool_larger_than_the_machine_is_refused_before_its_free_list(monkeypatch):
    class NoPool(BlockManager):
        def __init__(self, *args):
            raise AssertionError("the block manager was built before the size was checked")

    monkeypatch.setattr("minispec.models.paged_cache.BlockManager", NoPool)
    with pytest.raises(ValueError, match=rf"PagedKVCache: the cache would need {GIB} \("
                                         r"16,000,000,000,016 positions x 32 bytes of keys and "
                                         rf"values, and 48 bytes per block\), more than the {GIB}"
                                         " of memory on cpu"):
        PagedKVCache(1, 1, 8, 1, 4, num_blocks=10**12)


def test_a_contiguous_cache_larger_than_the_machine_is_refused():
    with pytest.raises(ValueError, match=rf"ContiguousKVCache: the cache would need {GIB} \("
                                         r"1,000,001,000,000 positions x 4,096 bytes"):
        ContiguousKVCache(2, 10**6, 10**6, 4, 64)


# ------------------------------------------------------------------- 7. the loader


@pytest.mark.parametrize("name", ["a" * 5000, "/tmp/" + "b" * 300])
def test_a_name_too_long_for_a_path_is_refused_before_the_hub_is_asked(monkeypatch, name):
    def no_lookup(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr("minispec.loading.loader.from_hub", no_lookup)
    with pytest.raises(ValueError, match=rf"name_or_path is {len(name):,} characters long: no "
                                         r"path this system can look up \(File name too long\), "
                                         "nor a hub id"):
        load(name)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", torch.float8_e5m2, "int8", "complex64",
                                   "nonsense"])
def test_a_dtype_the_model_cannot_run_in_is_refused_at_load(model, tmp_path, dtype, monkeypatch):
    path = write(tmp_path, *hf_checkpoint(model))

    def nothing_read(*args, **kwargs):
        raise AssertionError("weights read before the dtype was checked")

    monkeypatch.setattr("minispec.loading.loader.read_weights_file", nothing_read)
    refused(path, "dtype", repr(dtype), "float32, float64, float16 or bfloat16", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", torch.bfloat16, "torch.float64"])
def test_the_dtypes_a_model_runs_in_load_and_run(model, tmp_path, dtype):
    loaded, _ = load(write(tmp_path, *hf_checkpoint(model)), dtype=dtype)
    with torch.no_grad():
        assert loaded(torch.tensor([[1, 2, 3]]), torch.arange(3)[None]).isfinite().all()
