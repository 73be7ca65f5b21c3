r"""mkdocs hooks for the minispec site (registered under ``hooks:`` in mkdocs.yml).

What they do, in build order:

* ``on_config``: the nav entry whose value is the string ``lessons/*.ipynb`` is replaced by one
  entry per notebook present in ``lessons/`` (title from the notebook's first ``#`` heading), so the
  nav lists exactly the lessons that exist.
* ``on_files`` (high priority, so it runs before mkdocs-jupyter wraps notebooks as pages):
  - adds ``lessons/*.ipynb`` from the repository root; the notebooks stay in ``lessons/``;
  - generates ``api/<module>.md`` (``# module`` + ``::: module``) for every nav entry of that form
    that has no hand-written file under ``docs/api/``; a nav entry for a module that does not exist
    fails the build with a clear message;
  - generates ``model-card.md`` from ``minispec/zoo/MODEL_CARD.md`` and ``model-card-eagle.md`` from
    the EAGLE head's ``MODEL_CARD.md`` (``MODEL_CARDS``; a placeholder while a card does not exist
    yet); images next to a card are copied to ``<page>-assets/``, other relative links (to files of
    the package) are shown as paths, so a card cannot break the strict build.
* ``on_page_markdown``: a link to ``lessons/NN_*.ipynb`` (a glob) points at the lesson with that
  number, or turns into plain text marked "in preparation" when no such notebook exists yet; an
  API page gets an autorefs anchor named after its module, so
  ``[`minispec.tools.viz`][minispec.tools.viz]`` links to it.
* ``on_page_content``: a file path in inline code (``vllm/v1/core/block_pool.py``) may wrap only
  after its slashes, never mid-word; on API pages a code span that is really a formula
  (``f_{t-1}``, ``(f_j, x_{j+1})``) is typeset as math, and `` -- `` in running text becomes a dash.
* ``on_post_page``: removes what nbconvert's template injects into notebook pages and this site does
  not want: the MathJax 2 loader (pointing at a CDN, dead here; MathJax 3 is served by the site) and
  the Mermaid loader (a CDN import); and gives each plot the alt text its code cell declares in
  its metadata (``"alt"``) in place of nbconvert's "No description has been provided".

  Each page also sheds weight (``on_post_page``): the notebook stylesheet nbconvert inlines into
  every notebook page (590 KB of JupyterLab's CSS, the same on each) is moved to one shared file,
  ``assets/stylesheets/notebook-<hash>.css``, pruned at the end of the build to the rules that
  match the notebook pages' markup; MathJax (1.1 MB) is loaded only by pages that hold math; the
  search index (1.2 MB) only when the search box is used (``javascripts/search-on-demand.js``,
  put before material's bundle).

``on_post_build`` turns the math in the search index into plain text, so that search previews
show ``β = Σ_x min(p, q)`` rather than raw TeX, and writes the pruned notebook stylesheets.

Lesson titles in the nav and the browser tab are plain text: ``$\gamma$`` in a notebook heading
becomes ``γ`` there (the page's own heading keeps the typeset math). The build turns tqdm off
(``TQDM_DISABLE=1``, inherited by the kernels that execute the lessons), so no progress bar or
"IProgress not found" warning is written into a page.

Docstrings write cross-references as mkdocstrings reads them,
``[`Verdict`][minispec.core.speculative.Verdict]``; an object with no page of its own (a torch
class, a module outside the API reference) is plain inline code.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import html
import io
import json
import logging
import os
import posixpath
import re
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.minispec_site")

LESSONS_GLOB = "lessons/*.ipynb"
EXERCISES_GLOB = "lessons/exercises/*.ipynb"
MODEL_CARD = "minispec/zoo/MODEL_CARD.md"
MODEL_CARD_PAGE = "model-card.md"
#: Every model card shown on the site: page -> (card in the package, what the card describes).
MODEL_CARDS = {
    MODEL_CARD_PAGE: (MODEL_CARD, "the shipped pair (`shakespeare-target`, `shakespeare-draft`)"),
    "model-card-eagle.md": ("minispec/zoo/smollm2-135m-instruct-eagle/MODEL_CARD.md",
                            "the EAGLE head for SmolLM2-135M-Instruct "
                            "(`smollm2-135m-instruct-eagle`)"),
}
_API_PAGE = re.compile(r"^api/(?P<module>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)\.md$")


def _root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _lessons(root: Path, folder: str = "lessons") -> list[Path]:
    return sorted(p for p in (root / folder).glob("*.ipynb") if not p.name.startswith("."))


def _notebooks(root: Path) -> list[str]:
    """Every notebook the site shows, as a path from the repository root: lessons, exercises."""
    return [f"lessons/{p.name}" for p in _lessons(root)] + \
        [f"lessons/exercises/{p.name}" for p in _lessons(root, "lessons/exercises")]


def _lesson_title(path: Path) -> str:
    """The notebook's first level-1 heading, else a title made from the file name."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") != "markdown":
                continue
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            m = re.search(r"^#\s+(.+?)\s*#*\s*$", src, re.MULTILINE)
            if m:
                return plain_title(m.group(1))
    except (OSError, ValueError):
        pass  # a notebook being written right now: fall back to its name
    stem = path.stem
    num, _, rest = stem.partition("_")
    return f"{num} {rest.replace('_', ' ')}".strip() if num.isdigit() else stem.replace("_", " ")


