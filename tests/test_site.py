r"""The teaching site: built with ``mkdocs build --strict`` and checked in a real headless browser.

The build executes every lesson (a failing lesson fails the build). The built site is served on
127.0.0.1 and the home page, the API pages and every lesson page are opened in Debian's Chromium
through Playwright, in a 1400 px wide window, as a student would read them. Every request to
anything but the local server is aborted and fails the test: the site must work with no network.

On each page the math must be typeset by the site's own MathJax, with its fonts loaded and applied,
no raw TeX may be left in the text, and the console must stay free of errors. What a student sees
is checked too, so that these cannot come back:

* no code cell, output or table is clipped: whatever is wider than the column scrolls inside its
  own box, the page itself never scrolls sideways, and at most a few code cells of a lesson need
  that scroll (the rest fit the column);
* every plot is drawn at no less than ``MIN_FIGURE_SCALE`` of its natural width (so 10-point
  labels stay about 10 px tall or more), can be clicked to see it full size, and has alt text
  that is not nbconvert's placeholder;
* no warning (``TqdmWarning``, "IProgress not found"), object repr (``<torch._C.Generator at
  0x...>``) or machine path (``site-packages``, ``/root/``) appears in the text, and no ``\_``
  is typeset literally inside ``\text{...}`` in an equation;
* every entry of the table of contents points at an anchor that exists, and tab titles hold no TeX;
* no lesson shows a stderr block (progress bars, log lines), and no teaching page speaks of the
  project's own history ("third wave", "issue 12", "the 1.8x goal").

Every page except the API reference is opened a second time in a 390 px wide window (a phone):
the page itself must not scroll sideways there either; wide code, tables and math scroll inside
their own box (no inline formula runs past the column's edge, no display equation past the page's,
and a wide table keeps its rows and columns in a box that scrolls, docs/javascripts/tables.js),
and every figure shown smaller than drawn says under it how to see it full size (zoom.js). A
window narrowed to 390 px and widened again leaves every table styled as before (no ``class=""``
that drops material's borders); a tapped figure opens at its natural width on a phone.

Every text colour in the widgets, in every state a student steps them through (buttons hovered
and focused included), reads at 4.5:1 or more against what it is drawn on (WCAG AA).

The two interactive figures are driven like a student would: the round widget advances on "Next"
and then shows exactly the drafts, verdicts and tokens of ``assets/data/rounds.json``; moving the
speedup explorer's slider changes the predicted speedup in the readout a reader sees to what the
formula gives, at 1400 and at 390 px. "Next" at the
foot of the last lesson leads to the Results page, not into the API reference.

The lessons are executed exactly once per test run, by this build (mkdocs-jupyter with
``allow_errors: false``; the README's test command keeps ``pytest --nbmake`` off the numbered
lessons). A lesson whose assert fails fails the build, and the test shows that lesson's failing
cell and its traceback first.

The API pages are checked in the HTML: every ``Returns:`` section is one row with a type, never
split into bogus "name: type" rows, and no Sphinx role (``:class:``) is printed.

Screenshots of every page (desktop and phone width) are taken only when ``MINISPEC_SCREENSHOTS``
names a folder for them: they are for a person looking into a failure, and taking them is about a
third of the browser test's time. The widgets' screenshots go to a temporary folder otherwise.
Without Chromium or Playwright the browser test is skipped, unless ``MINISPEC_REQUIRE_BROWSER=1``
(set by CI), which turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# one xdist worker runs every check of the site (``--dist loadgroup``); it is built once either way
pytestmark = [pytest.mark.site, pytest.mark.xdist_group("site")]

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 30 * 60
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Any host name other than the local server fails to resolve: nothing external can load.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
API_PAGE = "api/minispec.core.speculative/index.html"
VIEWPORT = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}
# Pages beyond home, results and the lessons that a student reads (each must exist).
TEACHING_PAGES = ("learning-path/index.html", "round/index.html", "speedup/index.html",
                  "glossary/index.html", "going-further/index.html", "architecture/index.html",
                  "model-card/index.html", "model-card-eagle/index.html")
# A figure may be drawn smaller than its natural size down to this factor: matplotlib's 10-point
# labels are 13.9 px at 100 dpi, so they stay at about 10 px or more.
MIN_FIGURE_SCALE = 0.72
# At most this share of a lesson's code cells may need a sideways scroll (long strings); the rest
# must fit the column.
MAX_SCROLLING_CODE_SHARE = 0.15


def _browser_required() -> bool:
    return os.environ.get("MINISPEC_REQUIRE_BROWSER", "") == "1"


def _skip_or_fail(reason: str) -> None:
    if _browser_required():
        pytest.fail(f"{reason} (MINISPEC_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


def _chromium() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@pytest.fixture(scope="module")
def site(once_per_run) -> Path:
    """Build the site once per test run into a temporary directory; return the directory.

    Every xdist worker that runs these tests gets the one build (``tests/once.py``: a file lock in
    a folder the run's workers share), whether or not ``--dist loadgroup`` kept them together.
    ``MINISPEC_SITE=<dir>`` checks a site already built there instead (e.g. by the CI step that
    publishes it), so the lessons are not executed twice.
    """
    prebuilt = os.environ.get("MINISPEC_SITE")
    if prebuilt:
        folder = Path(prebuilt)
        assert (folder / "index.html").is_file(), f"MINISPEC_SITE={prebuilt} holds no built site"
        return folder
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        _skip_or_fail("mkdocs is not installed (pip install -e '.[docs]')")
    return once_per_run("site", _build) / "site"


def _build(folder: Path) -> None:
    """``mkdocs build --strict`` into ``folder / "site"``; a failed build fails with its log."""
    out = folder / "site"
    env = dict(os.environ)
    env["TQDM_DISABLE"] = "1"
    env["NO_MKDOCS_2_WARNING"] = "1"
    # Lessons run against this checkout, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    start = time.monotonic()             # for the log only: no test asserts on a duration
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
    )
    elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed after {elapsed:.0f} s.\n{_lesson_failure(log)}"
                    f"\n--- end of the build log ---\n{log[-6000:]}", pytrace=False)
    print(f"site built in {elapsed:.1f} s")


def test_the_site_is_built_once_per_run(site: Path):
    """However the site's tests were spread over xdist workers, one of them built it."""
    if os.environ.get("MINISPEC_SITE"):
        pytest.skip("MINISPEC_SITE: a site built before the run")
    from once import builds

    assert len(builds(site.parent)) == 1, builds(site.parent)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lesson_failure(log: str) -> str:
    """The failing lesson and cell, when a lesson's assert stopped the build (else "")."""
    log = _ANSI.sub("", log)
    at = log.find("CellExecutionError: An error occurred while executing the following cell")
    if at < 0:
        return ""
    lessons = re.findall(r"Converting notebook \(execute=\w+\): (\S+)", log[:at])
    where = f"lesson {Path(lessons[-1]).name}" if lessons else "a lesson"
    return f"{where} failed; its failing cell and traceback:\n{log[at:at + 6000]}"


_EXTERNAL_TAG = re.compile(
    r"<(script|link|img|iframe|source|audio|video|embed|object)\b[^>]*?"
    r"\b(?:src|href|data|srcset)\s*=\s*[\"']?\s*((?:https?:)?//[^\"'\s>]+)",
    re.IGNORECASE,
)
_EXTERNAL_CSS = re.compile(r"url\(\s*[\"']?\s*((?:https?:)?//[^)\"']+)", re.IGNORECASE)


def test_built_html_loads_nothing_external(site: Path):
    """No script, stylesheet, image or frame in any page points outside the site."""
    offenders = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        for m in _EXTERNAL_TAG.finditer(text):
            offenders.append(f"{page.relative_to(site)}: <{m.group(1)}> {m.group(2)}")
    for sheet in sorted(site.rglob("*.css")):
        for m in _EXTERNAL_CSS.finditer(sheet.read_text(encoding="utf-8", errors="replace")):
            offenders.append(f"{sheet.relative_to(site)}: url({m.group(1)})")
    assert not offenders, "external resources referenced:\n" + "\n".join(offenders[:50])
    assert (site / "assets/mathjax/tex-chtml.js").is_file(), "MathJax is not served by the site"


def _lesson_pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in (site / "lessons").glob("*/index.html"))


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@pytest.fixture(scope="module")
def server(site: Path):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    if chromium is None:
        _skip_or_fail("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip_or_fail("the playwright Python package is not installed")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def screenshot_dir() -> Path:
    default = Path(tempfile.gettempdir()) / "minispec-screenshots"
    folder = Path(os.environ.get("MINISPEC_SCREENSHOTS", default))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# Runs in the page once math is typeset: counts, glyph styling, leftover TeX, images.
_INSPECT_JS = r"""
() => {
  const article = document.querySelector("article") || document.body;
  const glyphs = [...article.querySelectorAll("mjx-c")].slice(0, 400);
  // Invisible operators (function application U+2061, invisible times, zero-width space...) are
  // drawn as empty content; every other glyph needs its character and a MathJax font.
  const invisible = /\bmjx-c20(?:0[0-9A-F]|6[0-4])\b/;
  const styled = glyphs.filter((el) => {
    const before = getComputedStyle(el, "::before");
    const content = before.content;
    const hasContent = content && content !== "none" && content !== "normal"
      && (content !== '""' || invisible.test(el.className));
    return hasContent && /MJX/.test(before.fontFamily);
  });
  const mjxFonts = [...document.fonts].filter((f) => /MJX/.test(f.family));
  const containers = [...article.querySelectorAll("mjx-container")];
  const clone = article.cloneNode(true);
  // Code (cell inputs, stdout, highlighted blocks) may hold TeX-looking text; prose may not.
  clone.querySelectorAll("pre, code, mjx-container, script, style, .highlight, .highlight-ipynb, "
    + ".jp-CodeCell .jp-InputArea, .clipboard-copy-txt, .headerlink, .anchor-link")
    .forEach((el) => el.remove());
  const text = clone.textContent;
  const rawTex = [];
  for (const re of [/\\[A-Za-z]+/g, /\$\$[^$]+\$\$/g, /\$[^$\s][^$]*\$/g, /\\[()\[\]]/g]) {
    for (const m of text.matchAll(re)) rawTex.push(m[0].slice(0, 80));
  }
  const images = [...article.querySelectorAll(".jp-OutputArea-output img, .jp-RenderedImage img")];

  // --- what a student sees ---
  const describe = (el) => (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 60);
  const scrolls = (el) => /auto|scroll/.test(getComputedStyle(el).overflowX);
  const inScrollBox = (el) => {
    for (let node = el; node && node !== article.parentElement; node = node.parentElement) {
      if (scrolls(node) && node.scrollWidth > node.clientWidth + 1) return true;
    }
    return false;
  };
  // Wider than its box and not inside a box that scrolls: its right side is cut off.
  const boxes = [...article.querySelectorAll(
    "pre, table, .jp-OutputArea-output, .jp-InputArea-editor, .highlight, " +
    "mjx-container[display='true']")];
  const clipped = boxes.filter((el) => el.scrollWidth > el.clientWidth + 1 && !inScrollBox(el))
    .map(describe);
  // A table must fit the column even where its box would scroll: a column out of sight is lost.
  const right = article.getBoundingClientRect().right;
  const wideTables = [...article.querySelectorAll("table")]
    .filter((t) => t.getBoundingClientRect().right > right + 1 || t.scrollWidth > t.clientWidth + 1)
    .map(describe);
  // A table wider than the column must sit in a box that scrolls (a phone: tables.js).
  const unscrolledTables = [...article.querySelectorAll("table")]
    .filter((t) => t.getBoundingClientRect().right > right + 1 && !inScrollBox(t))
    .map(describe);
  // Display math: inside the column, and scrolling in its own box where it is wider.
  const vw = document.documentElement.clientWidth;
  const displayOut = [...article.querySelectorAll("mjx-container[display='true']")]
    .filter((m) => m.getBoundingClientRect().right > Math.min(right, vw) + 1 ||
      (m.scrollWidth > m.clientWidth + 1 && !scrolls(m)))
    .map((m) => (m.getAttribute("aria-label") || describe(m)).slice(0, 60));
  // A figure shown smaller than drawn says, under it, that a tap or click shows it full size.
  const hintless = [...article.querySelectorAll("img.minispec-zoomable")]
    .filter((img) => img.naturalWidth > 0 &&
      img.getBoundingClientRect().width < img.naturalWidth - 1)
    .filter((img) => {
      const next = img.nextElementSibling;
      return !(next && next.classList.contains("minispec-zoom-hint") &&
               next.getBoundingClientRect().height > 0 && /full size/.test(next.textContent));
    }).map((img) => (img.getAttribute("alt") || "").slice(0, 50));
  // Inline math past the column's edge, not in a box that scrolls: the formula's end is lost.
  const mathOut = [...article.querySelectorAll("mjx-container:not([display='true'])")]
    .filter((m) => m.getBoundingClientRect().right > right + 1 && !inScrollBox(m))
    .map((m) => (m.getAttribute("aria-label") || describe(m)).slice(0, 60));
  const pageScroll = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  const codeCells = [...article.querySelectorAll(".jp-CodeCell .jp-InputArea pre")];
  const scrollingCode = codeCells.filter((el) => {
    for (let node = el; node && node !== article; node = node.parentElement) {
      if (node.scrollWidth > node.clientWidth + 1) return true;
    }
    return false;
  }).map(describe);
  const figures = [...article.querySelectorAll(".jp-OutputArea-output img, .jp-RenderedImage img, "
    + "img.minispec-figure")].map((img) => ({
      natural: img.naturalWidth,
      shown: Math.round(img.getBoundingClientRect().width),
      zoomable: img.classList.contains("minispec-zoomable"),
      alt: img.getAttribute("alt") || "",
    }));
  const smallFigures = figures.filter((f) => f.natural > 0 && f.shown < 0.72 * f.natural);
  const unzoomable = figures.filter((f) => f.shown < f.natural && !f.zoomable);
  const noAlt = figures.filter((f) => f.alt.trim().length < 10 || /No description/.test(f.alt));
  // Leaks: the text a student reads, outputs included; code as written (cell inputs, signatures,
  // code blocks of the prose) may name warnings on purpose.
  const shown = article.cloneNode(true);
  shown.querySelectorAll(".jp-Cell-inputWrapper, .doc-signature, script, style, " +
                         ".clipboard-copy-txt")
    .forEach((el) => el.remove());
  [...shown.querySelectorAll(".highlight")].filter((el) => !el.closest(".jp-OutputArea"))
    .forEach((el) => el.remove());
  const fullText = shown.textContent;
  const leaks = [];
  for (const re of [/\b[A-Z][a-z]\w*Warning\b[^\n]{0,60}/g, /IProgress not found[^\n]{0,40}/g,
                    /<[\w.]+(?: object)? at 0x[0-9a-f]+>/g, /\bobject at 0x[0-9a-f]+/g,
                    /site-packages[^\s]{0,40}/g,
                    /(?:^|[\s'"(])\/(?:root|home|tmp|usr)\/[^\s'")]{0,40}/g]) {
    for (const m of fullText.matchAll(re)) leaks.push(m[0].trim().slice(0, 80));
  }
  // \_ inside \text{...}: MathJax prints it literally there.
  const escapedUnderscores = [];
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      const m = /\\(?:text|texttt|textrm|mathrm|operatorname)\w*\{[^{}]*\\_[^{}]*\}/
        .exec(item.math);
      if (m) escapedUnderscores.push(m[0].slice(0, 60));
    }
  }
  const stderr = [...article.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map((el) => (el.textContent || "").trim().slice(0, 80));
  const history = [];  // tests/test_no_history.py's wave, issue and goal patterns, on all text
  for (const re of [/\b(?:first|second|third|fourth|fifth|next|this) waves?\b/gi,
                    /\bwaves? of (?:work|changes)\b/gi,
                    /\bissue \d{1,3}\b/gi, /\b\d+(?:\.\d+)?x goal\b/gi, /\bgoal set for\b/gi,
                    /\bis committed yet\b/gi, /\bno \w+ run is recorded yet\b/gi,
                    /\ban earlier (?:head|policy|drafter|version|model)\b/gi,
                    /\bother than the shipped (?:one|ones)\b/gi]) {
    for (const m of fullText.matchAll(re)) history.push(m[0]);
  }
  const tocTargets = [...document.querySelectorAll(".md-nav--secondary a[href^='#']")]
    .map((a) => decodeURIComponent(a.getAttribute("href").slice(1)));
  const deadToc = tocTargets.filter((id) => !document.getElementById(id));
  return {
    clipped: clipped.slice(0, 10),
    wideTables: wideTables.slice(0, 10),
    unscrolledTables: unscrolledTables.slice(0, 10),
    displayOut: displayOut.slice(0, 10),
    hintless: hintless.slice(0, 10),
    mathOut: mathOut.slice(0, 10),
    pageScroll: pageScroll,
    codeCells: codeCells.length,
    scrollingCode: scrollingCode.slice(0, 20),
    figures: figures.map((f) => [f.natural, f.shown]),
    smallFigures: smallFigures.map((f) => `${f.shown}/${f.natural} px: ${f.alt.slice(0, 50)}`),
    unzoomable: unzoomable.length,
    noAlt: noAlt.length,
    leaks: leaks.slice(0, 10),
    escapedUnderscores: escapedUnderscores,
    deadToc: deadToc,
    stderr: stderr,
    history: history,
    title: document.title,
    mathState: document.body.getAttribute("data-math"),
    containers: containers.length,
    emptyContainers: containers.filter((c) => c.getBoundingClientRect().width <= 0).length,
    merrors: article.querySelectorAll("mjx-merror").length,
    glyphs: glyphs.length,
    styledGlyphs: styled.length,
    mjxFontsLoaded: mjxFonts.filter((f) => f.status === "loaded").map((f) => f.family),
    mjxFontsFailed: mjxFonts.filter((f) => f.status === "error").map((f) => f.family),
    rawTex: rawTex.slice(0, 20),
    images: images.length,
    brokenImages: images.filter((i) => !i.complete || i.naturalWidth === 0).length,
    imageWidths: images.map((i) => i.naturalWidth),
  };
}
"""


def _open_and_inspect(browser, base_url: str, path: str, shot: Path | None,
                      viewport: dict | None = None, idle: bool = False) -> dict:
    """Open ``path``, wait for math and fonts, screenshot (unless ``shot`` is None), return the
    page's report.

    A page's own resources (scripts, styles, images) are in by its ``load`` event, MathJax's
    components by ``data-math`` and its fonts by ``document.fonts.ready``. With ``idle`` the page
    also waits for the network to go quiet (half a second without a request): the late requests
    every page makes alike (the search index) are checked so, on the home page, once per width.
    """
    host = urlsplit(base_url).netloc
    external: list[str] = []
    console_errors: list[str] = []
    failed: list[str] = []

    context = browser.new_context(viewport=viewport or VIEWPORT)

    def route(r):
        if urlsplit(r.request.url).netloc == host:
            r.continue_()
        else:
            external.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("response",
            lambda r: failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
    try:
        page.goto(base_url + path, wait_until="load")
        page.wait_for_function("() => document.body.hasAttribute('data-math')", timeout=60_000)
        page.evaluate("() => document.fonts.ready.then(() => true)")
        if idle:
            page.wait_for_load_state("networkidle")
        # Folded helper code (docs/javascripts/fold.js) is checked as a reader who opens it sees
        # it, then folded again for the screenshot, as the page is first shown.
        page.evaluate("() => document.querySelectorAll('details.ms-fold')"
                      ".forEach((d) => { d.open = true; })")
        report = page.evaluate(_INSPECT_JS)
        page.evaluate("() => document.querySelectorAll('details.ms-fold')"
                      ".forEach((d) => { d.open = false; })")
        report["folded"] = page.evaluate(
            "() => document.querySelectorAll('details.ms-fold').length")
        if shot is not None:
            page.screenshot(path=str(shot), full_page=True)
    finally:
        context.close()
    report.update(external=external, console_errors=console_errors, failed=failed)
    return report


def _check(report: dict, where: str, *, needs_math: bool = True,
           needs_images: bool = False) -> None:
    assert not report["external"], f"{where}: requests outside the site: {report['external']}"
    assert not report["failed"], f"{where}: failed requests: {report['failed']}"
    assert not report["console_errors"], f"{where}: console errors: {report['console_errors']}"
    assert report["mathState"] == "typeset", f"{where}: MathJax did not finish: {report}"
    if needs_math:
        assert report["containers"] > 0, f"{where}: no math was typeset"
    assert report["merrors"] == 0, f"{where}: MathJax reported TeX errors"
    assert report["emptyContainers"] == 0, (
        f"{where}: {report['emptyContainers']} math boxes have no width"
    )
    assert report["styledGlyphs"] == report["glyphs"], (
        f"{where}: {report['glyphs'] - report['styledGlyphs']} of {report['glyphs']} glyphs lack "
        "the MathJax font or content (math would look blank)"
    )
    if report["containers"]:
        assert report["glyphs"] > 0, f"{where}: math boxes hold no glyphs"
        assert report["mjxFontsLoaded"], f"{where}: no MathJax web font loaded"
    assert not report["mjxFontsFailed"], (
        f"{where}: MathJax fonts failed: {report['mjxFontsFailed']}"
    )
    assert not report["rawTex"], f"{where}: raw TeX left in the text: {report['rawTex']}"
    assert report["brokenImages"] == 0, f"{where}: {report['brokenImages']} images did not load"
    if needs_images:
        assert report["images"] > 0, f"{where}: no plot images"
    _check_student_view(report, where)


def _check_student_view(report: dict, where: str) -> None:
    """What a student sees at 1400 px: nothing cut off, legible figures, no leaks, live anchors."""
    assert not report["clipped"], f"{where}: content cut off on the right: {report['clipped']}"
    assert not report["wideTables"], (
        f"{where}: tables wider than the column: {report['wideTables']}"
    )
    assert not report["displayOut"], f"{where}: equations overflow: {report['displayOut']}"
    assert not report["hintless"], (
        f"{where}: shrunk figures without a 'full size' hint: {report['hintless']}"
    )
    assert report["pageScroll"] <= 1, (
        f"{where}: the page scrolls sideways by {report['pageScroll']} px"
    )
    if report["codeCells"]:
        share = len(report["scrollingCode"]) / report["codeCells"]
        assert share <= MAX_SCROLLING_CODE_SHARE, (
            f"{where}: {len(report['scrollingCode'])} of {report['codeCells']} code cells are "
            f"wider than the column: {report['scrollingCode']}"
        )
    assert not report["smallFigures"], (
        f"{where}: figures shrunk below {MIN_FIGURE_SCALE:.0%} of their natural width (labels "
        f"would be under 10 px): {report['smallFigures']}"
    )
    assert report["unzoomable"] == 0, (
        f"{where}: {report['unzoomable']} shrunk figures cannot be zoomed"
    )
    assert report["noAlt"] == 0, f"{where}: {report['noAlt']} figures without a description (alt)"
    assert not report["leaks"], (
        f"{where}: warnings, reprs or machine paths in the page: {report['leaks']}"
    )
    assert not report["escapedUnderscores"], (
        f"{where}: \\_ inside \\text{{}} is printed literally: {report['escapedUnderscores']}"
    )
    assert not report["deadToc"], (
        f"{where}: table-of-contents entries without a target: {report['deadToc']}"
    )
    assert not report["stderr"], (
        f"{where}: stderr blocks (progress bars, logs) in the page: {report['stderr']}"
    )
    if not where.startswith("api"):
        assert not report["history"], (
            f"{where}: project-history words on a teaching page: {report['history']}"
        )
    assert not re.search(r"[$\\]", report["title"]), (
        f"{where}: TeX in the tab title: {report['title']!r}"
    )


def test_site_in_browser(site: Path, server: str, browser, screenshot_dir: Path):
    """Home page, an API page with math, and every lesson, in Chromium with the network cut off.

    Every page must finish typesetting with no TeX error, no unstyled glyph, no raw TeX, no broken
    image, no console error and no request outside the site. The home page, the API page and the
    first lesson with a plot must contain math; that lesson's plots must have loaded.
    """
    lessons = _lesson_pages(site)
    assert lessons, "the site has no lesson pages (lessons/*.ipynb)"
    with_plots = [p for p in lessons if "data:image/png" in (site / p).read_text(encoding="utf-8")]
    assert with_plots, f"no lesson page has a matplotlib plot: {lessons}"
    api = API_PAGE if (site / API_PAGE).is_file() else sorted(
        p.relative_to(site).as_posix() for p in (site / "api").glob("*/index.html"))[0]

    apis = sorted(p.relative_to(site).as_posix() for p in (site / "api").glob("*/index.html"))
    pages = [("home", "index.html", True, False), ("api", api, True, False)]
    pages += [(f"api-{Path(p).parent.name}", p, False, False) for p in apis if p != api]
    pages += [(Path(p).parent.name, p, False, False) for p in ("results/index.html",)
              if (site / p).is_file()]
    pages += [(f"lesson-{Path(p).parent.name}", p, p == with_plots[0], p == with_plots[0])
              for p in lessons]
    missing = [p for p in TEACHING_PAGES if not (site / p).is_file()]
    assert not missing, f"pages missing from the site: {missing}"
    pages += [(Path(p).parent.name, p, False, False) for p in TEACHING_PAGES]
    failures = []
    shots = "MINISPEC_SCREENSHOTS" in os.environ  # see the module docstring
    for name, path, needs_math, needs_images in pages:
        url_path = path.removesuffix("index.html")
        shot = screenshot_dir / f"{name}.png" if shots else None
        report = _open_and_inspect(browser, server, url_path, shot, idle=name == "home")
        print(f"{name} /{url_path}: {report['containers']} formulas, {report['glyphs']} glyphs "
              f"checked, {report['images']} images {report['imageWidths']}, screenshot {shot}")
        try:
            _check(report, f"{name} page /{url_path}", needs_math=needs_math,
                   needs_images=needs_images)
        except AssertionError as exc:
            failures.append(str(exc))
        if ("celltag_hide-input" in (site / path).read_text(encoding="utf-8")
                and not report["folded"]):
            failures.append(f"{name} page: cells tagged hide-input are shown unfolded")
        if name.startswith("api-"):
            continue
        # The same page on a phone: nothing may push the page wider than the screen.
        phone = _open_and_inspect(browser, server, url_path,
                                  screenshot_dir / f"{name}-390.png" if shots else None, PHONE,
                                  idle=name == "home")
        if phone["pageScroll"] > 1:
            failures.append(f"{name} page /{url_path}: at 390 px the page scrolls sideways by "
                            f"{phone['pageScroll']} px")
        if phone["unscrolledTables"]:   # a wide table scrolls inside its box (tables.js)
            failures.append(f"{name} page /{url_path}: at 390 px these tables run past the edge "
                            f"with no box to scroll them in: {phone['unscrolledTables']}")
        if phone["displayOut"]:         # display math scrolls in its box, inside the column
            failures.append(f"{name} page /{url_path}: at 390 px these equations overflow the "
                            f"page: {phone['displayOut']}")
        if phone["hintless"]:           # a phone has no tooltip: the hint is written under it
            failures.append(f"{name} page /{url_path}: at 390 px these shrunk figures do not say "
                            f"how to see them full size: {phone['hintless']}")
        if phone["mathOut"]:        # an inline formula wider than the column scrolls in its box
            failures.append(f"{name} page /{url_path}: at 390 px these inline formulas run past "
                            f"the edge: {phone['mathOut']}")
        if phone["console_errors"] or phone["failed"]:
            failures.append(f"{name} page /{url_path} at 390 px: "
                            f"{phone['console_errors'] + phone['failed']}")
    assert not failures, "\n".join(failures)


_RETURNS = re.compile(
    r'<span class="doc-section-title">Returns:</span></p>\s*<table>(.*?)</table>', re.DOTALL)
_SPHINX_ROLE_TEXT = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`?\w")
_BOGUS_TYPE = re.compile(r"(?:class|func|meth|data|attr):\w")


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_api_pages_parse_docstrings(site: Path):
    """Every Returns section is one typed row (no "Name: A, class:Verdict" split); no Sphinx role
    text."""
    pages = sorted((site / "api").glob("*/index.html"))
    assert pages, "no API pages"
    problems, sections = [], 0
    for page in pages:
        html = page.read_text(encoding="utf-8")
        where = page.parent.name
        body = re.sub(r"<script\b.*?</script>|<style\b.*?</style>", "", html, flags=re.DOTALL)
        text = _text(body)
        for m in _SPHINX_ROLE_TEXT.finditer(text):
            problems.append(f"{where}: Sphinx role printed: {text[m.start():m.start() + 50]!r}")
        for table in _RETURNS.findall(html):
            sections += 1
            header = [_text(h) for h in re.findall(r"<th>(.*?)</th>", table, re.DOTALL)]
            rows = re.findall(r"<tr class=\"doc-section-item\">(.*?)</tr>", table, re.DOTALL)
            cells = ([_text(c) for c in re.findall(r"<td>(.*?)</td>", rows[0], re.DOTALL)]
                     if rows else [])
            if header != ["Type", "Description"] or len(rows) != 1:
                problems.append(f"{where}: Returns split into {header} x {len(rows)} rows: {cells}")
            elif (not cells[0] or _BOGUS_TYPE.search(cells[0])
                  or cells[0] in {"A", "An", "One", "The"}):
                problems.append(f"{where}: Returns type mis-parsed as {cells[0]!r}: "
                                f"{cells[1][:60]!r}")
    assert sections >= 10, (
        f"only {sections} Returns sections found: did the API pages' markup change?"
    )
    assert not problems, "\n".join(problems)


def test_search_previews_hold_no_raw_tex(site: Path):
    """Search results preview the text: math there is plain text (β = Σ_x min(p, q)), not TeX."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    raw = [
        f"{doc['location']}: {m.group(0)[:60]!r}"
        for doc in index["docs"]
        for m in re.finditer(r"\\[(\[]|\$\$|\\(?:frac|sum|min|alpha|beta|gamma)\b", doc["text"])
    ]
    assert not raw, f"{len(raw)} raw TeX fragments in search previews: {raw[:10]}"


# Characters of monospace output that fit the lessons' code column at 1400 px (measured in the
# screenshots: 108 visible; 105 leaves a margin for font differences).
OUTPUT_COLUMNS = 105
_TEXT_OUTPUT = re.compile(
    r'<div class="jp-RenderedText jp-OutputArea-output"[^>]*>\s*<pre>(.*?)</pre>', re.DOTALL)


def test_lesson_outputs_fit_the_column(site: Path):
    """No printed line of a lesson is wider than the column: a student would see it cut off."""
    long = []
    for page in _lesson_pages(site):
        html_text = (site / page).read_text(encoding="utf-8")
        blocks = _TEXT_OUTPUT.findall(html_text)
        assert blocks or "01_" not in page, f"{page}: no text outputs found: did the markup change?"
        for block in blocks:
            text = html.unescape(re.sub(r"<[^>]+>", "", block))
            long += [f"{page}: {len(line)} chars: {line[:80]!r}..."
                     for line in text.splitlines() if len(line) > OUTPUT_COLUMNS]
    assert not long, "\n".join(long)


def test_lessons_were_executed(site: Path):
    """Every lesson page shows the outputs of its run: the build executed it (the only run)."""
    unexecuted = [p for p in _lesson_pages(site)
                  if "jp-OutputArea-output" not in (site / p).read_text(encoding="utf-8")]
    assert not unexecuted, f"lesson pages without any output (not executed?): {unexecuted}"


def test_next_after_the_last_lesson_is_not_the_api(site: Path):
    """The footer's "Next" walks the lessons in order, and after the last one leads to Results."""
    lessons = _lesson_pages(site)
    for here, there in zip(lessons, lessons[1:], strict=False):
        html_text = (site / here).read_text(encoding="utf-8")
        nxt = re.search(r'<a href="([^"]+)"[^>]*class="md-footer__link md-footer__link--next"',
                        html_text)
        assert nxt and Path(there).parent.name in nxt.group(1), f"{here}: Next is not {there}"
    html_text = (site / lessons[-1]).read_text(encoding="utf-8")
    nxt = re.search(r'<a href="([^"]+)"[^>]*class="md-footer__link md-footer__link--next"',
                    html_text)
    assert nxt, f"{lessons[-1]}: no Next link"
    assert "api/" not in nxt.group(1) and "results" in nxt.group(1), (
        f"Next after the last lesson ({lessons[-1]}) leads to {nxt.group(1)}, not to the "
        "Results page")


def test_every_lesson_ends_with_exercises_and_further_reading(site: Path):
    """Every lesson page has an "Exercises" section (hints folded under <details>, or links to the
    graded exercise notebooks) and then "Further reading" with links out."""
    def heading(html_text: str, title: str) -> int:
        found = re.search(rf"<h2[^>]*>(?:(?!</h2>).)*?{title}", html_text, re.S)
        return found.start() if found else -1

    for page in _lesson_pages(site):
        html_text = (site / page).read_text(encoding="utf-8")
        exercises, reading = heading(html_text, "Exercises"), heading(html_text, "Further reading")
        assert 0 < exercises < reading, f"{page}: no Exercises section before Further reading"
        section = html_text[exercises:reading]
        assert "<details" in section or "exercises/" in section, f"{page}: exercises without hints"
        assert 'href="https://' in html_text[reading:], f"{page}: Further reading links nothing"


_MATH_WORDS = re.compile(r"\b(?:min|max|sum|prod|log|exp|norm|argmax)\b")


def test_api_pages_have_no_stray_marks(site: Path):
    """Docstrings' `` -- `` reads as a dash and their TeX as math, never as raw text in code."""
    problems = []
    for page in sorted((site / "api").glob("*/index.html")):
        body = re.sub(r"<script\b.*?</script>|<style\b.*?</style>|<pre\b.*?</pre>", "",
                      page.read_text(encoding="utf-8"), flags=re.DOTALL)
        prose = _text(re.sub(r"<code\b.*?</code>", "", body, flags=re.DOTALL))
        for m in re.finditer(r".{0,30}(?<![-\w!])--(?![-\w>]).{0,30}", prose):
            problems.append(f"{page.parent.name}: '--' in text: {m.group(0)!r}")
        for m in re.finditer(r".{0,30}\w::(?:\s|$).{0,10}", prose):
            problems.append(f"{page.parent.name}: stray '::' in text: {m.group(0)!r}")
        for m in re.finditer(r"<code>([^<]*[_^]\{[^<]*)</code>", body):
            code = html.unescape(m.group(1))
            # a formula (single-letter symbols and math words only), not pseudo-code with names
            if not re.search(r"[A-Za-z]{2}", _MATH_WORDS.sub(" ", code)):
                problems.append(f"{page.parent.name}: TeX in a code span: {code!r}")
    assert not problems, "\n".join(problems[:30])


# Every element of the widgets with text of its own: its colour against what it is drawn on (the
# backgrounds of its ancestors, blended, over white), opacity included, as WCAG 2 computes
# contrast. Disabled buttons are exempt (WCAG's own exception); SVG labels are left to the
# figure's own palette check (tests/test_viz.py).
_CONTRAST_JS = r"""
() => {
  const parse = (c) => {
    const m = c.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const v = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
  };
  const over = (fg, bg) => [0, 1, 2].map((i) => fg[3] * fg[i] + (1 - fg[3]) * bg[i]).concat([1]);
  const background = (el) => {
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const lum = (c) => {
    const [r, g, b] = c.slice(0, 3).map((x) => {
      x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const low = [];
  let checked = 0;
  document.querySelectorAll(".ms-widget *").forEach((el) => {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || el.closest("svg") || el.disabled) return;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none") return;
    const bg = background(el);
    const fg = over(parse(style.color), bg);
    let opacity = 1;
    for (let n = el; n; n = n.parentElement) opacity *= +getComputedStyle(n).opacity;
    const shown = over([fg[0], fg[1], fg[2], opacity], bg);
    checked += 1;
    const r = ratio(shown, bg);
    if (r < 4.5) {
      low.push(`${el.className || el.tagName} "${el.textContent.trim().slice(0, 20)}": ` +
               `${r.toFixed(2)}`);
    }
  });
  return {checked, low: [...new Set(low)].slice(0, 20)};
}
"""


def _assert_contrast(page, where: str) -> int:
    """Every widget text on ``page`` reads at 4.5:1 or more (WCAG AA); returns how many checked."""
    found = page.evaluate(_CONTRAST_JS)
    assert not found["low"], f"{where}: widget text below 4.5:1 contrast: {found['low']}"
    return found["checked"]


def _show(text: str) -> str:
    """A token as the round widget labels it (docs/javascripts/round.js, show())."""
    return text.replace("\n", "\u23ce").replace(" ", "\u2423") or "\u2205"


def test_round_widget_steps_through_the_recorded_rounds(site: Path, server: str, browser,
                                                        screenshot_dir: Path):
    """Next advances the widget; what it then shows is exactly the recorded JSON."""
    data = json.loads((site / "assets/data/rounds.json").read_text(encoding="utf-8"))
    rounds, k = data["rounds"], data["settings"]["k"]
    assert len(rounds) >= 5 and k >= 2
    assert {r["final"]["kind"] for r in rounds} == {"correction", "bonus"}, "want both endings"
    for r in rounds:  # the recorded rounds obey the rule they illustrate
        a = r["num_accepted"]
        assert [d["verdict"] for d in r["drafts"]][:a] == ["accepted"] * a
        for d in r["drafts"][: min(a + 1, k)]:
            assert (d["u"] * d["q"] < d["p"]) == (d["verdict"] == "accepted"), d
        assert r["emitted"] == [d["token"] for d in r["drafts"][:a]] + [r["final"]["token"]]
        assert r["context_after"] == r["context_before"] + a + 1
    for viewport, tag in ((VIEWPORT, "1400"), (PHONE, "390")):
        _drive_round_widget(browser, server, viewport, rounds, k,
                            screenshot_dir / f"widget-round-{tag}.png")


_STATE_JS = """(el) => ({round: +el.dataset.round, step: el.dataset.step, at: +el.dataset.at,
  cards: [...el.querySelectorAll('.ms-card')]
    .map((c) => c.querySelector('.ms-card__tok').textContent),
  verdicts: [...el.querySelectorAll('.ms-card__verdict')].map((v) => v.textContent),
  drawn: [...el.querySelectorAll('text.ms-svg-tick--now')].map((t) => t.textContent),
  tokens: +el.dataset.tokens, forwards: +el.dataset.forwards})"""


@contextlib.contextmanager
def _offline_page(browser, server: str, viewport: dict):
    """A page that may load only from the test server; yields (page, errors raised by its JS)."""
    host = urlsplit(server).netloc
    context = browser.new_context(viewport=viewport)
    context.route("**/*", lambda r: r.continue_() if urlsplit(r.request.url).netloc == host
                  else r.abort())
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page, errors
    finally:
        context.close()


def _drive_round_widget(browser, server: str, viewport: dict, rounds: list, k: int,
                        shot: Path) -> None:
    where = f"{viewport['width']} px"
    with _offline_page(browser, server, viewport) as (page, errors):
        page.goto(server + "round/", wait_until="load")
        page.wait_for_selector(".ms-round:not([data-source])[data-ready='true']", timeout=30_000)
        widget = page.locator(".ms-round:not([data-source])").first
        nxt = widget.locator("[data-act=next]")
        first = widget.evaluate(_STATE_JS)
        assert (first["round"], first["step"], first["at"]) == (1, "draft", 0), (where, first)
        assert first["cards"][:k] == [_show(d["text"]) for d in rounds[0]["drafts"]], (where, first)
        nxt.click()
        second = widget.evaluate(_STATE_JS)
        assert (second["round"], second["step"], second["at"]) == (1, "score", 1), (where, second)
        for _ in range(min(rounds[0]["num_accepted"] + 1, k) + 1):
            nxt.click()
        end = widget.evaluate(_STATE_JS)
        assert (end["round"], end["step"]) == (1, "emit"), (where, end)
        assert end["cards"][k] == _show(rounds[0]["final"]["text"]), (where, end)
        want = {"accepted": "\u2714 kept", "rejected": "\u2718 rejected", "untested": "not tested"}
        assert end["verdicts"] == [want[d["verdict"]] for d in rounds[0]["drafts"]], (where, end)
        # the chart marks the token drawn (from the residual or as the bonus) among its bars
        label = _show(rounds[0]["final"]["text"])
        assert end["drawn"] and (end["drawn"][0] == label or (
            end["drawn"][0].endswith("\u2026") and label.startswith(end["drawn"][0][:-1]))), (
            where, end["drawn"], label)
        assert (end["tokens"], end["forwards"]) == (len(rounds[0]["emitted"]), 1), (where, end)
        nxt.hover()                         # Next is focused (just clicked) and hovered
        assert _assert_contrast(page, f"round widget at {where}, end of round 1") > 20
        nxt.click()
        later = widget.evaluate(_STATE_JS)
        assert (later["round"], later["step"]) == (2, "draft"), (where, later)
        assert later["cards"][:k] == [_show(d["text"]) for d in rounds[1]["drafts"]], (where, later)
        assert (later["tokens"], later["forwards"]) == (len(rounds[0]["emitted"]), 1), later
        scroll = page.evaluate("document.documentElement.scrollWidth - "
                               "document.documentElement.clientWidth")
        assert scroll <= 1, f"{where}: the round page scrolls sideways by {scroll} px"
        widget.screenshot(path=str(shot))
        assert not errors, (where, errors)


def test_smollm2_recordings_obey_the_rule_they_show(site: Path):
    """SmolLM2's rounds (prompt lookup: one-hot q, so a copy is kept iff u < p(x)) and its race
    (the same tokens, in time order, fewer target forwards than tokens for the speculative run)."""
    data = json.loads((site / "assets/data/rounds-smollm2.json").read_text(encoding="utf-8"))
    assert data["settings"]["drafter"] == "context" and len(data["rounds"]) >= 5
    for r in data["rounds"]:
        a, drafts = r["num_accepted"], r["drafts"]
        assert all(d["q"] == 1.0 for d in drafts)
        for d in drafts[: a + 1]:
            assert (d["u"] < d["p"]) == (d["verdict"] == "accepted"), d
        assert r["final"]["kind"] == ("bonus" if a == len(drafts) else "correction")
        assert r["emitted"] == [d["token"] for d in drafts[:a]] + [r["final"]["token"]]
    race = json.loads((site / "assets/data/race.json").read_text(encoding="utf-8"))
    plain, spec = race["runs"]["plain"], race["runs"]["speculative"]
    assert race["identical"] and plain["tokens"] == spec["tokens"]
    for run in (plain, spec):
        assert run["times"] == sorted(run["times"]) and len(run["times"]) == len(run["tokens"])
    assert spec["target_forwards"] < plain["target_forwards"]


_RACE_JS = """(el) => ({time: +el.dataset.time, done: el.dataset.done,
  shown: Object.fromEntries([...el.querySelectorAll('[data-run]')]
    .map((row) => [row.dataset.run, +row.dataset.shown])),
  text: el.querySelector('[data-run=speculative] .ms-race__text').textContent,
  finished: Object.fromEntries([...el.querySelectorAll('[data-run]')]
    .map((row) => [row.dataset.run, row.dataset.finished === 'true'])),
  counts: [...el.querySelectorAll('.ms-race__count')].map((c) => c.textContent),
  drafted: [...el.querySelectorAll('[data-run=speculative] .ms-race__drafted')].length,
  plainDrafted: [...el.querySelectorAll('[data-run=plain] .ms-race__drafted')].length})"""


def test_race_replays_both_runs_at_their_recorded_times(site: Path, server: str, browser,
                                                        screenshot_dir: Path):
    """At any time t the race shows exactly the tokens each run had out by t; Race plays to the
    end; the SmolLM2 round widget on the same page loads its own recording."""
    race = json.loads((site / "assets/data/race.json").read_text(encoding="utf-8"))
    smol = json.loads((site / "assets/data/rounds-smollm2.json").read_text(encoding="utf-8"))
    with _offline_page(browser, server, VIEWPORT) as (page, errors):
        page.goto(server, wait_until="load")
        page.wait_for_selector(".ms-race[data-ready='true']", timeout=30_000)
        widget = page.locator(".ms-race").first
        t = race["runs"]["plain"]["seconds"] / 2
        widget.evaluate(f"(el) => el.minispecRace.showAt({t})")
        mid = widget.evaluate(_RACE_JS)
        want = {name: sum(x <= t for x in run["times"]) for name, run in race["runs"].items()}
        assert mid["shown"] == want, (mid, want)
        faster = min(race["runs"], key=lambda name: race["runs"][name]["seconds"])
        assert mid["finished"][faster] == (race["runs"][faster]["seconds"] <= t), mid
        widget.locator("[data-act=race]").click()
        page.wait_for_function("document.querySelector('.ms-race').dataset.done === 'true'",
                               timeout=60_000)
        end = widget.evaluate(_RACE_JS)
        n = len(race["runs"]["plain"]["tokens"])
        assert end["shown"] == {"plain": n, "speculative": n}, end
        assert end["text"] == "".join(race["runs"]["speculative"]["texts"])
        # the finish is marked on both rows, and the tokens that came from accepted drafts are
        # coloured: every token but the last of each round's burst, none in plain decoding
        assert end["finished"] == {"plain": True, "speculative": True}, end
        assert all("finished at" in c for c in end["counts"]), end["counts"]
        spec = race["runs"]["speculative"]
        assert 0 < end["drafted"] <= n - spec["target_forwards"] + 1, end  # one own token a forward
        assert end["plainDrafted"] == 0, end
        _assert_contrast(page, "the race, finished")
        # the text boxes show whole lines: scrolled to the newest, no line is cut at the top
        for box in widget.locator(".ms-race__text").all():
            lines = box.evaluate("(el) => { const s = getComputedStyle(el); return "
                                 "[el.scrollTop, parseFloat(s.lineHeight)]; }")
            assert abs(lines[0] / lines[1] - round(lines[0] / lines[1])) < 0.05, lines
        widget.screenshot(path=str(screenshot_dir / "widget-race-1400.png"))
        page.wait_for_selector(".ms-round[data-source=smollm2][data-ready='true']",
                               timeout=30_000)
        first = page.locator(".ms-round[data-source=smollm2]").evaluate(_STATE_JS)
        drafts = smol["rounds"][0]["drafts"]
        assert first["cards"][:len(drafts)] == [_show(d["text"]) for d in drafts], first
        assert not errors, errors


@pytest.mark.parametrize("viewport,tag", [(VIEWPORT, "1400"), (PHONE, "390")])
def test_speedup_explorer_follows_its_sliders(site: Path, server: str, browser,
                                              screenshot_dir: Path, viewport: dict, tag: str):
    """Moving a slider redraws the prediction, S = E(alpha, k) / (k c + r), in the readout a
    reader sees (not only in an attribute), with the note on r below 1 beside the r slider; on a
    desktop and on a phone."""
    with _offline_page(browser, server, viewport) as (page, errors):
        page.goto(server + "speedup/", wait_until="load")
        page.wait_for_selector(".ms-speedup[data-ready='true']", timeout=30_000)
        widget = page.locator(".ms-speedup").first
        readout = widget.locator(".ms-speedup__readout")

        def value(param: str, x: float) -> None:
            widget.locator(f"input[data-param={param}]").evaluate(
                "(el, x) => { el.value = x; el.dispatchEvent(new Event('input')); }", x)

        before = float(widget.get_attribute("data-speedup"))
        shown_before = readout.inner_text()
        for param, x in (("alpha", 0.6), ("k", 3), ("c", 0.2), ("r", 1.5)):
            value(param, x)
        after = float(widget.get_attribute("data-speedup"))
        expected = (1 - 0.6 ** 4) / (1 - 0.6) / (3 * 0.2 + 1.5)
        assert abs(after - expected) < 1e-3, (after, expected)
        assert abs(after - before) > 0.1, "the sliders did not change the predicted speedup"
        shown = readout.inner_text()
        assert shown != shown_before and f"{expected:.2f}x" in shown, shown   # what a reader sees
        assert readout.is_visible() and readout.bounding_box()["width"] <= viewport["width"]
        notes = " ".join(widget.locator(".ms-speedup__note").all_inner_texts())
        assert "below 1" in notes, notes                     # r below 1 is explained, not hidden
        value("alpha", 0.9)
        assert float(widget.get_attribute("data-speedup")) > after
        assert "faster" in readout.inner_text()      # the word, not only the green
        _assert_contrast(page, f"speedup explorer at {tag} px")
        widget.screenshot(path=str(screenshot_dir / f"widget-speedup-{tag}.png"))
        points = json.loads((site / "assets/data/speedup.json").read_text(encoding="utf-8"))
        assert points["points"], "the Results page's measured points did not reach the explorer"
        assert widget.locator(".ms-speedup__measured").count() == len(points["points"])
        assert not errors, errors


def test_every_notebook_page_links_its_notebook_for_download(site: Path):
    """Take it home: each lesson and exercise page starts with a download link to its notebook,
    served beside the page (mkdocs-jupyter's ``include_source``); the home page tells how to run
    everything (the README's commands and ``mkdocs serve``)."""
    pages = sorted((site / "lessons").glob("**/index.html"))
    assert len(pages) >= 12, pages
    for page in pages:
        found = re.search(r'<p class="ms-download"><a href="([^"]+\.ipynb)" download>',
                          page.read_text(encoding="utf-8"))
        assert found, f"{page}: no download link"
        assert (page.parent / found.group(1)).is_file(), f"{page}: {found.group(1)} not served"
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Run it yourself" in home and "mkdocs serve" in home


_TABLE_STATE_JS = """() => [...document.querySelectorAll("article table")].map((t) => {
  const s = getComputedStyle(t);
  return [t.getAttribute("class"), s.borderTopWidth, s.borderTopStyle, s.display];
})"""


def test_tables_keep_their_style_across_resizes(site: Path, server: str, browser):
    """A window narrowed to a phone's 390 px and widened again shows every table as it was first
    drawn (material styles exactly the tables without a class attribute: ``class=""`` drops
    their borders); at 390 px the Results page's tables scroll inside their own boxes, so the page
    never scrolls sideways and no table is stacked into one card per row."""
    with _offline_page(browser, server, VIEWPORT) as (page, errors):
        page.goto(server + "results/", wait_until="load")
        page.wait_for_function("() => document.body.hasAttribute('data-math')", timeout=60_000)
        first = page.evaluate(_TABLE_STATE_JS)
        assert len(first) >= 5, f"the Results page shows {len(first)} tables"
        assert all(state[0] is None for state in first), first
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        phone = page.evaluate("""() => ({
          scroll: document.documentElement.scrollWidth - document.documentElement.clientWidth,
          tables: [...document.querySelectorAll("article table")].map((t) => [
            getComputedStyle(t.querySelector("tr")).display, getComputedStyle(t).overflowX,
            t.scrollWidth > t.clientWidth + 1, t.hasAttribute("data-ms-scrolls")])})""")
        assert phone["scroll"] <= 1, f"at 390 px the Results page scrolls sideways: {phone}"
        assert all(t[0] == "table-row" for t in phone["tables"]), phone["tables"]  # not stacked
        assert all(t[1] == "auto" for t in phone["tables"]), phone["tables"]
        assert all(t[2] == t[3] for t in phone["tables"]), phone["tables"]   # scroll marked
        assert any(t[2] for t in phone["tables"]), "no Results table is wider than a phone"
        page.set_viewport_size(VIEWPORT)
        page.wait_for_timeout(300)
        again = page.evaluate(_TABLE_STATE_JS)
        assert again == first, f"tables changed after 1400 -> 390 -> 1400 px: {again} != {first}"
        assert not errors, errors


def test_a_shrunk_figure_opens_full_size_on_a_phone(site: Path, server: str, browser):
    """At 390 px a lesson's figures are shown smaller than drawn; a tap opens one at its natural
    width (the overlay scrolls it) and a second tap closes it."""
    lessons = _lesson_pages(site)
    with_plots = [p for p in lessons if "data:image/png" in (site / p).read_text(encoding="utf-8")]
    assert with_plots, "no lesson page has a plot"
    with _offline_page(browser, server, PHONE) as (page, errors):
        page.goto(server + with_plots[0].removesuffix("index.html"), wait_until="load")
        img = page.locator("img.minispec-zoomable").first
        img.wait_for(timeout=30_000)
        natural = img.evaluate("(el) => el.naturalWidth")
        assert img.bounding_box()["width"] < natural, "the figure is not shrunk at 390 px"
        hint = img.locator("xpath=following-sibling::*[1]")
        assert "Tap the figure to see it full size" in hint.inner_text()
        img.scroll_into_view_if_needed()
        img.click()
        big = page.locator(".minispec-zoom img")
        big.wait_for(timeout=5_000)
        assert big.evaluate("(el) => el.getBoundingClientRect().width") >= natural - 1
        page.locator(".minispec-zoom").click(position={"x": 5, "y": 5})
        assert page.locator(".minispec-zoom").count() == 0
        assert not errors, errors


class _GzipHandler(_QuietHandler):
    """Serves text (HTML, CSS, JS, JSON, SVG) gzip-compressed to a client that accepts it, as a
    static host does (GitHub Pages, Netlify, nginx's gzip_static): what a student downloads."""

    _TEXT = (".html", ".css", ".js", ".json", ".svg", ".map", ".txt")

    def send_head(self):
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            path = os.path.join(path, "index.html")
        if (not path.endswith(self._TEXT) or not os.path.isfile(path)
                or "gzip" not in self.headers.get("Accept-Encoding", "")):
            return super().send_head()
        import gzip
        import io
        body = gzip.compress(Path(path).read_bytes(), compresslevel=6, mtime=0)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


# A cold visit (nothing cached) downloads at most this much, compressed as served: the home page
# (with MathJax: it holds math) and any lesson page (MathJax, the notebook stylesheet, its
# figures).
HOME_BUDGET_BYTES = 1_000_000
LESSON_BUDGET_BYTES = 1_200_000

_WEIGHT_JS = """() => {
  const entries = performance.getEntriesByType("navigation")
    .concat(performance.getEntriesByType("resource"));
  return entries.map((e) => [e.name, e.transferSize, e.decodedBodySize]);
}"""


def test_pages_are_light_on_a_cold_visit(site: Path, browser):
    """A cold visit to the home page stays under 1 MB and to every lesson page under 1.2 MB, as a
    compressing host serves them; no page fetches the search index until the search box is used
    (then it does, and finds a lesson); a page without math loads no MathJax; a notebook page
    carries no inlined copy of the notebook stylesheet."""
    handler = functools.partial(_GzipHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    lessons = [p.removesuffix("index.html") for p in _lesson_pages(site)]
    exercises = sorted(p.parent.relative_to(site).as_posix() + "/"
                       for p in (site / "lessons" / "exercises").glob("*/index.html"))
    pages = [("", HOME_BUDGET_BYTES)] + [(p, LESSON_BUDGET_BYTES) for p in lessons + exercises]
    pages += [(p.removesuffix("index.html"), LESSON_BUDGET_BYTES) for p in TEACHING_PAGES]
    heavy, index_early, weights = [], [], {}
    try:
        for path, budget in pages:
            context = browser.new_context(viewport=VIEWPORT)   # a fresh cache: a cold visit
            page = context.new_page()
            try:
                page.goto(base + path, wait_until="load")
                page.wait_for_function("() => document.body.hasAttribute('data-math')",
                                       timeout=60_000)
                page.evaluate("() => document.fonts.ready.then(() => true)")
                page.wait_for_load_state("networkidle")
                entries = page.evaluate(_WEIGHT_JS)
                wire = sum(e[1] for e in entries)
                raw = sum(e[2] for e in entries)
                weights[path or "home"] = wire
                if wire > budget:
                    big = sorted(entries, key=lambda e: -e[1])[:5]
                    heavy.append(f"/{path}: {wire / 1e6:.2f} MB on the wire ({raw / 1e6:.2f} MB "
                                 f"uncompressed) > {budget / 1e6:.1f} MB; largest: "
                                 + ", ".join(f"{urlsplit(e[0]).path} {e[1] // 1000} KB"
                                             for e in big))
                if any("search_index" in e[0] for e in entries):
                    index_early.append(path or "home")
                if path == "":
                    query = page.locator("input[data-md-component=search-query]")
                    with page.expect_request(lambda r: "search_index.json" in r.url,
                                             timeout=10_000):
                        query.click()
                    query.fill("residual")
                    page.wait_for_selector(".md-search-result__item", timeout=20_000)
            finally:
                context.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    print("cold-visit weights (bytes on the wire):", weights)
    assert not index_early, f"pages that fetch the search index before it is used: {index_early}"
    assert not heavy, "\n".join(heavy)
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        inline = sum(len(m.group(1)) for m in re.finditer(r"<style\b[^>]*>(.*?)</style>", text,
                                                          re.DOTALL))
        assert inline < 20_000, f"{page.relative_to(site)}: {inline} bytes of inline CSS"
        math = 'class="arithmatex"' in text or "lessons/" in page.relative_to(site).as_posix()
        if not math:
            assert "tex-chtml.js" not in text, f"{page.relative_to(site)}: MathJax with no math"


def test_the_site_serves_the_source_and_says_how_to_install(site: Path):
    """A student with only the site can run everything: the home page links the project's
    source, ``minispec-src.tar.gz``, built with the site (the package with its models, lessons,
    tests and the site's sources, ready for ``pip install``); every notebook page links it beside
    its notebook; and every notebook served for download starts with a Markdown cell that says
    how to install the package."""
    import tarfile

    archive = site / "minispec-src.tar.gz"
    assert archive.is_file(), "the site serves no source archive"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    assert re.fullmatch(r"minispec-[\w.]+", top), top
    for needed in ("pyproject.toml", "README.md", "minispec/__init__.py",
                   "minispec/zoo/shakespeare-target/model.safetensors", "lessons", "tests",
                   "mkdocs.yml"):
        assert any(n == f"{top}/{needed}" or n.startswith(f"{top}/{needed}/") for n in names), (
            f"{needed} is not in the archive")
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="minispec-src.tar.gz"' in home, "the home page does not link the source archive"
    for page in sorted((site / "lessons").glob("**/index.html")):
        text = page.read_text(encoding="utf-8")
        found = re.search(r'<p class="ms-download">.*?</p>', text, re.DOTALL)
        assert found and "minispec-src.tar.gz" in found.group(0), f"{page}: no archive link"
        href = re.search(r'href="([^"]*minispec-src\.tar\.gz)"', found.group(0)).group(1)
        assert (page.parent / href).resolve() == archive.resolve(), f"{page}: {href}"
    served = sorted((site / "lessons").rglob("*.ipynb"))
    assert len(served) >= 12
    for notebook in served:
        first = json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]
        text = "".join(first["source"])
        assert first["cell_type"] == "markdown" and "pip install" in text, notebook
        assert "minispec-src.tar.gz" in text and "venv" in text, notebook
