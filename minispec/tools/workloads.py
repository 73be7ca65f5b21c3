"""Real workloads for a chat model: a small prompt set by task, written for minispec.

Speculative decoding pays when the drafts are right, and a drafter that copies from the context
(n-gram tables, prompt lookup) is right when the answer repeats its input. The tasks span that
range, one chat prompt each:

* ``chat`` -- open-ended: the answer is new text, nothing to copy;
* ``summarize`` -- a given passage to summarize: phrases are reused;
* ``document_qa`` -- questions about a given document: names, numbers and sentences are quoted;
* ``code_complete`` -- finish a given function: identifiers come from the context;
* ``code_edit`` -- rewrite a given function: most of the answer is the input again.

Every passage, document and snippet here is original to minispec. ``TASKS`` maps a task to its
chat messages; ``encode_tasks`` renders them with a tokenizer's chat template.

A second, public prompt set, ``multitask`` ([`multitask`][minispec.tools.workloads.multitask]):
35 prompts in seven categories -- open chat in MT-bench's categories, code, translation,
summarization, question answering, math reasoning and retrieval-augmented answers, five each --
taken from Spec-Bench's question set (``minispec/tools/prompts/README.md`` gives the sources and
their licences). ``run`` times
minispec's greedy, n-gram and prompt-lookup decoding against transformers' greedy and prompt-lookup
``generate`` on every task and checks that all of them produce the same tokens
(``minispec bench --model smollm2-135m-instruct`` prints the table).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from minispec.core.sampling import SamplingParams
from minispec.decoding.loop import generate, speculative_generate
from minispec.drafters.ngram import NGramDrafter, PromptLookupDrafter
from minispec.loading.prompts import encode_prompt
from minispec.models.llama import Llama
from minispec.tools.bench import (
    Method,
    MethodResult,
    format_table,
    hf_greedy,
    overall,
    time_methods,
)

PASSAGE = """\
The town of Millbrook built its first public library in 1889 with money raised at a summer fair.
For forty years the library had a single room, a coal stove and about two thousand books, most of
them donated by local families. In 1931 a flood destroyed the ground floor and nearly half of the
collection. Volunteers dried the surviving books on clotheslines across the main street, and the
story of the "washing-line library" became part of the town's identity. A new brick building
opened in 1934 on higher ground, with a reading room for children and a small museum of farm
tools. Today the library lends e-books and laptops, but the clothesline photographs still hang in
the entrance hall, and every June the town holds a book fair on the main street to remember the
flood."""

DOCUMENT = """\
Harbor Bikes -- rental terms

1. Rentals start at the Pier Street shop, which opens at 8:00 and closes at 19:00.
2. A standard bike costs 6 euros per hour or 25 euros per day. An electric bike costs 10 euros per
   hour or 40 euros per day.