_TEX_SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "lambda": "λ",
    "mu": "μ", "sigma": "σ", "tau": "τ", "le": "≤", "ge": "≥", "times": "×", "cdot": "·",
}


def plain_title(heading: str) -> str:
    """A Markdown heading as plain text for the nav and the browser tab.

    Inline math loses its dollars and braces and TeX symbols become Unicode
    (``$D_{LK}$`` -> ``D_LK``, ``$\\gamma$`` -> ``γ``); emphasis and code marks are dropped.
    """
    def math(m: re.Match) -> str:
        tex = re.sub(r"\\([A-Za-z]+)", lambda s: _TEX_SYMBOLS.get(s.group(1), s.group(1)),
                     m.group(1))
        return re.sub(r"[{}]", "", tex).strip()

    text = re.sub(r"\$([^$]+)\$", math, heading)
    return re.sub(r"[`*]", "", text).strip()


_TEX_WORDS = {
    "min": "min", "max": "max", "sum": "Σ", "prod": "Π", "in": "∈", "infty": "∞", "approx": "≈",
    "neq": "≠", "ne": "≠", "to": "→", "mid": "|", "dots": "…", "ldots": "…", "cdots": "…",
    "log": "log", "exp": "exp", "argmax": "argmax", "norm": "norm", "hat": "", "tilde": "",
    "bar": "", "mathbb": "", "mathrm": "", "text": "", "texttt": "", "operatorname": "",
    "mathcal": "", "boldsymbol": "", "frac": "",
}


def _group(tex: str, i: int) -> tuple[str, int]:
    """The brace group starting at or after ``tex[i]`` and the index after it."""
    while i < len(tex) and tex[i].isspace():
        i += 1
    if i >= len(tex) or tex[i] != "{":
        return (tex[i:i + 1], i + 1)
    depth, j = 0, i
    for j in range(i, len(tex)):
        depth += {"{": 1, "}": -1}.get(tex[j], 0)
        if depth == 0:
            break
    return tex[i + 1:j], j + 1


def _fracs(tex: str) -> str:
    """``\\frac{a}{b}`` -> ``(a)/(b)``, nested braces included."""
    while m := re.search(r"\\[dt]?frac(?![A-Za-z])", tex):
        i = m.start()
        num, j = _group(tex, m.end())
        den, k = _group(tex, j)
        tex = f"{tex[:i]}({_fracs(num)})/({_fracs(den)}){tex[k:]}"
    return tex


def plain_math(tex: str) -> str:
    """TeX as readable plain text for search previews: ``\\beta = \\sum_x \\min(p, q)`` ->
    ``β = Σ_x min(p, q)``. Not a renderer: spacing and sizing commands are dropped."""
    tex = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle|quad|qquad)\b", " ",
                 tex)
    tex = re.sub(r"\\[,;:! ]", " ", tex)
    tex = _fracs(tex)

    def word(m: re.Match) -> str:
        name = m.group(1)
        return _TEX_SYMBOLS.get(name, _TEX_WORDS.get(name, name))

    tex = re.sub(r"\\([A-Za-z]+)", word, tex)
    tex = tex.replace("\\_", "_").replace("\\{", "{").replace("\\}", "}")
    tex = re.sub(r"[{}]", "", tex)
    return re.sub(r"\s+", " ", tex).strip()


_SEARCH_MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]|\$\$(.+?)\$\$|(?<![\\$])\$([^$\n]+?)\$",
                          re.DOTALL)


