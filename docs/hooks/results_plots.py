"""mkdocs hook: the Results page's figures, drawn at build time from the page's own tables.

A line ``<!-- minispec-plot: speed -->`` or ``<!-- minispec-plot: engine -->`` in a page is replaced
by a PNG figure (inlined as a data URI, so it needs no file and no network) drawn from the Markdown
tables of the same page:

* ``speed``: every table whose header starts ``| method | time (s) |`` (one per prompt set, named by
  the bold line above it): each method's speedup over minispec's greedy loop, one panel per set;
* ``engine``: the table whose header starts ``| B | engine tok/s |``: throughput against batch size
  for the engine without speculation, with the draft model, with n-grams, and transformers.

Drawing from the tables keeps figure and numbers from drifting apart: edit the table, and the
figure follows at the next build. The figures are sized for the content column (about 860 px at a
1400 px window) with 11-point labels.
"""

from __future__ import annotations

import base64
import io
import re

_MARKER = re.compile(r"^<!-- minispec-plot: (\w+) -->[ \t]*$", re.MULTILINE)
_WIDTH_IN, _DPI = 8.4, 100  # about 840 px natural width (tight bounding box)


def _tables(markdown: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(label, header, rows) of every pipe table; label = the last bold line above it."""
    out, label, lines, i = [], "", markdown.splitlines(), 0
    while i < len(lines):
        line = lines[i].strip()
        bold = re.fullmatch(r"\*\*(.+)\*\*", line)
        if bold:
            label = bold.group(1)
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|\s*:?-{3}", lines[i + 1]):
            cells = lambda s: [c.strip() for c in s.strip().strip("|").split("|")]  # noqa: E731
            header, rows, i = cells(line), [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out.append((label, header, rows))
            continue
        i += 1
    return out


def _number(cell: str) -> float:
    m = re.match(r"\s*([0-9.]+)", cell)
    return float(m.group(1)) if m else float("nan")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _speed(tables) -> tuple[str, str]:
    import matplotlib.pyplot as plt

    sets = [(label, rows) for label, header, rows in tables if header[:2] == ["method", "time (s)"]]
    heights = [len(rows) for _, rows in sets]
    fig, axes = plt.subplots(len(sets), 1,
                             figsize=(_WIDTH_IN, 0.3 * sum(heights) + 1.4 * len(sets)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (label, rows) in zip(axes[:, 0], sets, strict=True):
        names = [r[0] for r in rows]
        speed = [_number(r[3]) for r in rows]
        colours = ["#1f77b4" if n.startswith("minispec") else "#ff7f0e" for n in names]
        ax.barh(range(len(rows)), speed, color=colours)
        ax.set_yticks(range(len(rows)), names, fontsize=10)
        ax.invert_yaxis()
        ax.axvline(1.0, color="0.3", lw=1)
        for y, s in enumerate(speed):
            ax.text(s + 0.02, y, f"{s:.2f}x", va="center", fontsize=10)
        ax.set_xlim(0, max(speed) * 1.15)
        ax.set_title(label, fontsize=11, loc="left")
    axes[-1, 0].set_xlabel("speedup over minispec generate (blue: minispec, orange: transformers)",
                           fontsize=11)
    fig.tight_layout()
    png = _png(fig)
    plt.close(fig)
    alt = ("Horizontal bars, one per method and prompt set: speedup over minispec's greedy loop. "
           "n-gram and prompt-lookup drafting are fastest, draft-model speculation gains a little, "
           "transformers' greedy and assisted generation are below 1x.")
    return png, alt


def _engine(tables) -> tuple[str, str]:
    import matplotlib.pyplot as plt

    rows = next(rows for _, header, rows in tables if header[:2] == ["B", "engine tok/s"])
    batch = [int(_number(r[0])) for r in rows]
    series = {
        "engine, no speculation": 1, "engine + draft model": 2, "engine + n-gram": 3,
        "transformers continuous batching": 4, "transformers static batch": 5,
    }
    styles = ["o-", "s-", "^-", "o--", "s:"]
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 4.2))
    for (name, col), style in zip(series.items(), styles, strict=True):
        ax.plot(batch, [_number(r[col]) for r in rows], style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batch, [str(b) for b in batch])
    ax.set_xlabel("batch size B (concurrent requests)", fontsize=11)
    ax.set_ylabel("tokens / s", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    png = _png(fig)
    plt.close(fig)
    alt = ("Throughput against batch size, log-log: the engine grows from about 360 to 4100 "
           "tokens/s; speculation (draft or n-gram) helps at B = 1-2 and falls behind from B = 16; "
           "transformers' continuous batching stays below the engine.")
    return png, alt


_PLOTS = {"speed": _speed, "engine": _engine}


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "minispec-plot:" not in markdown:
        return markdown
    tables = _tables(markdown)

    def figure(m: re.Match) -> str:
        kind = m.group(1)
        if kind not in _PLOTS:
            raise ValueError(f"{page.file.src_uri}: unknown plot {kind!r} "
                             f"(known: {sorted(_PLOTS)})")
        png, alt = _PLOTS[kind](tables)
        return f"![{alt}](data:image/png;base64,{png}){{ .minispec-figure }}"

    return _MARKER.sub(figure, markdown)
