"""Speculation under a grammar, measured: ``python -m minispec.grammar.bench``.

Every task of ``minispec/tools/prompts/json_tasks.jsonl`` (a passage, an instruction, a JSON
schema) is decoded at batch 1 under its schema, greedily, four ways:

* ``constrained greedy`` -- one target forward a token, the mask applied to ``p`` (the baseline);
* ``prompt lookup`` -- drafts copied from the prompt, cut at the first token the mask forbids;
* ``forced tokens`` -- only the spans the grammar forces (keys, quotes, braces) as drafts;
* ``forced + prompt lookup`` -- forced spans where there are some, prompt lookup elsewhere.

The methods run interleaved, task by task (the order reversed every task), each run timed in this
process's CPU time, and the whole pass is repeated: each repeat gives one *paired* ratio per method
(its tokens per CPU second over constrained greedy's in the same pass), and the spread of those
ratios over the repeats is the measurement's noise (as in
[`minispec.tools.lockstep`][minispec.tools.lockstep]). Every output must equal constrained greedy's
token for token and meet its schema. The grammar's own cost (masks, forced tokens, commits; the
constraint's ``seconds``) is reported as a share of constrained greedy's time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import minispec as ms
from minispec.core import constraint as hook
from minispec.grammar.constraint import constraint_for
from minispec.grammar.drafter import ForcedDrafter

__all__ = ["METHODS", "load_tasks", "main", "run"]

TASKS = Path(__file__).parent.parent / "tools" / "prompts" / "json_tasks.jsonl"
#: method -> (drafter factory or None, forced tokens on)
METHODS = {"constrained greedy": (None, False),
           "prompt lookup": (ms.PromptLookupDrafter, False),
           "forced tokens": (ForcedDrafter, True),
           "forced + prompt lookup": (ms.PromptLookupDrafter, True)}


def load_tasks(path: Path = TASKS) -> list[dict]:
    """The tasks, one dict a line: ``id``, ``category``, ``passage``, ``instruction``,
    ``schema``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def grammars(force: bool, made: list):
    """Requests get the wing's constraint with forced tokens on or off; each is kept in ``made``."""
    def factory(*args):
        made.append(constraint_for(*args, force=force))
        return made[-1]

    hook.FACTORIES.insert(0, factory)
    try:
        yield
    finally:
        hook.FACTORIES.remove(factory)


def decode(target, tokenizer, task: dict, method: str, k: int, new: int) -> dict:
    """One task, one method: its tokens, target forwards, CPU seconds and grammar seconds."""
    make, force = METHODS[method]
    messages = [{"role": "user", "content": f"{task['instruction']}\n\n{task['passage']}"}]
    sampling = ms.SamplingParams(temperature=0, json_schema=task["schema"])
    made: list = []
    with grammars(force, made):
        start = time.process_time()
        out = ms.speculative_generate(target, None if make is None else make(), messages, new,
                                      k=k if make is not None else 4, sampling=sampling,
                                      tokenizer=tokenizer)
        seconds = time.process_time() - start
    return dict(tokens=out.tokens, text=out.text, forwards=out.stats.target_forwards,
                seconds=seconds, grammar=sum(c.seconds for c in made), finish=out.finish_reason)


def run(target, tokenizer, tasks: list[dict], k: int, new: int, repeats: int) -> dict:
    """Every method on every task, interleaved, ``repeats`` times; the record's ``methods``."""
    names, passes = list(METHODS), []
    for _ in range(repeats):
        runs = {name: [] for name in names}
        for i, task in enumerate(tasks):
            for name in names if i % 2 == 0 else names[::-1]:
                runs[name].append(decode(target, tokenizer, task, name, k, new))
        passes.append(runs)
    return summarize(passes, tasks)


def summarize(passes: list[dict], tasks: list[dict]) -> dict:
    """Per method: tokens per target forward, paired speed ratios (sorted), identity, validity."""
    base, methods = next(iter(passes[0])), {}
    speed = lambda runs: sum(len(r["tokens"]) for r in runs) / sum(r["seconds"] for r in runs)
    for name in passes[0]:
        runs = passes[0][name]
        ratios = sorted(speed(p[name]) / speed(p[base]) for p in passes)
        methods[name] = dict(
            tokens_per_forward=round(sum(len(r["tokens"]) for r in runs)
                                     / sum(r["forwards"] for r in runs), 3),
            ratio=round(statistics.median(ratios), 3), ratios=[round(x, 3) for x in ratios],
            tokens_per_cpu_s=round(statistics.median(speed(p[name]) for p in passes), 2),
            grammar_share=round(sum(r["grammar"] for p in passes for r in p[name])
                                / sum(r["seconds"] for p in passes for r in p[name]), 4),
            identical=all(p[name][i]["tokens"] == p[base][i]["tokens"] for p in passes
                          for i in range(len(tasks))),
            valid=all(_valid(r["text"], t["schema"]) for r, t in zip(runs, tasks, strict=True)))
    return methods


def _valid(text: str, schema: dict) -> bool:
    """The output parses as JSON and has exactly the schema's required keys (the grammar checks
    the rest: every output was masked by it)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == set(schema.get("required", value))


def record(methods: dict, args: argparse.Namespace, tasks: list[dict]) -> dict:
    """The JSON record: machine, clock, command, date, settings and the per-method figures."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    return dict(machine=dict(cpu=cpu, threads=args.threads, torch=torch.__version__,
                             python=platform.python_version()),
                clock="process CPU time (time.process_time), each run timed alone",
                command="python -m minispec.grammar.bench " + " ".join(sys.argv[1:]),
                date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                model=args.model, k=args.k, max_new_tokens=args.max_new_tokens,
                repeats=args.repeats, tasks=len(tasks), methods=methods)


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m minispec.grammar.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("-k", type=int, default=8, help="drafts per round (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="default 64 (the longest task's JSON fits)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--tasks", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--out", default="minispec/tools/measured/grammar.json",
                        help="the record's path")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = ms.load(args.model, fast=True)
    tasks = load_tasks()[: args.tasks]
    methods = run(target, tokenizer, tasks, args.k, args.max_new_tokens, args.repeats)
    for name, m in methods.items():
        print(f"{name:24s} {m['tokens_per_forward']:5.2f} tok/fwd  {m['ratio']:.2f}x "
              f"[{m['ratios'][0]:.2f}-{m['ratios'][-1]:.2f}]  "
              f"grammar {100 * m['grammar_share']:.1f}%  identical={m['identical']} "
              f"valid={m['valid']}")
    Path(args.out).write_text(json.dumps(record(methods, args, tasks), indent=1) + "\n")
    return 0 if all(m["identical"] and m["valid"] for m in methods.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
