"""A request's stop strings and tokenizer are checked where the request is built (issue "Every
failure stays with its request", item 7): ``stop=5`` and a tokenizer without ``decode`` are one
error naming the argument, its value and what is allowed, before any forward, never a
``TypeError: 'int' object is not iterable`` or an ``AttributeError`` from deep in decoding.

Both drivers build requests through ``Sequence.new``, where these checks live.
"""

from __future__ import annotations

import pytest
from tinymodels import tiny_llama

import minispec as ms

pytestmark = pytest.mark.usefixtures("one_thread")


class Tokenizer:
    """The least a stop string needs: ``decode``."""

    def decode(self, ids, **kwargs):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _refused(model, run, *words):
    """``run()`` raises one ValueError or TypeError saying each of ``words``, before a forward."""
    forwards = []
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises((ValueError, TypeError)) as info:
            run()
    finally:
        hook.remove()
    message = str(info.value)
    assert all(word in message for word in words), message
    assert not forwards, "refused after a forward"


@pytest.mark.parametrize("stop", [5, 2.5, [5], b"x"], ids=["int", "float", "list-of-int",
                                                         "bytes"])
def test_a_stop_that_is_not_strings_is_named(model, stop):
    _refused(model, lambda: ms.generate(model, [1, 2, 3], 4, tokenizer=Tokenizer(), stop=stop),
             "stop", repr(stop if not isinstance(stop, list) else stop[0]), "string")
    engine = ms.Engine(model, tokenizer=Tokenizer())
    _refused(model, lambda: engine.generate([[1, 2, 3]], max_new_tokens=4, progress=False,
                                            stop=stop), "stop", "string")
    assert not engine.has_unfinished()


@pytest.mark.parametrize("tokenizer", [object(), "gpt2", 3], ids=["object", "str", "int"])
def test_a_tokenizer_without_decode_is_named(model, tokenizer):
    _refused(model, lambda: ms.generate(model, [1, 2, 3], 4, tokenizer=tokenizer, stop="x"),
             "tokenizer", "decode")
    _refused(model, lambda: ms.Engine(model, tokenizer=tokenizer).generate(
        [[1, 2, 3]], max_new_tokens=4, progress=False, stop="x"), "tokenizer", "decode")


def test_good_stops_still_run(model):
    out = ms.generate(model, [1, 2, 3], 4, tokenizer=Tokenizer(), stop="x")
    assert out.finish_reason == "length"
    outs = ms.Engine(model, tokenizer=Tokenizer()).generate([[1, 2, 3]], max_new_tokens=4,
                                                            progress=False, stop=["x", "y"])
    assert outs[0].finish_reason == "length"


def test_a_draft_model_is_checked_where_it_enters(model):
    """``ModelDrafter(None)`` and a ``max_seq_len`` that is no positive integer are refused by the
    constructor, naming the argument, not later by a forward or a prompt check."""
    with pytest.raises(TypeError, match="ModelDrafter needs a draft Llama"):
        ms.ModelDrafter(None)
    for bad in (-5, 0, 2.5):
        with pytest.raises(ValueError, match="max_seq_len must be a positive integer"):
            ms.ModelDrafter(model, max_seq_len=bad)