def on_post_build(config) -> None:
    """Search previews show math as plain text (``β = Σ_x min(p, q)``), not as raw TeX; the
    notebook pages' shared stylesheets are written, pruned to what those pages use."""
    _write_notebook_css(Path(config["site_dir"]))
    _served_notebooks_say_how_to_install(Path(config["site_dir"]), config)
    index = Path(config["site_dir"]) / "search" / "search_index.json"
    if not index.is_file():
        return
    data = json.loads(index.read_text(encoding="utf-8"))

    def clean(text: str) -> str:
        return _SEARCH_MATH.sub(lambda m: plain_math(next(g for g in m.groups() if g is not None)),
                                text)

    for doc in data.get("docs", []):
        for key in ("title", "text"):
            if isinstance(doc.get(key), str):
                doc[key] = clean(doc[key])
    index.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _walk_nav(items):
    """Yield every (key, value) page entry of a nav, depth first."""
    for item in items or []:
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, list):
                    yield from _walk_nav(value)
                else:
                    yield key, value
        elif isinstance(item, str):
            yield None, item


def _expand_lessons(items, globs: dict[str, list]):
    """The nav with each glob entry (``globs``: glob -> its page entries) expanded in place."""
    out = []
    for item in items:
        if isinstance(item, dict):
            new = {}
            for key, value in item.items():
                if isinstance(value, str) and value in globs:
                    value = globs[value]
                elif isinstance(value, list):
                    value = _expand_lessons(value, globs)
                new[key] = value
            if any(v == [] for v in new.values()):
                continue  # no lesson yet: drop the empty section rather than break the nav
            out.append(new)
        elif isinstance(item, str) and item in globs:
            out.extend(globs[item])
        else:
            out.append(item)
    return out


def on_config(config):
    # Lessons execute in kernels started by this process: they inherit the setting.
    os.environ["TQDM_DISABLE"] = "1"
    _NOTEBOOK_CSS.clear()
    root = _root(config)
    globs = {LESSONS_GLOB: [{_lesson_title(p): f"lessons/{p.name}"} for p in _lessons(root)],
             EXERCISES_GLOB: [{_lesson_title(p): f"lessons/exercises/{p.name}"}
                              for p in _lessons(root, "lessons/exercises")]}
    if config["nav"]:
        config["nav"] = _expand_lessons(config["nav"], globs)
    return config


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _model_card(root: Path, source: str = MODEL_CARD, what: str = MODEL_CARDS[MODEL_CARD_PAGE][1],
                asset_dir: str = "model-card-assets") -> tuple[str, dict[str, Path]]:
    """A model card page's Markdown, and the images it shows (site path -> file)."""
    card = root / source
    if not card.is_file():
        text = (
            "# Model card\n\n"
            f"The model card of {what} is written next to the weights, in `{source}`, and appears "
            "on this page as soon as that file exists.\n"
        )
        return text, {}
    text = card.read_text(encoding="utf-8")
    assets: dict[str, Path] = {}

    def relative(target: str) -> bool:
        return not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target, re.IGNORECASE)

    # Images beside the card are served from model-card-assets/; a missing one becomes its alt text.
    def image(m: re.Match) -> str:
        alt, target = m.group(1), m.group(2).strip()
        if not relative(target):
            return m.group(0)
        path = (card.parent / target).resolve()
        if not path.is_file():
            return f"*[{alt or 'image'}: `{target}` not found]*"
        site_path = f"{asset_dir}/{PurePosixPath(target).as_posix().lstrip('./')}"
        assets[site_path] = path
        return f"![{alt}]({site_path})"

    # Other relative links point at files in the package, not at site pages: show them as paths.
    def link(m: re.Match) -> str:
        label, target = m.group(1), m.group(2).strip()
        if not relative(target):
            return m.group(0)
        return f"{label} (`{PurePosixPath(source).parent / target}`)"

    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", image, text)
    text = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)
    if not re.search(r"^#\s", text, re.MULTILINE):
        text = "# Model card\n\n" + text
    return text, assets


@event_priority(100)  # before mkdocs-jupyter (priority 0) turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    root = _root(config)

    for src_uri in _notebooks(root):
        if files.get_file_from_path(src_uri) is None:
            files.append(
                File(src_uri, src_dir=str(root), dest_dir=config["site_dir"],
                     use_directory_urls=config["use_directory_urls"])
            )

    for _, value in _walk_nav(config["nav"]):
        m = _API_PAGE.match(str(value))
        if not m or files.get_file_from_path(value) is not None:
            continue
        module = m.group("module")
        if _module_file(root, module) is None:
            raise PluginError(
                f"mkdocs.yml lists the API page {value!r}, but module {module!r} has no source "
                f"file under {root}. Remove the nav entry or add the module."
            )
        files.append(File.generated(config, value, content=f"# `{module}`\n\n::: {module}\n"))

    files.append(File.generated(config, SOURCE_ARCHIVE, content=source_archive(root)))

    for page, (source, what) in MODEL_CARDS.items():
        if files.get_file_from_path(page) is not None:
            continue
        text, assets = _model_card(root, source, what, page.removesuffix(".md") + "-assets")
        files.append(File.generated(config, page, content=text))
        for site_path, path in assets.items():
            files.append(File.generated(config, site_path, abs_src_path=str(path)))
    return files


