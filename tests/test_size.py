"""The package stays small enough to read in an afternoon: measured, not promised.

Code lines are lines holding code: not blank, not comments, not docstrings (docstrings are not
budgeted: keep them). The layers a student reads -- ``core``, ``models``, ``drafters``,
``decoding``, ``serving``, the ``zoo`` registry and the top-level modules (``minispec/*.py``), not
the tools, the graders or the training recipes -- are counted whole and have no function over 40
code lines.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import minispec

PACKAGE = Path(minispec.__file__).parent
READ = ("core", "zoo", "models", "drafters", "decoding", "serving")
MAX_FUNCTION = 40

#: Code lines the reading layers may hold: a ratchet. The count may fall; a change that adds code
#: pays for it elsewhere or raises the ceiling in the open, with its reason in the commit message.
#: The goal is ``GOAL``, counted whole (the issue "The accept rule a student reads is the one that
#: runs" asks for it); the layers are over it, and this test says by how much.
MAX_CODE_LINES = 4_046
#: The goal for the reading layers counted whole (nothing subtracted). Not met: the ceiling above
#: holds the count where it is, and the failure message of the ceiling test gives the gap.
GOAL = 3_600


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> set[int]:
    """The numbers of the lines that hold code."""
    skip = docstring_lines(ast.parse(source))
    lines: set[int] = set()
    ignored = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in ignored:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in skip)
    return lines


def read_files() -> list[Path]:
    """The reading layers' files and the top-level modules (the coursework API), counted whole."""
    return sorted([*(p for layer in READ for p in (PACKAGE / layer).rglob("*.py")),
                   *PACKAGE.glob("*.py")])


def function_sizes() -> list[tuple[int, str]]:
    sizes = []
    for path in read_files():
        source = path.read_text()
        code = code_lines(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = code & set(range(node.lineno, node.end_lineno + 1))
                sizes.append((len(body), f"{path.relative_to(PACKAGE)}:{node.name}"))
    return sorted(sizes, reverse=True)


def test_no_function_is_longer_than_a_screen():
    long = [f"{name} ({n} code lines)" for n, name in function_sizes() if n > MAX_FUNCTION]
    assert not long, "split these functions: " + ", ".join(long)


def test_the_reading_layers_stay_within_their_line_budget():
    total = {path.relative_to(PACKAGE).as_posix(): len(code_lines(path.read_text()))
             for path in read_files()}
    largest = sorted(total.items(), key=lambda item: -item[1])[:5]
    assert sum(total.values()) <= MAX_CODE_LINES, (
        f"{sum(total.values())} code lines in the reading layers, over {MAX_CODE_LINES} (the goal "
        f"is {GOAL}); largest files: {largest}")


def test_the_reading_path_gives_each_files_true_length():
    """docs/architecture.md's reading path states each file's lines: they must be today's."""
    import re

    root = Path(__file__).parent.parent
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"\| \d \| `(minispec/[^`]+)` \| (\d+) \|", page)
    assert len(rows) >= 6, "the reading path table is missing"
    true = {path: len((root / path).read_text().splitlines()) for path, _ in rows}
    wrong = {path: (int(n), true[path]) for path, n in rows if int(n) != true[path]}
    assert not wrong, f"stated vs true line counts: {wrong}"
