"""The package's layers are its folders, and imports only go down them.

``minispec/core`` < ``zoo`` < ``models`` < ``drafters`` < ``decoding`` < ``serving`` < ``check``
< ``tools``:
a module imports from its own folder or from folders below it (``TYPE_CHECKING`` imports
included: a type hint pointing up the stack is a dependency too). The facade
(``minispec/__init__.py``) re-exports the coursework API and never imports the tools; no private
name crosses modules; the package docstring lists the folders in this order.

A *wing* (``minispec/grammar``) is a folder no layer imports: it may import any layer, and the
facade registers what it provides in a core hook.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import minispec

PACKAGE = Path(minispec.__file__).parent
LAYERS = ("core", "zoo", "models", "drafters", "decoding", "serving", "check", "tools")
WINGS = ("grammar",)


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
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer_folder():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the layer folders: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    extra = folders - set(LAYERS) - set(WINGS)
    assert not extra, f"folders {sorted(extra)} are neither layers nor wings"


def test_imports_only_go_down_the_layers():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = layer_of(path)
        if me == "facade":
            continue
        for dotted, _ in minispec_imports(path):
            to = target_layer(dotted)
            if me in WINGS and (to is not None or dotted.split(".")[1] == me):
                continue                                     # a wing sits above every layer
            if to is None:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {dotted} (not a layer module)")
            elif LAYERS.index(to) > LAYERS.index(me):
                wrong.append(f"{path.relative_to(PACKAGE)} ({me}) imports {dotted} ({to})")
    assert not wrong, "\n".join(wrong)


def test_the_facade_does_not_import_the_tools():
    facade = PACKAGE / "__init__.py"
    assert not [d for d, _ in minispec_imports(facade) if target_layer(d) == "tools"]
    assert len(minispec.__all__) <= 35


def test_no_private_name_is_imported_across_modules():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for dotted, names in minispec_imports(path):
            wrong += [f"{path.relative_to(PACKAGE)} imports {dotted}.{n}" for n in names
                      if n.startswith("_")]
    assert not wrong, "\n".join(wrong)


def test_the_package_docstring_lists_the_layers_in_order():
    listed = re.findall(r"^\d\. \[`minispec\.(\w+)`\]", minispec.__doc__, flags=re.M)
    present = [layer for layer in LAYERS if (PACKAGE / layer / "__init__.py").exists()]
    assert listed == present