#: The project's source, served with the site: the package, its lessons, tests, benchmarks and
#: this site's sources, so that a student with only the site can install and run everything.
SOURCE_ARCHIVE = "minispec-src.tar.gz"
_ARCHIVE_PARTS = ("pyproject.toml", "README.md", "mkdocs.yml", "minispec", "lessons", "tests",
                  "benchmarks", "docs")
_ARCHIVE_SKIP = re.compile(r"(?:^|/)(?:__pycache__|\.ipynb_checkpoints|\.pytest_cache|"
                           r"[^/]*\.egg-info|\.cache)(?:/|$)|\.pyc$")


def _archive_files(root: Path) -> list[str]:
    """The files of the archive, as paths from the repository root: those git tracks when the
    build runs in a git checkout (so nothing local leaks in), else every file of the parts."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *_ARCHIVE_PARTS],
                                capture_output=True, check=True, timeout=60).stdout
        names = [n for n in listed.decode("utf-8", "replace").split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = []
    if not names:
        names = [p.relative_to(root).as_posix() for part in _ARCHIVE_PARTS
                 for p in ([root / part] if (root / part).is_file()
                           else sorted((root / part).rglob("*"))) if p.is_file()]
    return [n for n in names if (root / n).is_file() and not _ARCHIVE_SKIP.search(n)]


def _version(root: Path) -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text("utf-8"),
                  re.MULTILINE)
    return m.group(1) if m else "0"


def source_archive(root: Path) -> bytes:
    """``minispec-src.tar.gz``: the repository's files under ``minispec-<version>/``, a source
    distribution pip installs as it is (``python3 -m pip install ./minispec-src.tar.gz``).
    Reproducible: sorted names, no owners, a fixed time."""
    top = f"minispec-{_version(root)}"
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(_archive_files(root)):
            info = tar.gettarinfo(str(root / name), arcname=f"{top}/{name}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o644
            with open(root / name, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def install_note(archive_href: str | None = None) -> str:
    """How to get the package a downloaded notebook imports (the first cell of every served
    notebook, and the line under each notebook page's download link)."""
    where = (f"[`{SOURCE_ARCHIVE}`]({archive_href})" if archive_href else
             f"`{SOURCE_ARCHIVE}` (linked from the home page of the site this notebook came from)")
    return (f"**To run this notebook** you need the `minispec` package. Download {where}, the "
            "project's source, then in a terminal (Python 3.10 or newer):\n\n"
            "```bash\n"
            f"tar xzf {SOURCE_ARCHIVE} && cd minispec-*/\n"
            "python3 -m venv .venv && . .venv/bin/activate\n"
            "python3 -m pip install torch==2.13.0 -e '.[real]' jupyterlab matplotlib scipy\n"
            "jupyter lab lessons/\n"
            "```\n\n"
            "The lessons and exercises are in `lessons/` and `lessons/exercises/` there; this "
            "notebook runs the same anywhere once the package is installed.")


_AUTODOC = re.compile(r"^::: ([A-Za-z_][\w.]*)\s*$", re.MULTILINE)
_LESSON_LINK = re.compile(r"\[([^\]]+)\]\((lessons/[^)\s]*\*[^)\s]*\.ipynb)\)")


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    root = _root(config)
    present = [f"lessons/{p.name}" for p in _lessons(root)]

    def resolve(m: re.Match) -> str:
        label, pattern = m.group(1), m.group(2)
        hits = [p for p in present if fnmatch.fnmatch(p, pattern)]
        if not hits:
            return f"{label} *(in preparation)*"
        target = PurePosixPath(hits[0])
        here = PurePosixPath(page.file.src_uri).parent
        rel = Path(*([".."] * len(here.parts)), target) if here.parts else target
        return f"[{label}]({rel.as_posix()})"

    markdown = _LESSON_LINK.sub(resolve, markdown)
    markdown = _PENDING_RECORD.sub(lambda m: _pending_record(m, root, config), markdown)
    # A module's page is the target of cross-references to the module itself: mkdocstrings shows
    # no root heading here, so an autorefs Markdown anchor names the place.
    return _AUTODOC.sub(lambda m: f"[](){{#{m.group(1)}}}\n\n{m.group(0)}", markdown)


_PENDING_RECORD = re.compile(r"^<!-- minispec-record: (\w+) -->[ \t]*$", re.MULTILINE)
#: What a record of docs/data/ holds, said in its place while the file is not in the repository
#: (docs/hooks/records.py renders the file once it is).
PENDING_RECORDS = {
    "gpu": (
        "*This section's record, `docs/data/gpu.json`, holds: the one-token step at each batch "
        "size with CUDA graphs on and off, against the memory roofline; the verify cost "
        "\\(r(k) = t(k + 1) / t(1)\\) at batch 1; the speedups over plain greedy on the "
        "multi-task set at batch 1; and the engine's tokens per second beside transformers' "
        "`generate`. `bash benchmarks/gpu_session.sh` writes it on a machine with a CUDA GPU; "
        "this site is built from a repository that holds none, so this section shows no "
        "numbers.*"
    ),
}


def _pending_record(m: re.Match, root: Path, config) -> str:
    """A ``<!-- minispec-record: NAME -->`` whose ``docs/data/NAME.json`` is not there: what the
    record will show, instead of a placeholder about the file."""
    name = m.group(1)
    data = Path(config["docs_dir"]) / "data"
    if (data / f"{name}.json").is_file() or name not in PENDING_RECORDS:
        return m.group(0)
    return PENDING_RECORDS[name]


_PRE = re.compile(r"(<pre\b.*?</pre>)", re.DOTALL)
_INLINE_CODE = re.compile(r"<code>([^<>]*)</code>")
_PATH = re.compile(r"^(?:[\w.-]+(?:/[\w.-]+)+/?|[\w-]+(?:\.[\w-]+)*\.(?:py|md|json|txt|cpp|cu|h))$")
# A code span that is really a formula: single-letter symbols with subscripts, as docstrings write
# them (``f_{t-1}``, ``(f_j, x_{j+1})``, ``f'_t``); never an identifier (``input_ids``).
_TEX_CODE = re.compile(r"^[\s\w'(),.\[\]{}+\-/=^|]*$")


_MATH_WORDS = {"min": r"\min", "max": r"\max", "sum": r"\sum", "prod": r"\prod", "log": r"\log",
               "exp": r"\exp", "norm": r"\operatorname{norm}", "argmax": r"\operatorname{argmax}"}
_MATH_WORD = re.compile(r"\b(" + "|".join(_MATH_WORDS) + r")\b")


def _texish(code: str) -> bool:
    """A formula in TeX notation: single-letter symbols with subscripts, and math words only."""
    if "_" not in code or not _TEX_CODE.match(code):
        return False
    if re.search(r"[A-Za-z]{2}", _MATH_WORD.sub(" ", code)):
        return False
    return bool(re.search(r"(?<![A-Za-z])[A-Za-z]'?_(?:\{[^{}]+\}|[A-Za-z0-9])", code))


def _tex(code: str) -> str:
    tex = _MATH_WORD.sub(lambda m: _MATH_WORDS[m.group(1)], code.replace("..", r"\dots "))
    return f'<span class="arithmatex">\\({html.escape(tex, quote=False)}\\)</span>'


def _outside_pre(output: str, fn) -> str:
    """Apply ``fn`` to the parts of ``output`` outside ``<pre>`` blocks (code listings)."""
    parts = _PRE.split(output)
    return "".join(part if i % 2 else fn(part) for i, part in enumerate(parts))


def _dashes(part: str) -> str:
    """Running text (not code) of a docstring: `` -- `` becomes an en dash, and reST's ``::``
    before a literal block a colon."""
    pieces = re.split(r"(<code\b.*?</code>|<[^>]+>)", part, flags=re.DOTALL)
    text = [p if i % 2 else re.sub(r"(?<=\s)--(?=\s)", "\u2013", p) for i, p in enumerate(pieces)]
    return re.sub(r"(?<=\w)::(?=\s*</p>)", ":", "".join(text))


def on_page_content(html_text: str, page, config, files: Files) -> str:
    """File paths wrap only at their separators; on API pages, docstring TeX in code spans is set
    as math and `` -- `` as a dash. A notebook page starts with a link to download its notebook
    (``include_source`` serves it beside the page)."""
    if page.file.src_uri.endswith(".ipynb"):
        name = Path(page.file.src_uri).name
        archive = posixpath.relpath(SOURCE_ARCHIVE, posixpath.dirname(page.file.dest_uri) or ".")
        return (f'<p class="ms-download"><a href="{name}" download>Download this notebook '
                f"({name})</a> to run it yourself, with the package it imports: "
                f'<a href="{archive}" download>{SOURCE_ARCHIVE}</a>, the project\'s source '
                f"(<code>python3 -m pip install torch==2.13.0 ./{SOURCE_ARCHIVE}</code>; the "
                "notebook's first cell says more)</p>\n" + html_text)
    api = page.file.src_uri.startswith("api/")

    def code(m: re.Match) -> str:
        text = html.unescape(m.group(1))
        if api and _texish(text):
            return _tex(text)
        if _PATH.match(text):
            return '<code class="ms-path">' + m.group(1).replace("/", "/<wbr>") + "</code>"
        return m.group(0)

    def fix(part: str) -> str:
        part = _INLINE_CODE.sub(code, part)
        return _dashes(part) if api else part

    return _outside_pre(html_text, fix)


_MATHJAX2 = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.DOTALL)
_MERMAID = re.compile(r"<script type=\"module\">(?:(?!</script>).)*?mermaid"
                      r"(?:(?!</script>).)*?</script>", re.DOTALL)


