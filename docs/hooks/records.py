"""mkdocs hook: measured figures rendered from the benchmark records, never typed by hand.

Two records, read by the package's one reader (``minispec.tools.records``), which the lessons
use too: ``cpu`` (``minispec/tools/measured/cpu.json``: runs on CPUs, each with its machine, clock,
command and the commit at which it was recorded) and ``gpu`` (``minispec/tools/measured/gpu.json``:
what ``benchmarks/gpu.py`` writes on a GPU). On any page:

* a line ``<!-- minispec-record: NAME -->`` becomes the tables of a record: ``gpu`` (the step, the
  verify cost, each method at batch 1, the engine by batch size; a note with the command while no
  GPU record is committed), or a run of the CPU record (``shipped_pair``, ``smollm2_lookup``,
  ``smollm2_tasks``, ``multitask``); ``RUN/TABLE`` (``<!-- minispec-record: lockstep/draft -->``)
  becomes one table that a run of the CPU record keeps (its columns, their number formats, its
  rows);
* an inline ``{{ cpu/runs/multitask/rows/overall/hybrid, k = 4 :.2f }}`` becomes one value of a
  record (``cpu``: the CPU record; ``card``: the shipped pair's model card,
  ``minispec/zoo/model_card.json``; ``eagle``: the shipped EAGLE head's record,
  ``minispec/zoo/smollm2-135m-instruct-eagle/eagle_config.json``, an item of a list by its
  index), formatted by the spec after `` :``. A path that names nothing fails the build. A list,
  a range measured over several runs, renders as ``low-high``.

The README's headline block is rendered by [`headline`][] from the same record, and
``tests/test_records.py`` fails when the README's copy differs (``python docs/hooks/records.py
--readme`` rewrites it).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from minispec.tools import records as _records
from minispec.tools.records import load, value

_MARKER = re.compile(r"^<!-- minispec-record: (\w+(?:/\w+)?) -->[ \t]*$", re.MULTILINE)
_VALUE = re.compile(r"\{\{ (cpu|card|eagle)/([^{}]+?)(?: :([^{}]*?))? \}\}")
HEADLINE = re.compile(r"<!-- headline -->\n.*?<!-- /headline -->", re.DOTALL)
ROOT = Path(__file__).resolve().parents[2]
#: how a page names a record's file
CPU_FILE, GPU_FILE = "minispec/tools/measured/cpu.json", "minispec/tools/measured/gpu.json"


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render_gpu(record: dict) -> str:
    """Markdown for a GPU record (the fields ``benchmarks/gpu.py`` writes)."""
    m = record["machine"]
    parts = [f"*Record:* `{GPU_FILE}`, measured on {m['device']} (torch {m['torch']}, "
             f"CUDA {m.get('cuda', '-')}) at commit `{record['commit'][:10]}` by "
             f"`{record['command']}`; "
             f"every output identical to plain greedy: **{record['identical_tokens']}**."]
    if "step_ms" in record:
        parts.append(f"**One-token step** (300 cached tokens; memory roofline "
                     f"{_num(record['roofline_ms'], 3)} ms):")
        parts.append(_table(["B", "graphs on (ms)", "graphs off (ms)"],
                            [[b, _num(ms, 3), _num(record.get("step_ms_eager", {}).get(b), 3)]
                             for b, ms in record["step_ms"].items()]))
        parts.append("**Verify cost** \\(r(k) = t(k + 1) / t(1)\\), batch 1:")
        parts.append(_table(["k", "graphs on", "graphs off"],
                            [[k, _num(r), _num(record.get("r_eager", {}).get(k))]
                             for k, r in record["r"].items()]))
    if "speedup_b1" in record:
        parts.append("**Batch 1, multi-task set**, speed over plain greedy:")
        parts.append(_table(["method", "graphs on", "graphs off"],
                            [[name, f"{_num(x)}x",
                              f"{_num(record.get('speedup_b1_eager', {}).get(name))}x"]
                             for name, x in record["speedup_b1"].items()]))
    if "engine" in record:
        parts.append("**The engine** (tokens/s; transformers' `generate` with its static cache):")
        parts.append(_table(["B", "plain, graphs", "plain, eager", "transformers",
                             "default / plain"],
                            [[b, _num(r["plain_tok_s"], 0), _num(r.get("plain_tok_s_eager"), 0),
                              _num(r["hf_tok_s"], 0), f"{_num(r['default_over_plain'])}x"]
                             for b, r in record["engine"].items()]))
    if "bf16" in record:
        b = record["bf16"]
        parts.append(f"**bfloat16:** {_num(100 * b['identical_fraction'], 1)} % of speculative "
                     f"tokens equal plain greedy's ({b['identical_outputs']} of {b['outputs']} "
                     f"outputs identical).")
    return "\n\n".join(parts)


def _origin(run: dict) -> str:
    m = run["machine"]
    return (f"*Record:* `{CPU_FILE}`: {m['device']}, {m['threads']} torch threads, "
            f"{m['clock']} clock ({m['load']}), commit `{run['commit'][:7]}`, `{run['command']}`.")


def render_shipped_pair(run: dict) -> str:
    """The cost model against the measured speedups of the shipped pair, one row per ``k``."""
    rows = [[k, _num(r["r"]), f"{_num(r['measured'])}x",
             f"{_num(r['predicted_r'])}x ({r['measured'] / r['predicted_r']:.0%})",
             f"{_num(r['predicted_r1'])}x", _num(r["tokens_eq1"]), _num(r["counted"])]
            for k, r in run["rows"].items()]
    header = ["k", "r(k)", "measured", "predicted, \\(r(k)\\)", "predicted, \\(r = 1\\)",
              "tokens / round, Eq. (1)", "counted"]
    return _origin(run) + "\n\n" + _table(header, rows)


def _speedup_table(run: dict, first: str, columns: list[tuple[str, str]]) -> str:
    rows = [[name, f"{row['greedy_tok_s']} tok/s"]
            + [_num(row[key]) + ("" if "tokens" in key else "x") for key, _ in columns]
            for name, row in run["rows"].items()]
    return _table([first, "greedy"] + [title for _, title in columns], rows)


def render_smollm2_lookup(run: dict) -> str:
    """Prompt lookup on SmolLM2's five tasks, beside transformers."""
    columns = [("prompt lookup, k = 4", "prompt lookup k = 4"),
               ("tokens_per_forward", "(tokens / forward)"),
               ("transformers greedy", "transformers greedy"),
               ("transformers prompt lookup, k = 4", "transformers prompt lookup")]
    return _origin(run) + "\n\n" + _speedup_table(run, "task", columns)


