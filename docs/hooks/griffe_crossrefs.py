"""A griffe extension (listed under mkdocstrings' ``extensions:`` in mkdocs.yml).

minispec's docstrings are Google style and write cross-references the way mkdocstrings reads
them: ``[`Verdict`][minispec.speculative.Verdict]``. Some docstrings still use Sphinx roles
(``:class:`Verdict```, ``:func:`verify```). Left alone, the Google parser reads the colon of a
role on the first line of a ``Returns:`` section as "type: description" and prints "A" as the
return type, and the role itself as text. This extension rewrites each role, before any docstring
is parsed, into the cross-reference an author would have written: the name is resolved from the
object's own scope outwards (its class, its module, the package's public names). A name links only
where the site documents it: a module needs its API page in mkdocs.yml's nav (the page carries
the module's anchor), anything else a docstring (mkdocstrings hides undocumented objects). A name
that resolves to nothing documented stays as inline code.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`(?P<ref>[^`]+)`")


def _public(path: str) -> bool:
    return not any(part.startswith("_") for part in path.split("."))


@cache
def _api_pages() -> str | None:
    """mkdocs.yml's text (the nav lists ``api/<module>.md`` pages), or None when not found."""
    config = Path("mkdocs.yml")
    return config.read_text(encoding="utf-8") if config.is_file() else None


def _documented(obj: griffe.Object) -> bool:
    if not _public(obj.path):
        return False
    if obj.is_module:
        pages = _api_pages()
        return pages is None or f"api/{obj.path}.md" in pages
    return obj.docstring is not None and _documented(obj.module)


def _lookup(scope: griffe.Object, dotted: str) -> str | None:
    """The documented path of ``dotted`` as seen from ``scope``, or None."""
    try:
        found = scope
        for part in dotted.split("."):
            found = found.members[part]
        if found.is_alias:
            found = found.final_target
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return found.path if _documented(found) else None


def _resolve(obj: griffe.Object, ref: str, package: griffe.Module) -> str | None:
    name = ref.lstrip("~.").removesuffix("()")
    if name.startswith(package.name + "."):
        return _lookup(package, name[len(package.name) + 1:])
    scopes: list[griffe.Object] = []
    node: griffe.Object | None = obj
    while node is not None:
        if node.is_class or node.is_module:
            scopes.append(node)
        node = node.parent
    for scope in scopes:
        path = _lookup(scope, name)
        if path:
            return path
    return None


def _rewrite(obj: griffe.Object, package: griffe.Module) -> None:
    doc = obj.docstring
    if doc is None or ":" not in doc.value:
        return

    def link(m: re.Match) -> str:
        ref = m.group("ref")
        shown = ref.lstrip("~.").split(".")[-1] if ref.startswith("~") else ref.lstrip(".")
        path = _resolve(obj, ref, package)
        return f"[`{shown}`][{path}]" if path else f"`{shown}`"

    doc.value = _ROLE.sub(link, doc.value)


def _walk(obj: griffe.Object):
    yield obj
    for member in list(obj.members.values()):
        if not member.is_alias and member.parent is obj:
            yield from _walk(member)


class SphinxRolesToCrossrefs(griffe.Extension):
    """Turn ``:role:`name``` in docstrings into mkdocstrings cross-references."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _walk(pkg):
            _rewrite(obj, pkg)