_CELL_ID = re.compile(r'id="cell-id=([^"]+)"')
_DEFAULT_ALT = 'alt="No description has been provided for this image"'


def _figure_alts(notebook: Path) -> dict[str, list[str]]:
    """Cell id -> the alt texts of its figures (code cell metadata ``alt``)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return {}
    alts = {}
    for cell in cells:
        alt = cell.get("metadata", {}).get("alt")
        if cell.get("cell_type") == "code" and alt and cell.get("id"):
            alts[cell["id"]] = [alt] if isinstance(alt, str) else list(alt)
    return alts


def _with_alt_text(output: str, notebook: Path) -> str:
    """Replace nbconvert's placeholder alt text with the cell's own description of its figures.

    A lesson describes what each figure shows in its code cell's metadata (``"alt": "..."``, or a
    list with one text per figure, in order); the page's cells carry the notebook's cell ids.
    """
    alts = _figure_alts(notebook)
    if not alts:
        return output
    parts = _CELL_ID.split(output)  # [before, id1, html1, id2, html2, ...]
    for i in range(1, len(parts), 2):
        for text in alts.get(parts[i], []):
            escaped = text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
            parts[i + 1] = parts[i + 1].replace(_DEFAULT_ALT, f'alt="{escaped}"', 1)
        parts[i] = f'id="cell-id={parts[i]}"'
    return "".join(parts)


def on_page_context(context, page, config, nav):
    # mkdocs-jupyter titles a lesson page with its notebook's first heading, TeX included; the
    # browser tab and the nav show the plain-text form.
    if page.file.src_uri.endswith(".ipynb") and page.title:
        page.title = plain_title(str(page.title))
    return context


# a download link (``download`` attribute) keeps pointing at the notebook file itself
_NOTEBOOK_HREF = re.compile(r'href="(?!https?:|/)([^"#]+\.ipynb)(#[^"]*)?"(?! download)')


def _site_href(m: re.Match, src_uri: str) -> str:
    """A notebook's link to another notebook (``../01_x.ipynb``, ``exercises/01_y.ipynb``, as it
    works in Jupyter) becomes the link to that notebook's page on the site."""
    here = posixpath.dirname(src_uri)
    target = posixpath.normpath(posixpath.join(here, m.group(1))).removesuffix(".ipynb") + "/"
    page_dir = src_uri.removesuffix(".ipynb") + "/"            # the page's own URL (a directory)
    return f'href="{posixpath.relpath(target, page_dir)}/{m.group(2) or ""}"'


