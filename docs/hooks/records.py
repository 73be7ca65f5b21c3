"""mkdocs hook: tables rendered from the benchmark records in ``docs/data/``, never typed by hand.

A line ``<!-- minispec-record: gpu -->`` is replaced by the tables of ``docs/data/gpu.json`` (the
record ``benchmarks/gpu.py`` writes on a GPU: the machine, the commit and the command with it):
the one-token step and the verify cost ``r(k)`` with CUDA graphs and without, each method's speed
at batch 1, and the engine against transformers by batch size. Where no record is committed yet,
the line becomes a note saying so and giving the command that makes one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_MARKER = re.compile(r"^<!-- minispec-record: (\w+) -->[ \t]*$", re.MULTILINE)


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " ---: |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render_gpu(record: dict) -> str:
    """Markdown for a GPU record (the fields ``benchmarks/gpu.py`` writes)."""
    m = record["machine"]
    parts = [f"*Record:* `docs/data/gpu.json`, measured on {m['device']} (torch {m['torch']}, "
             f"CUDA {m['cuda']}) at commit `{record['commit'][:10]}` by `{record['command']}`; "
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


def _render(name: str, data: Path) -> str:
    path = data / f"{name}.json"
    if not path.is_file():
        return (f"*No `docs/data/{name}.json` is committed yet: `bash benchmarks/gpu_session.sh` "
                f"on a machine with a CUDA GPU writes it.*")
    return render_gpu(json.loads(path.read_text()))


def on_page_markdown(markdown: str, page, config, files) -> str:
    data = Path(config["docs_dir"]) / "data"
    return _MARKER.sub(lambda m: _render(m.group(1), data), markdown)
