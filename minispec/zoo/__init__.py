"""The shipped tiny model pair and the recipe that trains it.

Two small Llama models come with minispec so that every lesson and test runs offline:

* ``shakespeare-target`` -- the target model ``p``;
* ``shakespeare-draft``  -- the draft model ``q``, distilled from the target.

Both are plain Hugging Face checkpoints (config.json, model.safetensors, tokenizer.json, ...) and
share one byte-level BPE tokenizer. ``path(name)`` returns the directory of a shipped model::

    from transformers import AutoModelForCausalLM
    from minispec import zoo
    target = AutoModelForCausalLM.from_pretrained(zoo.path("shakespeare-target"))

The recipe that made them lives next to this file: ``data.py`` (corpus and tokenizer), ``train.py``
(training loops and the command line) and ``evaluate.py`` (quality bars and the model card).
Importing this package is cheap: it does not import torch or transformers.
"""

from __future__ import annotations

from pathlib import Path

#: The names of the shipped models, in the order target, draft.
NAMES: tuple[str, ...] = ("shakespeare-target", "shakespeare-draft")

#: The files a shipped model directory must hold for ``from_pretrained`` to work.
REQUIRED_FILES: tuple[str, ...] = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)

_ZOO_DIR = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """Return the directory that holds the shipped model called ``name``.

    Raises ``ValueError`` for a name that is not shipped, and ``FileNotFoundError`` when the
    directory exists in the name table but its files are missing (for example in a source checkout
    where the weights were never built).
    """
    if name not in NAMES:
        raise ValueError(f"unknown shipped model {name!r}; available: {', '.join(NAMES)}")
    model_dir = _ZOO_DIR / name
    missing = [f for f in REQUIRED_FILES if not (model_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"shipped model {name!r} is incomplete: {', '.join(missing)} missing in {model_dir}. "
            "Rebuild it with `python -m minispec.zoo.train --out runs/zoo` and then "
            "`python -m minispec.zoo.evaluate --run runs/zoo --ship`."
        )
    return model_dir


__all__ = ["NAMES", "REQUIRED_FILES", "path"]