def on_post_page(output: str, page, config) -> str:
    output = _search_on_demand(output)
    if not page.file.src_uri.endswith(".ipynb"):
        return output if _has_math(output) else _without_mathjax(output)
    if not _notebook_has_math(page):
        output = _without_mathjax(output)
    output = _shared_notebook_css(output, page)
    output = _MATHJAX2.sub("", output)
    output = _MERMAID.sub("", output)
    output = _NOTEBOOK_HREF.sub(lambda m: _site_href(m, page.file.src_uri), output)
    if page.file.abs_src_path:
        output = _with_alt_text(output, Path(page.file.abs_src_path))
    return output



# --- Page weight ---------------------------------------------------------------------------------

_BUNDLE = re.compile(r'<script src="([^"]*)assets/javascripts/bundle\.[0-9a-f]+\.min\.js"')
_MATHJAX3 = re.compile(r'\s*<script src="[^"]*assets/mathjax/tex-chtml\.js"></script>')
# What MathJax typesets: arithmatex's spans and divs on Markdown pages; $...$, $$...$$, \(...\)
# and \[...\] in a notebook's Markdown cells and Markdown or LaTeX outputs.
_NOTEBOOK_MATH = re.compile(r"\$[^$\s]|\\\(|\\\[|\\begin\{")


