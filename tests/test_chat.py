"""Prompts as ids, text and chat messages (minispec.loading.prompts), on the shipped tokenizer.

The shipped Shakespeare tokenizer is a base model's: it has no chat template. A copy given a ChatML
template (the one SmolLM2 uses) checks rendering without the real model.
"""

from __future__ import annotations

import copy

import pytest
import torch

from minispec import zoo
from minispec.loading import prompts

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(zoo.path("shakespeare-target")))


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CHATML
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def test_ids_pass_through_as_python_ints():
    ids = prompts.encode_prompt([5, torch.tensor(7).item(), 9])
    assert ids == [5, 7, 9] and all(type(i) is int for i in ids)
    assert prompts.encode_prompt((1, 2)) == [1, 2]
    assert prompts.encode_prompt(torch.tensor([3, 4])) == [3, 4]


@pytest.mark.parametrize("bad", [[1, 2.0, 3], [1.5], [True, 2], [1, "2"], [1, None]])
def test_non_integer_ids_are_rejected_not_truncated(bad):
    with pytest.raises(ValueError, match="must be integers"):
        prompts.encode_prompt(bad)


def test_float_tensor_ids_are_rejected():
    with pytest.raises(ValueError, match="must be integers"):
        prompts.encode_prompt(torch.tensor([1.0, 2.0]))


def test_empty_and_unknown_prompts():
    with pytest.raises(ValueError, match="empty"):
        prompts.encode_prompt([])
    with pytest.raises(TypeError, match="chat messages"):
        prompts.encode_prompt(42)


def test_text_needs_a_tokenizer_and_adds_no_special_tokens(tokenizer):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        prompts.encode_prompt("To be, or not to be")
    ids = prompts.encode_prompt("To be, or not to be", tokenizer)
    assert ids == tokenizer.encode("To be, or not to be", add_special_tokens=False)
    assert tokenizer.decode(ids) == "To be, or not to be"


def test_chat_without_template_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="no chat template"):
        prompts.encode_prompt([{"role": "user", "content": "hi"}], tokenizer)


def test_chat_without_tokenizer_is_a_clear_error():
    with pytest.raises(ValueError, match="need a tokenizer"):
        prompts.encode_prompt([{"role": "user", "content": "hi"}])


def test_chat_renders_template_with_generation_prompt(chat_tokenizer):
    messages = [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Who is the king?"},
    ]
    ids = prompts.encode_prompt(messages, chat_tokenizer)
    text = chat_tokenizer.decode(ids)
    assert text == (
        "<|im_start|>system\nYou are brief.<|im_end|>\n"
        "<|im_start|>user\nWho is the king?<|im_end|>\n<|im_start|>assistant\n"
    )
    # the special tokens are single ids, not spelled out in pieces
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == 2
    assert prompts.encode_prompt(tuple(messages), chat_tokenizer) == ids


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "user"}], "string 'content'"),
        ([{"role": "king", "content": "hi"}], "role 'king'"),
        ([{"content": "hi"}], "expected 'role'"),
        ([{"role": "user", "content": "hi", "mood": "x"}], "expected 'role'"),
        ([{"role": "user", "content": "hi"}, "and then"], "message 1 is str"),
        ([{"role": "user", "content": "hi"}, 3], "message 1 is int"),
        ([{"role": "user", "content": 3}], "string 'content'"),
    ],
)
def test_malformed_messages(chat_tokenizer, messages, match):
    with pytest.raises(ValueError, match=match):
        prompts.encode_prompt(messages, chat_tokenizer)


def test_end_of_turn_ids(tokenizer, chat_tokenizer):
    assert prompts.end_of_turn_ids(None) == ()
    assert prompts.end_of_turn_ids(tokenizer) == (tokenizer.eos_token_id,)
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert prompts.end_of_turn_ids(chat_tokenizer) == (tokenizer.eos_token_id, im_end)