def render_smollm2_tasks(run: dict) -> str:
    """The shipped head, prompt lookup and the hybrid on SmolLM2's five tasks."""
    columns = [("EAGLE head, k = 2", "EAGLE k = 2"),
               ("eagle_tokens_per_forward", "(tokens / forward)"),
               ("prompt lookup, k = 4", "prompt lookup k = 4"), ("hybrid, k = 4", "hybrid k = 4")]
    return _origin(run) + "\n\n" + _speedup_table(run, "task", columns)


def render_multitask(run: dict) -> str:
    """Every drafter on the public multi-task set, by category."""
    columns = [("prompt lookup, k = 4", "prompt lookup"), ("EAGLE head, k = 2", "EAGLE (k = 2)"),
               ("suffix, k = 4", "suffix"), ("hybrid, k = 4", "hybrid"),
               ("hybrid_tokens_per_forward", "(tokens / forward)"),
               ("transformers prompt lookup, k = 4", "HF lookup")]
    return _origin(run) + "\n\n" + _speedup_table(run, "category", columns)


def headline(record: dict) -> str:
    """The README's headline block: the multi-task run's overall speedups and their range."""
    run = record["runs"]["multitask"]
    m, rows = run["machine"], run["rows"]
    cats = [c for c in rows if c != "overall"]
    intro = (f"All from one run of one command on one machine: a {m['device']} with "
             f"{m['load']}, {m['threads']} torch threads, {m['clock']} clock, minispec's packed "
             f"CPU path (`fast=True`; transformers eager), recorded in `{CPU_FILE}`. "
             f"SmolLM2-135M-Instruct answers a public {run['prompts']}-prompt set "
             f"({run['categories']} categories), greedy, batch 1, {run['new_tokens']} new tokens "
             f"per prompt; each cell is the speedup over minispec's own greedy decoding "
             f"({rows['overall']['greedy_tok_s']} tokens/s overall), and all "
             f"{run['identical_runs']} method x category runs were token-identical to it:")
    lines = [textwrap.fill(intro, 100), "", "```bash", run["command"], "```", "",
             "| method | overall | lowest and highest category |", "| --- | ---: | --- |"]
    for method in run["methods"]:
        by = {c: rows[c][method] for c in cats}
        lo, hi = min(by, key=by.get), max(by, key=by.get)
        lines.append(f"| {method} | {rows['overall'][method]:.2f}x | {by[lo]:.2f}x ({lo}) to "
                     f"{by[hi]:.2f}x ({hi}) |")
    greedy = run["transformers_greedy_overall"]
    lines.append(f"| transformers' greedy `generate` | {greedy:.2f}x | |")
    return "\n".join(lines)