3. Every rental needs a deposit of 50 euros, returned when the bike comes back undamaged.
4. Helmets and locks are included at no extra cost. Child seats cost 3 euros per day.
5. A bike returned more than 30 minutes late is charged one extra hour.
6. Lost keys cost 15 euros. A lost lock costs 30 euros.
7. Bikes may not be taken on the ferry to Gull Island without written permission from the shop."""

CODE_TO_COMPLETE = '''\
def word_counts(text: str) -> dict[str, int]:
    """Count how often each word occurs in text, ignoring case and punctuation."""
    counts: dict[str, int] = {}
    for raw in text.split():
        word = raw.strip(".,;:!?\\"'()").lower()
'''

CODE_TO_EDIT = '''\
def average_temperature(readings):
    total = 0
    count = 0
    for reading in readings:
        if reading is not None:
            total = total + reading
            count = count + 1
    return total / count
'''

#: task -> chat messages (one user turn; the tokenizer's template adds its default system turn).
TASKS: dict[str, list[dict[str, str]]] = {
    "chat": [{"role": "user", "content":
              "What are some good habits for staying focused while studying at home?"}],
    "summarize": [{"role": "user", "content":
                   f"Summarize the following passage in a few sentences.\n\n{PASSAGE}"}],
    "document_qa": [{"role": "user", "content":
                     f"{DOCUMENT}\n\nUsing only the rental terms above, answer: how much does an "
                     f"electric bike cost for a day, what deposit is needed, and what happens if I "
                     f"return it 45 minutes late?"}],
    "code_complete": [{"role": "user", "content":
                       f"Complete this Python function. Reply with the whole function.\n\n"
                       f"```python\n{CODE_TO_COMPLETE}```"}],
    "code_edit": [{"role": "user", "content":
                   f"Rewrite this Python function so that it returns None when there are no valid "
                   f"readings, and add type hints. Reply with the whole function.\n\n"
                   f"```python\n{CODE_TO_EDIT}```"}],
}

#: Tasks whose answer draws on text given in the prompt (context drafting should pay there).
GROUNDED: tuple[str, ...] = ("summarize", "document_qa", "code_complete", "code_edit")
#: Tasks whose answer is new text.
OPEN_ENDED: tuple[str, ...] = ("chat",)


#: The public multi-task prompt set (one JSON object per line: id, category, source, prompt).
MULTITASK = Path(__file__).parent / "prompts" / "multitask.jsonl"


def multitask() -> dict[str, list[list[dict[str, str]]]]:
    """The multi-task set as ``{category: [chat messages, ...]}`` (one user turn per prompt)."""
    sets: dict[str, list[list[dict[str, str]]]] = {}
    for line in MULTITASK.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        sets.setdefault(row["category"], []).append([{"role": "user", "content": row["prompt"]}])
    return sets


def prompt_sets(tokenizer: Any, name: str = "tasks", tasks: Sequence[str] | None = None,
                per_task: int | None = None) -> dict[str, list[list[int]]]:
    """``{task or category: [prompt ids, ...]}`` of the prompt set ``name`` (``"tasks"``: this
    module's five tasks, one prompt each; ``"multitask"``: the public set), chat-rendered with
    ``tokenizer``; ``tasks`` picks some of them (``ValueError`` for an unknown one), ``per_task``
    keeps the first that many prompts of each (default: all)."""
    if name not in ("tasks", "multitask"):
        raise ValueError(f"unknown prompt set {name!r}; the sets are 'tasks' and 'multitask'")
    sets = {t: [m] for t, m in TASKS.items()} if name == "tasks" else multitask()
    unknown = [t for t in tasks or () if t not in sets]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; the {name} set has {list(sets)}")
    if per_task is not None and per_task < 1:
        raise ValueError(f"per_task must be at least 1, got {per_task}")
    return {t: [encode_prompt(m, tokenizer) for m in sets[t][:per_task]] for t in (tasks or sets)}


def encode_tasks(tokenizer: Any, tasks: tuple[str, ...] | None = None) -> dict[str, list[int]]:
    """Render each task's messages with ``tokenizer``'s chat template (generation prompt added).

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        tasks: which tasks (default: all of ``TASKS``, in order).

    Returns:
        ``{task: prompt ids}``.

    Raises:
        ValueError: an unknown task, or a tokenizer without a chat template.
    """
    names = tuple(TASKS) if tasks is None else tasks
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; the tasks are {list(TASKS)}")
    return {name: encode_prompt(TASKS[name], tokenizer) for name in names}


def run(target: Llama, tokenizer: Any, target_dir: str | Path | None, *,
        tasks: Sequence[str] | None = None, max_new_tokens: int = 96, k: int = 4,
        repeats: int = 1, warmup: int = 0,
        drafters: dict[str, tuple] | None = None,
        log: Callable[[str], None] | None = print, prompt_set: str = "tasks",
        temperature: float = 0.0, clock: Callable[[], float] = time.perf_counter,
        per_task: int | None = None) -> list[MethodResult]:
    """Time greedy decoding of every task five ways and check that all give the same tokens.

    minispec ``generate``, n-gram and prompt-lookup speculation (``k`` drafts per round), and, when
    ``target_dir`` is given, transformers' greedy ``generate`` and its prompt lookup
    (``prompt_lookup_num_tokens=k``) on the same checkpoint. The reference tokens come from one
    untimed minispec greedy pass, which also warms minispec up; transformers gets one short
    untimed call for the same reason.

    Args:
        target: the minispec model.
        tokenizer: its tokenizer (with a chat template).
        target_dir: the checkpoint directory for transformers (``None``: minispec only).
        tasks: which tasks of ``TASKS`` (default all).
        max_new_tokens: per prompt.
        k: draft length of both context drafters (both libraries).
        repeats: timed repeats of the whole table.
        warmup: discarded repeats of the whole table before them.
        drafters: more minispec drafters, ``{name: (factory, k)}`` or ``(factory, k,
            branching)`` (e.g. an EAGLE head: ``{"eagle": (lambda: drafter, 2)}``; a branching or
            a ``DynamicTree`` drafts trees); each shows as ``minispec <name> k=<k>``.
            ``k="auto"``: the round's ``k`` is chosen by the goodput policy, up to ``k``
            (``speculative_generate(..., adaptive=True)``).
        log: progress lines (``None``: silent).
        prompt_set: ``"tasks"`` (this module's) or ``"multitask"`` (the public set).
        temperature: ``0``: greedy, every output checked against minispec greedy; above 0:
            minispec's methods sample (each prompt its own seed, the same for every method) and
            nothing is compared token by token (``token_equal`` is ``None``), transformers is
            not run.
        clock: what the times are read from (``time.process_time``: this process's CPU time).
        per_task: the most prompts timed per task or category (default: all).

    Returns:
        One [`minispec.tools.bench.MethodResult`][minispec.tools.bench.MethodResult] per
        (task, method); ``prompt_set`` is the task.
    """
    say = log or (lambda _line: None)
    sets = prompt_sets(tokenizer, prompt_set, tasks, per_task)
    reference = None
    if temperature == 0:
        say(f"reference: minispec greedy on {len(sets)} tasks ...")
        reference = {task: [generate(target, ids, max_new_tokens).tokens for ids in prompts]
                     for task, prompts in sets.items()}
    call = None
    if target_dir is not None and temperature == 0:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32,
                                                  trust_remote_code=False).eval()
        call = hf_greedy(hf, max_new_tokens)
        hf_greedy(hf, 4)(next(iter(sets.values()))[0])  # warm-up
    # a task's methods run back to back, so a change in the machine's load hits them alike
    methods = [m for task in sets
               for m in _minispec_methods(target, task, max_new_tokens, k, drafters, temperature)
               + (_hf_methods(call, task, k) if call is not None else [])]
    return time_methods(methods, sets, reference, repeats=repeats, warmup=warmup, log=log,
                        clock=clock)


def _minispec_methods(target: Llama, task: str, max_new_tokens: int, k: int,
                      drafters: dict[str, tuple] | None = None,
                      temperature: float = 0.0) -> list[Method]:
    def sampling(ids) -> SamplingParams | None:       # a seed per prompt, the same per method
        return None if temperature == 0 else SamplingParams(temperature=temperature,
                                                             seed=sum(ids) % 2**31)

    def plain(ids):
        out = generate(target, ids, max_new_tokens, sampling(ids))
        return out.tokens, out.stats

    def drafted(make, k_drafts=k, branching=None):    # "auto": goodput k, up to the bench's k
        auto = k_drafts == "auto"

        def run_one(ids):
            out = speculative_generate(target, make(), ids, max_new_tokens,
                                       k=k if auto else k_drafts, sampling=sampling(ids),
                                       adaptive=auto, branching=branching)
            return out.tokens, out.stats
        return run_one

    return [Method("minispec generate", "minispec", task, plain),
            Method(f"minispec n-gram k={k}", "minispec", task, drafted(NGramDrafter), k),
            Method(f"minispec prompt lookup k={k}", "minispec", task,
                   drafted(PromptLookupDrafter), k)] + [
            Method(f"minispec {name} k={spec[1]}", "minispec", task, drafted(*spec), spec[1])
            for name, spec in (drafters or {}).items()]


def _hf_methods(call: Callable, task: str, k: int) -> list[Method]:
    return [Method("transformers generate", "transformers", task, lambda ids: call(ids)),
            Method(f"transformers prompt lookup k={k}", "transformers", task,
                   lambda ids: call(ids, prompt_lookup_num_tokens=k), k)]


def format_results(results: Sequence[MethodResult]) -> str:
    """The table by task, the overall rows when there are several tasks, then one line: are all
    outputs identical to minispec greedy?"""
    rows = list(results)
    if len({r.prompt_set for r in results}) > 1:
        rows += overall(results)
    if any(r.token_equal is None for r in results):
        return f"{format_table(rows)}\n\nsampled: outputs are not compared token by token"
    same = sum(bool(r.token_equal) for r in results)
    verdict = ("all outputs identical to minispec greedy" if same == len(results) else
               f"!!! {len(results) - same} of {len(results)} methods differ from minispec greedy")
    return f"{format_table(rows)}\n\n{verdict} ({same}/{len(results)} method x task runs)"


__all__ = ["GROUNDED", "MULTITASK", "OPEN_ENDED", "TASKS", "encode_tasks", "format_results",
           "multitask", "prompt_sets", "run"]
