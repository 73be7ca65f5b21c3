"""Prompts as the model sees them: token ids, plain text, or chat messages.

A prompt reaches the model as a list of token ids. Three ways of writing one are accepted:

* ids -- ``[1, 9690, 198, ...]``: the ground truth, passed through after checking that every id is a
  true integer (a float id is a bug upstream; truncating it silently would hide it);
* text -- ``"Once upon a time"``: encoded by the tokenizer as it is, no special tokens added;
* chat messages -- ``[{"role": "user", "content": "Why is the sky blue?"}]``: rendered with the
  tokenizer's chat template, *with the generation prompt* (for SmolLM2's ChatML template this ends
  in ``<|im_start|>assistant\\n``), so that the model's next token starts the assistant's answer.

An instruction-tuned model ends its answer with an end-of-turn token (``<|im_end|>`` for ChatML);
[`end_of_turn_ids`][minispec.loading.prompts.end_of_turn_ids] finds it so that decoding can stop
there. The package installs this module as the drivers' ``DEFAULTS.prompts``: the core takes token
ids, and hands text and chat messages here
([`prompt_ids`][minispec.decoding.request.prompt_ids]).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["END_OF_TURN_TOKENS", "ROLES", "apply_chat_template", "check_ids", "check_messages",
           "encode_prompt", "end_of_turn_ids", "is_chat"]

#: Tokens that end an assistant turn in the common chat templates (ChatML, Llama 3, Gemma, Phi-3).
END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")

#: Roles a chat message may have.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


def encode_prompt(prompt: Any, tokenizer: Any = None) -> list[int]:
    """Turn a prompt into token ids.

    Args:
        prompt: a list or tuple of token ids, a string, or a list of chat messages
            (``{"role": ..., "content": ...}`` dicts).
        tokenizer: a ``transformers`` tokenizer; needed for strings and chat messages.

    Returns:
        The prompt's token ids as a list of Python ints.

    Raises:
        ValueError: an id that is not a true integer (float, bool), an empty prompt, a string or
            chat messages without a tokenizer, malformed messages, or a tokenizer without a chat
            template.
        TypeError: a prompt of none of the three kinds.
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer: pass tokenizer=... (from ms.load)")
        ids = list(tokenizer.encode(prompt, add_special_tokens=False))
    elif is_chat(prompt):
        ids = apply_chat_template(prompt, tokenizer)
    elif hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):
        return encode_prompt(prompt.tolist(), tokenizer)  # a 1-D tensor or array of ids
    elif isinstance(prompt, (list, tuple)):
        ids = check_ids(prompt)
    else:
        raise TypeError(f"a prompt is a list of token ids, a string or a list of chat messages, "
                        f"not {type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty: it needs at least one token")
    return ids


def is_chat(prompt: Any) -> bool:
    """True when ``prompt`` looks like chat messages: a list/tuple holding at least one mapping
    (so never an empty one; ``check_messages`` then checks every item)."""
    return isinstance(prompt, (list, tuple)) and any(isinstance(m, Mapping) for m in prompt)


def check_ids(ids: Sequence[Any]) -> list[int]:
    """Return ``ids`` as Python ints; raise ValueError on any id that is not a true integer.

    ``bool`` is refused although Python counts it as an int (``True`` as a token id is a bug), and
    so is any float, even ``3.0``: a prompt of floats came from somewhere that lost track of its
    dtype.
    """
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise ValueError(f"prompt id {i} is {token!r} ({type(token).__name__}); token ids "
                             f"must be integers")
    return [int(token) for token in ids]


def check_messages(messages: Sequence[Any]) -> None:
    """Raise ValueError unless every message is a mapping with a known role and string content."""
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"chat message {i} is {type(message).__name__}, not a dict")
        if set(message) - {"role", "content", "name", "tool_calls"} or "role" not in message:
            raise ValueError(f"chat message {i} has keys {sorted(message)}; expected 'role' and "
                             f"'content'")
        if message["role"] not in ROLES:
            raise ValueError(f"chat message {i} has role {message['role']!r}; "
                             f"expected one of {ROLES}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"chat message {i} needs a string 'content'")


def apply_chat_template(messages: Sequence[Mapping[str, str]], tokenizer: Any) -> list[int]:
    """Render chat ``messages`` with ``tokenizer``'s chat template, generation prompt added.

    Args:
        messages: ``[{"role": "user", "content": "..."}, ...]``.
        tokenizer: a ``transformers`` tokenizer that has a ``chat_template``.

    Returns:
        The token ids of the rendered conversation, ready for the assistant's answer.

    Raises:
        ValueError: no tokenizer, a tokenizer without a chat template, or malformed messages.
    """
    check_messages(messages)
    if tokenizer is None:
        raise ValueError("chat messages need a tokenizer: pass tokenizer=... (from ms.load)")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template, so chat messages cannot be "
                         "rendered; pass plain text or token ids (base models such as "
                         "shakespeare-target are not chat models)")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    # the template writes the special tokens (e.g. <|im_start|>) itself: do not add BOS again
    return list(tokenizer.encode(text, add_special_tokens=False))


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids of the tokens that end an assistant turn for ``tokenizer`` (may be empty).

    The tokenizer's own EOS token comes first when it has one, then any of ``END_OF_TURN_TOKENS``
    that its vocabulary holds. For SmolLM2 both are ``<|im_end|>``, id 2.

    Args:
        tokenizer: a ``transformers`` tokenizer, or None.

    Returns:
        Distinct token ids, in that order; ``()`` for no tokenizer.
    """
    if tokenizer is None:
        return ()
    vocab = tokenizer.get_vocab()
    ids = [getattr(tokenizer, "eos_token_id", None)]
    ids += [vocab[token] for token in END_OF_TURN_TOKENS if token in vocab]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))  # in order, no repeats