RUNS = {"shipped_pair": render_shipped_pair, "smollm2_lookup": render_smollm2_lookup,
        "smollm2_tasks": render_smollm2_tasks,
        "multitask": render_multitask}


def render_table(table: dict) -> str:
    """One table of a run: its columns (title, alignment, the format of its numbers) and rows."""
    cols = table["columns"]
    lines = ["| " + " | ".join(c["title"] for c in cols) + " |",
             "| " + " | ".join(c["align"] for c in cols) + " |"]
    for name, row in table["rows"].items():
        cells = [row.get("name", name)]
        for c in cols[1:]:
            v = row[c["key"]]
            cells.append(v if isinstance(v, str) else c["format"].format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_grammar(record: dict) -> str:
    """The grammar benchmark (``minispec.grammar.bench``): tokens per target forward, the paired
    speed ratio over constrained greedy with its spread, the grammar's share of the time."""
    rows = [[name, _num(m["tokens_per_forward"]),
             f"{m['ratio']:.2f}x [{m['ratios'][0]:.2f}-{m['ratios'][-1]:.2f}]",
             f"{100 * m['grammar_share']:.1f} %", "yes" if m["identical"] and m["valid"] else "NO"]
            for name, m in record["methods"].items()]
    machine = record["machine"]
    return (f"*Machine:* {machine.get('cpu', machine)}, {machine.get('threads', '?')} thread(s), "
            f"{record['clock']}, {record['repeats']} interleaved repeats, {record['date']}. "
            f"*Command:* `{record['command']}`\n\n"
            + _table(["method", "tokens per target forward", "speed over constrained greedy "
                      "[spread]", "grammar's share", "identical and valid"], rows))


def _render(name: str) -> str:
    if name == "grammar":
        return render_grammar(load("grammar"))
    if "/" in name:
        run, table = name.split("/")
        return render_table(load("cpu")["runs"][run]["tables"][table])
    if name in RUNS:
        return RUNS[name](load("cpu")["runs"][name])
    if not _records.path(name).is_file():
        return (f"*No `{GPU_FILE}` is committed yet: `bash benchmarks/gpu_session.sh` on a machine "
                f"with a CUDA GPU writes it.*")
    return render_gpu(load(name))


def render_values(markdown: str) -> str:
    """Every inline ``{{ source/path :spec }}`` replaced by its value."""
    return _VALUE.sub(lambda m: value(m.group(1), m.group(2), m.group(3)), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return render_values(_MARKER.sub(lambda m: _render(m.group(1)), markdown))


def _rewrite_readme() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    block = f"<!-- headline -->\n{headline(load('cpu'))}\n<!-- /headline -->"
    readme.write_text(HEADLINE.sub(lambda _: block, text), encoding="utf-8")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--readme"]:
        sys.exit("usage: python docs/hooks/records.py --readme  (rewrites the README's headline)")
    _rewrite_readme()
