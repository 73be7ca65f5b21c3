"""The package is a core and its wings, and imports say so.

The **core** is five folders, ``minispec/core`` < ``models`` < ``drafters`` < ``decoding`` <
``serving``: a core module imports from its own folder or from core folders below it, and never
from outside the core (``TYPE_CHECKING`` imports included: a type hint pointing at a wing is a
dependency too). The **wings** (``speed``, ``extra_drafters``, ``loading``, ``zoo``, ``grammar``)
import the core and each other, never ``check`` or ``tools``; ``check`` and ``tools`` may import
anything. The facade (``minispec/__init__.py``) re-exports the coursework API, wires the wings'
defaults in and never imports the tools; no private name crosses modules; the package docstring
lists the core's folders in order.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import minispec

PACKAGE = Path(minispec.__file__).parent
CORE = ("core", "models", "drafters", "decoding", "serving")
WINGS = ("speed", "extra_drafters", "loading", "zoo", "grammar")
AROUND = ("check", "tools")


def layer_of(path: Path) -> str:
    """The folder a file belongs to (``__init__``/``__main__`` at the top: the facade)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else "facade"


def minispec_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``[(dotted module, [imported names])]`` for every ``minispec`` import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minispec"):
            if node.module == "minispec":       # from minispec import zoo
                found += [(f"minispec.{a.name}", []) for a in node.names]
            else:
                found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("minispec.")]
    return found


def target_layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    known = CORE + WINGS + AROUND
    return parts[1] if len(parts) > 1 and parts[1] in known else None


def test_every_module_sits_in_the_core_a_wing_or_around_them():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the folders: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(CORE + WINGS + AROUND), f"folders {sorted(folders)} are not known"


def test_the_core_imports_only_the_core_and_down_its_layers():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        if (me := layer_of(path)) not in CORE:
            continue
        for dotted, _ in minispec_imports(path):
            to = target_layer(dotted)
            if to not in CORE:
                wrong.append(f"{path.relative_to(PACKAGE)} (core) imports {dotted} ({to})")
            elif CORE.index(to) > CORE.index(me):
                wrong.append(f"{path.relative_to(PACKAGE)} ({me}) imports {dotted} ({to})")
    assert not wrong, "\n".join(wrong)


def test_a_core_module_that_imports_a_wing_fails_this_check(tmp_path):
    """The check above can fail: a core file importing a wing is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from minispec.speed.goodput import GoodputK\n")
    assert [target_layer(d) for d, _ in minispec_imports(bad)] == ["speed"]
    assert "speed" not in CORE


def test_wings_never_import_the_graders_or_the_tools():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        if layer_of(path) not in WINGS:
            continue
        for dotted, _ in minispec_imports(path):
            if (to := target_layer(dotted)) is None or to in AROUND:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {dotted}")
    assert not wrong, "\n".join(wrong)


def test_the_facade_does_not_import_the_tools():
    facade = PACKAGE / "__init__.py"
    assert not [d for d, _ in minispec_imports(facade) if target_layer(d) == "tools"]
    assert len(minispec.__all__) <= 35


def test_the_wings_defaults_are_wired_from_above():
    """The core's defaults for ``adaptive=`` and ``graphs=`` and the drafter named "suffix" are
    the wings', installed by the facade (the core names none of them)."""
    from minispec.decoding.runner import DEFAULTS
    from minispec.drafters.ngram import DRAFTERS
    from minispec.loading import prompts
    from minispec.speed.defaults import collaborators
    assert DEFAULTS.speed is collaborators and DEFAULTS.prompts is prompts
    assert DRAFTERS["suffix"] is minispec.SuffixDrafter


def test_no_private_name_is_imported_across_modules():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for dotted, names in minispec_imports(path):
            wrong += [f"{path.relative_to(PACKAGE)} imports {dotted}.{n}" for n in names
                      if n.startswith("_")]
    assert not wrong, "\n".join(wrong)


def test_the_package_docstring_lists_the_core_in_order():
    listed = re.findall(r"^\d\. \[`minispec\.(\w+)`\]", minispec.__doc__, flags=re.M)
    assert listed == list(CORE)