def _search_on_demand(output: str) -> str:
    """The script that holds back the search index until the search box is used, loaded just
    before material's bundle (which asks for the index as soon as it starts)."""
    return _BUNDLE.sub(lambda m: f'<script src="{m.group(1)}javascripts/search-on-demand.js">'
                       f"</script>\n    {m.group(0)}", output, count=1)


def _has_math(output: str) -> bool:
    return 'class="arithmatex"' in output


def _notebook_has_math(page) -> bool:
    """Whether a notebook's Markdown cells or rich outputs hold math for MathJax."""
    try:
        cells = json.loads(Path(page.file.abs_src_path).read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return True  # cannot tell: keep MathJax
    texts = []
    for cell in cells:
        src = cell.get("source", "")
        if cell.get("cell_type") == "markdown":
            texts.append("".join(src) if isinstance(src, list) else src)
        for out in cell.get("outputs", []):
            for mime in ("text/markdown", "text/latex", "text/html"):
                data = out.get("data", {}).get(mime)
                if data:
                    texts.append("".join(data) if isinstance(data, list) else data)
    return any(_NOTEBOOK_MATH.search(t) for t in texts)


def _without_mathjax(output: str) -> str:
    """A page with no math loads no MathJax (javascripts/mathjax-config.js then marks the page
    typeset by itself)."""
    return _MATHJAX3.sub("", output)


#: Notebook stylesheets of this build: file name -> its CSS and what the pages that use it need.
_NOTEBOOK_CSS: dict[str, dict] = {}
_STYLE = re.compile(r"\s*<style\b[^>]*>(.*?)</style>", re.DOTALL)
_CLASS_ATTR = re.compile(r'\bclass="([^"]*)"')
_VAR_REF = re.compile(r"var\(\s*(--[\w-]+)")


def _shared_notebook_css(output: str, page) -> str:
    """Move the stylesheets nbconvert inlines into a notebook page to one shared file.

    Every ``<style>`` in the page's body is notebook CSS (pygments, JupyterLab's theme, Mermaid);
    mkdocs-jupyter also prints a Python list of the pygments CSS into one, which is no CSS at all
    and is dropped. The page links the shared file at the end of its head, after the site's own
    stylesheets, where the inline copies applied.
    """
    head, sep, body = output.partition("<body")
    if not sep:
        return output
    sheets = [m.group(1) for m in _STYLE.finditer(body)]
    if not sheets:
        return output
    css = "\n".join(t for t in sheets if not t.lstrip().startswith("["))
    name = f"assets/stylesheets/notebook-{hashlib.sha256(css.encode()).hexdigest()[:8]}.css"
    body = _STYLE.sub("", body)
    entry = _NOTEBOOK_CSS.setdefault(name, {"css": css, "classes": set(), "refs": set()})
    for m in _CLASS_ATTR.finditer(body):
        entry["classes"].update(m.group(1).split())
    entry["refs"].update(_VAR_REF.findall(body))
    href = posixpath.relpath(name, posixpath.dirname(page.file.dest_uri) or ".")
    head = head.replace("</head>", f'  <link rel="stylesheet" href="{href}">\n  </head>', 1)
    return head + sep + body


# Classes that scripts add after load (material, MathJax, the site's own) are never pruned.
_RUNTIME_CLASS = re.compile(r"^(?:md-|ms-|minispec-|MathJax|mjx-|focus-|js$|no-js$)")
_CSS_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")


def _css_blocks(css: str) -> list[tuple[str, str | None]]:
    """A stylesheet's top-level (prelude, body) pairs; the body is None for a statement
    (``@charset "UTF-8";``). Strings and nested blocks (``@media``) are skipped over whole."""
    out, i, n = [], 0, len(css)

    def skip_string(j: int) -> int:
        quote, j = css[j], j + 1
        while j < n and css[j] != quote:
            j += 2 if css[j] == "\\" else 1
        return j + 1

    while i < n:
        j = i
        while j < n and css[j] not in "{;":
            j = skip_string(j) if css[j] in "\"'" else j + 1
        if j >= n:
            break
        if css[j] == ";":
            out.append((css[i:j].strip(), None))
            i = j + 1
            continue
        depth, k = 0, j
        while k < n:
            if css[k] in "\"'":
                k = skip_string(k)
                continue
            depth += {"{": 1, "}": -1}.get(css[k], 0)
            if depth == 0:
                break
            k += 1
        out.append((css[i:j].strip(), css[j + 1:k]))
        i = k + 1
    return out


def _selectors(prelude: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for c in prelude:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def prune_css(css: str, classes: set[str]) -> str:
    """The rules of ``css`` that can match markup using only ``classes``: a selector naming a
    class no page uses (JupyterLab's editors, toolbars, widgets) is dropped, a rule with no
    selector left goes, and so does an ``@media`` block left empty. Other at-rules stay whole."""
    out = []
    for prelude, body in _css_blocks(css):
        if body is None:
            out.append(prelude + ";")
        elif prelude.startswith(("@media", "@supports")):
            inner = prune_css(body, classes)
            if inner.strip():
                out.append(f"{prelude}{{{inner}}}")
        elif prelude.startswith("@"):
            out.append(f"{prelude}{{{body}}}")
        else:
            keep = [sel for sel in _selectors(prelude)
                    if all(c in classes or _RUNTIME_CLASS.match(c)
                           for c in _CSS_CLASS.findall(re.sub(r":not\([^()]*\)", "", sel)))]
            if keep:
                out.append(f"{','.join(keep)}{{{body}}}")
    return "".join(out)


_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_CUSTOM_PROPERTY = re.compile(r"(?<=[{;])\s*(--[\w-]+)\s*:(?:url\([^)]*\)|[^;{}])*(?:;|(?=}))")
_EMPTY_RULE = re.compile(r"(?<=[{}])[^{}@]+\{\s*\}")


def drop_unused_properties(css: str, refs: set[str]) -> str:
    """``css`` without the custom properties (``--jp-icon-add: url(data:...)``) that nothing
    reads: not ``css`` itself once pruned, nor ``refs`` (the pages and the site's other
    stylesheets). Repeated until nothing changes, since properties read one another."""
    while True:
        used = set(_VAR_REF.findall(css)) | refs
        new = _CUSTOM_PROPERTY.sub(lambda m, used=used: m.group(0) if m.group(1) in used else "",
                                   css)
        new = _EMPTY_RULE.sub("", new)
        if new == css:
            return css
        css = new


def _write_notebook_css(site: Path) -> None:
    if not _NOTEBOOK_CSS:
        return
    others = [p for p in (site / "assets" / "stylesheets").glob("*.css")
              if not p.name.startswith("notebook-")]
    others += list((site / "stylesheets").glob("*.css"))
    refs = set()
    for sheet in others:
        refs.update(_VAR_REF.findall(sheet.read_text(encoding="utf-8", errors="replace")))
    for name, entry in _NOTEBOOK_CSS.items():
        css = _CSS_COMMENT.sub("", entry["css"])   # pygments names each rule in a comment
        css = drop_unused_properties(prune_css(css, entry["classes"]), refs | entry["refs"])
        target = site / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(css, encoding="utf-8")
        log.info("notebook stylesheet %s: %d -> %d bytes", name, len(entry["css"]), len(css))


def on_post_template(output: str, template_name: str, config) -> str:
    """The 404 page, rendered from a template rather than a page, is as light as the others."""
    if template_name != "404.html":
        return output
    output = _search_on_demand(output)
    return output if _has_math(output) else _without_mathjax(output)



def _served_notebooks_say_how_to_install(site: Path, config) -> None:
    """Each notebook served for download (``include_source``) starts with a Markdown cell that
    says how to install the package it imports; the notebooks in the repository are unchanged."""
    base = (config.get("site_url") or "").rstrip("/")
    href = f"{base}/{SOURCE_ARCHIVE}" if base else None
    for path in sorted((site / "lessons").rglob("*.ipynb")):
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        note = install_note(href)
        cells = nb.setdefault("cells", [])
        if cells and "".join(cells[0].get("source", "")).startswith(note[:30]):
            continue
        cell = {"cell_type": "markdown", "metadata": {}, "source": note.splitlines(keepends=True)}
        if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
            cell["id"] = "minispec-install"      # cell ids exist from nbformat 4.5 on
        cells.insert(0, cell)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
