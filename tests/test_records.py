"""Measured figures come from the records in ``docs/data/`` (``gpu.json``, ``cpu.json``): the
Results page's tables, the glance table, the README's headline and the explorer's presets are
rendered from them, and no teaching page types a measured number by hand."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location("records", ROOT / "docs" / "hooks" / "records.py")
records = importlib.util.module_from_spec(spec)
spec.loader.exec_module(records)

RECORD = {
    "machine": {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0"},
    "commit": "0123456789abcdef", "command": "python benchmarks/gpu.py", "identical_tokens": True,
    "roofline_ms": 0.126, "step_ms": {"1": 1.234, "64": 2.5}, "step_ms_eager": {"1": 19.3},
    "r": {"4": 1.07}, "r_eager": {"4": 1.52}, "speedup_b1": {"prompt lookup": 2.31},
    "speedup_b1_eager": {"prompt lookup": 1.1},
    "engine": {"32": {"plain_tok_s": 4321.0, "plain_tok_s_eager": 900.0, "hf_tok_s": 1500.0,
                      "default_over_plain": 0.99}},
    "bf16": {"identical_fraction": 0.987, "identical_outputs": 6, "outputs": 7},
}


def test_every_figure_of_the_record_reaches_the_page():
    page = records.render_gpu(RECORD)
    for text in ("NVIDIA H200", "0123456789", "| 1 | 1.234 | 19.300 |", "| 4 | 1.07 | 1.52 |",
                 "| prompt lookup | 2.31x | 1.10x |", "| 32 | 4,321 | 900 | 1,500 | 0.99x |",
                 "98.7 %", "6 of 7"):
        assert text in page, text


def test_the_marker_becomes_the_record_or_a_note(tmp_path):
    config = {"docs_dir": str(tmp_path)}
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "No `docs/data/gpu.json` is committed yet" in page and "gpu_session.sh" in page
    (tmp_path / "data").mkdir()
    import json
    (tmp_path / "data" / "gpu.json").write_text(json.dumps(RECORD))
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "| 1 | 1.234 | 19.300 |" in page and "<!--" not in page


# --- one recorded source: docs/data/cpu.json ------------------------------------------------

DOCS = ROOT / "docs"
#: teaching pages: every page but Results, whose sections report the runs themselves
TEACHING = sorted(set(DOCS.glob("*.md")) - {DOCS / "results.md"})
#: a speed ratio, a verify or draft cost, an acceptance, or a three-decimal measurement
MEASURED = re.compile(r"(?<![\w.{])\d+(?:\.\d+)?x(?!\w)|\br\(\d+\)\s*=\s*\d"
                      r"|(?<![\w\\])c\s*=\s*0\.\d|alpha\s*=\s*0\.\d|(?<![\w.])0\.\d{3}(?!\d)")
#: (page, literal) -> why it is not one of our measurements
ALLOWED = {
    ("index.md", "2.67x"): "the blog's worked example (50 ms target, 5 ms draft)",
    ("speedup.md", "2.67x"): "the blog's worked example (50 ms target, 5 ms draft)",
    ("speedup.md", "c = 0.1"): "the blog's worked example in the paper's terms",
    ("speedup.md", "0.834"): "the blog's worked example: the alpha that gives three of five",
}

#: (page, literal) -> the model card's value that the page quotes (the README renders nothing)
FROM_CARD = {("README.md", "0.708"): "pairs/draft/alpha"}


def _prose(text: str) -> str:
    """A page without its code blocks and record placeholders (which are rendered, not typed)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return records._VALUE.sub("", text)


def _glance(results: str) -> str:
    return results.split("## At a glance", 1)[1].split("\n## ", 1)[0]


def test_no_teaching_page_types_a_measured_number():
    typed = [(page.name, m.group()) for page in TEACHING
             for m in MEASURED.finditer(_prose(page.read_text(encoding="utf-8")))]
    typed += [("results.md (At a glance)", m.group()) for m in MEASURED.finditer(
        _prose(_glance((DOCS / "results.md").read_text(encoding="utf-8"))))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    typed += [("README.md", m.group()) for m in MEASURED.finditer(
        _prose(records.HEADLINE.sub("", readme)))]
    # the README cannot render a placeholder: a figure it quotes from the model card must match it
    for (page, literal), path in FROM_CARD.items():
        assert records.value("card", path, ".3f") == literal, (page, literal, path)
    typed = [t for t in typed if t not in ALLOWED and t not in FROM_CARD]
    assert typed == [], "read these from docs/data/cpu.json"


def test_every_placeholder_names_a_value_of_the_record():
    pages = [*DOCS.glob("*.md")]
    found = [m for page in pages for m in records._VALUE.finditer(page.read_text())]
    assert len(found) >= 20
    for m in found:
        records.value(m.group(1), m.group(2), m.group(3))        # raises KeyError otherwise
    with pytest.raises(KeyError, match="no key 'nowhere'"):
        records.render_values("{{ cpu/runs/nowhere :.2f }}")


def test_the_readme_headline_is_the_record():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = records.HEADLINE.search(readme)
    assert block, "the README lost its <!-- headline --> block"
    expected = f"<!-- headline -->\n{records.headline(records.load('cpu'))}\n<!-- /headline -->"
    assert block.group() == expected, "run: python docs/hooks/records.py --readme"


def test_every_run_keeps_its_machine_commit_and_command():
    for name, run in records.load("cpu")["runs"].items():
        assert {"device", "threads", "clock", "load"} <= set(run["machine"]), name
        assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]), name
        assert "minispec" in run["command"], name


def test_the_explorer_presets_and_points_are_the_record():
    spec = importlib.util.spec_from_file_location("widgets", DOCS / "hooks" / "widgets.py")
    widgets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(widgets)
    record = records.load("cpu")
    pair, head = record["runs"]["shipped_pair"], record["runs"]["smollm2_tasks"]
    data = widgets._speedup_points(record)
    assert [p["measured"] for p in data["points"]] == [r["measured"] for r in pair["rows"].values()]
    by_name = {p["name"]: p for p in data["presets"]}
    assert by_name["shipped pair, 2-core CPU"]["alpha"] == pair["alpha_greedy"]
    eagle = by_name["EAGLE head, SmolLM2, CPU"]
    a = eagle["alpha"]                       # Eq. (1) at k = 2 gives the recorded tokens/forward
    assert abs(1 + a + a * a - head["rows"]["overall"]["eagle_tokens_per_forward"]) < 1e-2
    js = (DOCS / "javascripts" / "speedup.js").read_text(encoding="utf-8")
    assert "0.722" not in js and "EAGLE" not in js     # measured presets come from the record
