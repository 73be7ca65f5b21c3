"""The core stays small enough to read in an afternoon, and every part keeps its size: measured.

Code lines are lines holding code: not blank, not comments, not docstrings (docstrings are not
budgeted: keep them). The **core** -- the five folders a student reads (``core``, ``models``,
``drafters``, ``decoding``, ``serving``) -- is counted whole and held to ``CORE_BUDGET``, its size
at the split; the goal ``GOAL`` is not met, and the failure message gives the gap. Each
wing and ``check/`` is held to its size when the core and its wings were split (a ceiling that
may fall; a change that adds code raises it in the open, with its reason in the commit
message). No function of the core, a wing or ``check/`` is over ``MAX_FUNCTION`` code lines (the
tools' command lines and training recipes are not held to it).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import minispec

PACKAGE = Path(minispec.__file__).parent
CORE = ("core", "models", "drafters", "decoding", "serving")
MAX_FUNCTION = 40
#: The goal for the core, counted whole (the issue "The teaching core and its wings"): not met.
GOAL = 2_400
#: The core's code lines when the core and its wings were split, with the grammar's hooks (a
#: mask on p and q, forced drafts, a state committed on accept: 101 lines): a ceiling.
CORE_BUDGET = 2_558
#: Each wing's and the graders' code lines when the core and its wings were split: ceilings.
CEILINGS = {"speed": 553, "extra_drafters": 623, "loading": 349, "zoo": 145, "grammar": 230,
            "check": 1_369}


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


def files_of(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py"))


def count(*folders: str) -> dict[str, int]:
    """``{file: code lines}`` for every file of ``folders``."""
    return {p.relative_to(PACKAGE).as_posix(): len(code_lines(p.read_text()))
            for p in files_of(*folders)}


def function_sizes() -> list[tuple[int, str]]:
    sizes = []
    for path in files_of(*CORE, *CEILINGS):
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


def test_the_core_stays_within_its_budget():
    total = count(*CORE)
    largest = sorted(total.items(), key=lambda item: -item[1])[:5]
    assert sum(total.values()) <= CORE_BUDGET, (
        f"{sum(total.values())} code lines in the core, over its ceiling {CORE_BUDGET} (the goal "
        f"is {GOAL}); largest files: {largest}")


def test_each_wing_and_the_graders_stay_within_their_ceilings():
    over = {part: n for part, limit in CEILINGS.items()
            if (n := sum(count(part).values())) > limit}
    assert not over, f"over their ceilings {CEILINGS}: {over}"


def test_the_counter_counts_code_only():
    """A docstring, a comment and blank lines are not code; a statement split over two lines is
    two code lines."""
    source = '"""Doc."""\n\n# a comment\nx = (1 +\n     2)\n'
    assert code_lines(source) == {4, 5}


def test_the_reading_path_lists_the_core_with_each_files_true_length():
    """docs/architecture.md's reading path lists exactly the core's files, with today's lengths."""
    import re

    root = Path(__file__).parent.parent
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"\| \d+ \| `(minispec/[^`]+)` \| (\d+) \|", page)
    listed = {path for path, _ in rows}
    core = {f"minispec/{name}" for name in count(*CORE) if not name.endswith("__init__.py")}
    assert listed == core, f"missing {sorted(core - listed)}, not core {sorted(listed - core)}"
    true = {path: len((root / path).read_text().splitlines()) for path, _ in rows}
    wrong = {path: (int(n), true[path]) for path, n in rows if int(n) != true[path]}
    assert not wrong, f"stated vs true line counts: {wrong}"
