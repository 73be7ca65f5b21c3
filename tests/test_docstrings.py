"""Docstrings explain; the results page measures.

Two rules over every ``.py`` file under ``minispec/``:

* a **module docstring** holds at most ``MAX_MODULE_LINES`` lines (counted as
  ``ast.get_docstring`` returns it: the text, without the quotes' own lines). A longer story
  belongs on a page of the site or in the docstring of the class or function it is about.
* no **docstring** (module, class or function) and no comment quotes a **measured figure**: a
  time, a ratio, a share or a rate that a run on some machine produced ("1.37x", "19.3 ms",
  "4.8 %", "took 41 ms", "11.3 GB/s"). Such numbers go stale with the machine, the load and the
  code; they live on the results page (``docs/results.md``), next to the command and the machine
  that produced them, and a docstring says "see the results page" instead.

What counts as a measured figure is ``FIGURE``: a number written in decimal (``41``, ``1.37``,
``1,200``; not part of a word or of a longer number: the ``16`` of ``bf16`` and the ``4`` of
``k4`` are not numbers here) directly followed by one of these units:

* ``x`` or ``×`` written against the number, with no letter or digit after it: a ratio
  (``1.37x``, ``0.97-0.99x``). Not ``2 x 3`` or ``8 x (k+1)`` (a product or a shape: spaced),
  ``4x4`` (a shape), ``0x1f`` or a bare ``0x`` (hexadecimal; no ratio is 0x);
* ``ms``, ``µs`` (or ``μs``, ``us``), ``ns``, with or without a space: a duration;
* ``s`` for seconds, after a space (``3 s``) or after a decimal fraction (``3.2s``). An integer
  glued to ``s`` (``1s``, ``64s``) is a plural, not a time;
* ``%``, with or without a space: a share (``4.8 %``, ``21%``);
* a rate: ``GB/s``, ``MB/s``, ``KB/s`` (also ``GiB/s`` ...), ``tok/s``, ``tokens/s``.

Numbers without such a unit -- defaults, shapes, formulas, ``k = 4``, ``64 rows``, ``2**20``,
``1e-4``, a paper's equation numbers -- are fine. A default that is a share is written as a
fraction (``margin = 0.3``), which reads as the parameter it is.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import minispec

PACKAGE = Path(minispec.__file__).parent
MAX_MODULE_LINES = 25

_NUMBER = r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
FIGURE = re.compile(
    r"(?<![\w.,])(?!0[x×])"               # not "0x": hexadecimal, never a ratio
    r"(?:"
    rf"{_NUMBER}[x×](?!\w)"               # 1.37x, 0.97x (not 2 x 3, 4x4, 0x1f)
    rf"|{_NUMBER}\s*(?:ms|µs|μs|us|ns)\b"  # 19.3 ms, 12 µs, 2ms
    rf"|{_NUMBER}\s+s\b"                  # 3 s (a space: "1s" is a plural)
    r"|(?<![\w.,])\d+\.\d+s\b"            # 3.2s
    rf"|{_NUMBER}\s*%"                    # 4.8 %, 21%
    rf"|{_NUMBER}\s*(?:[KMGT]i?B/s|tok/s|tokens/s)"  # 11.3 GB/s, 297 tok/s
    r")"
)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _docstrings(tree: ast.Module):
    """(name, first line, raw text) of the module's docstring and of every class and function's."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield getattr(node, "name", "<module>"), first.lineno, first.value.value


def figures(text: str) -> list[str]:
    """The measured figures ``text`` quotes (any whitespace, line breaks too, read as a space)."""
    return [m.group(0) for m in FIGURE.finditer(" ".join(text.split()))]


@pytest.mark.parametrize("text", [
    "1.37x", "0.97-0.99x", "a 2x gain", "1.2×", "19.3 ms", "took 41 ms", "41ms", "12 µs",
    "~10 us", "3.2 s", "start 255 s cold", "3.2s", "4.8 %", "21%", "11.3 GB/s", "37 GB/s",
    "297 tok/s", "496 tokens/s", "1,200 ms", "took 65.7, 68.6 and 73.9\nms",
])
def test_the_pattern_finds_measured_figures(text):
    assert figures(text), text


@pytest.mark.parametrize("text", [
    "0x", "``0x1f``", "2 x 3", "8 x (k+1) rows", "(2304 x 9216)", "4x4", "k = 4", "k=4",
    "64 rows", "2**20", "1e-4", "bf16", "fp32", "padded with 1s", "Eq. (1)", "Theorem 3.8",
    "(B, T, D)", "V100s", "x86_64", "a 3-step window", "every 2 seconds", "1.5",
    "max(0, p - q)", "``%d``", "50 percent",
])
def test_the_pattern_spares_other_numbers(text):
    assert not figures(text), text


def test_module_docstrings_are_short():
    long = {}
    for path in _sources():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if doc and len(doc.splitlines()) > MAX_MODULE_LINES:
            long[path.relative_to(PACKAGE.parent).as_posix()] = len(doc.splitlines())
    assert not long, (
        f"module docstrings over {MAX_MODULE_LINES} lines (move the story to the docs, or to the "
        f"class or function it is about): {long}")


def test_no_docstring_quotes_a_measured_figure():
    hits = []
    for path in _sources():
        for name, line, text in _docstrings(ast.parse(path.read_text(encoding="utf-8"))):
            for lineno, row in enumerate(text.splitlines(), start=line):
                hits += [f"{path.relative_to(PACKAGE.parent)}:{lineno} ({name}): {figure!r}"
                         for figure in figures(row)]
            # a figure broken over two lines ("41\nms") is found in the joined text only
            joined, rows = figures(text), sum(len(figures(r)) for r in text.splitlines())
            if len(joined) > rows:
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({name}): {joined!r}")
    assert not hits, ("measured figures in docstrings (move them to docs/results.md with their "
                      "command and machine; say 'see the results page'):\n" + "\n".join(hits))


def test_no_comment_quotes_a_measured_figure():
    hits = []
    for path in _sources():
        source = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and figures(tok.string):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{tok.start[0]}: {tok.string}")
    assert not hits, "measured figures in comments (the results page holds them):\n" + "\n".join(
        hits)
