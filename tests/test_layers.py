"""The layer order documented in ``minispec/__init__.py`` holds: a module imports only from layers
below it, or from modules listed before it in its own layer; and no private name crosses modules.

The order is read from the package docstring ("1. maths: [`sampling`][minispec.sampling], ...";
a module with no API page is inline code, ``minispec.cli``), and the imports from every module's
source with ``ast`` (``TYPE_CHECKING`` imports included: a type hint pointing up the stack is a
dependency too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import minispec

PACKAGE = Path(minispec.__file__).parent


def documented_order() -> dict[str, tuple[int, int]]:
    """``{module: (layer, index within the layer)}`` from the package docstring."""
    order: dict[str, tuple[int, int]] = {}
    layer = 0
    for line in minispec.__doc__.splitlines():
        if m := re.match(r"\s*(\d)\. \w+:", line):
            layer = int(m.group(1))
        if layer and (mods := re.findall(r"\bminispec\.([\w.]+)(?=[\]`])", line)):
            for mod in mods:
                order[mod] = (layer, sum(lay == layer for lay, _ in order.values()))
        if not line.strip():
            layer = 0 if order else layer
    return order


def module_of(path: Path) -> str:
    """The minispec module a file belongs to: ``zoo/train.py`` -> ``zoo``, unless the file has its
    own place in the documented order (``zoo/train_eagle.py`` -> ``zoo.train_eagle``)."""
    rel = path.relative_to(PACKAGE)
    dotted = ".".join(rel.with_suffix("").parts)
    return dotted if dotted in documented_order() else rel.parts[0].removesuffix(".py")


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``[(minispec module, [imported names])]`` for every ``minispec`` import in a file."""
    found, order = [], documented_order()

    def name(dotted: str) -> str:                 # "zoo.eagle_data" if listed, else "zoo"
        return dotted if dotted in order else dotted.split(".")[0]

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minispec"):
            parts = node.module.split(".")
            if len(parts) == 1:                   # from minispec import theory, viz
                found += [(alias.name, []) for alias in node.names]
            elif ".".join(parts[1:]) in order or len(parts) > 2:
                found.append((name(".".join(parts[1:])), [alias.name for alias in node.names]))
            else:                                 # from minispec.zoo import eagle_data, smollm2
                listed = [a.name for a in node.names if f"{parts[1]}.{a.name}" in order]
                found += [(f"{parts[1]}.{n}", []) for n in listed]
                found.append((parts[1], [a.name for a in node.names if a.name not in listed]))
        elif isinstance(node, ast.Import):
            found += [(a.name.split(".")[1], []) for a in node.names
                      if a.name.startswith("minispec.")]
    return found


def test_every_module_is_in_the_documented_order():
    order = documented_order()
    modules = {module_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert modules <= set(order), f"modules missing from the layer list: {sorted(modules - set(order))}"


def test_imports_only_go_down_the_layers():
    order = documented_order()
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = module_of(path)
        if me in ("__init__", "__main__"):
            continue
        for target, _ in imports(path):
            if target != me and target in order and order[target] >= order[me]:
                wrong.append(f"{path.relative_to(PACKAGE)} ({me}, layer {order[me][0]}) imports "
                             f"{target} (layer {order[target][0]})")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_across_modules():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = module_of(path)
        for target, names in imports(path):
            wrong += [f"{path.relative_to(PACKAGE)} imports {target}.{n}" for n in names
                      if n.startswith("_") and target != me]
    assert not wrong, "\n".join(wrong)
