"""Numbers in a lesson's prose come from its run: no markdown cell holds a literal measured ratio,
``r``, ``c`` or ``alpha``.

A measured number written into the text goes stale the moment the run prints another one (the
site once said "r between 1.15 and 1.35" above an output of 1.49). Such numbers are rendered from
the variables that hold them (``IPython.display.Markdown`` under the cell that measures them). The
literals that remain are not measurements -- a paper's or a blog's worked example, a bound an
``assert`` checks, an exercise's input -- and each is listed here with the reason.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
#: the lessons and their exercises (an exercise's prose is a teaching page too)
LESSONS = sorted([*(ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"),
                  *(ROOT / "lessons" / "exercises").glob("[0-9][0-9]*.ipynb")])

#: A speed ratio ("1.18x", "2×"), a time, a rate or a share with its unit ("12 ms", "30 GB/s",
#: "300 tok/s", "5 %"), tokens per forward given a value, a verify cost "r(4) = 1.3", a draft cost
#: "c = 0.1", an acceptance "alpha = 0.7" / "\alpha = 0.7", or a number right after "we measured".
NUMBER = r"\d+(?:\.\d+)?"
MEASURED = re.compile(
    rf"(?<![\w.]){NUMBER}\s*(?:x|×)(?!\w)"
    rf"|(?<![\w.,]){NUMBER}\s?(?:ms|µs|GB/s|tok/s|tokens/s|%)(?![\w/])"
    rf"|\btokens per (?:target )?forward (?:of )?\d\.\d"
    rf"|\br\(\d+\)\s*=\s*{NUMBER}"
    rf"|(?<![\w\\])c\s*=\s*{NUMBER}"
    rf"|\\?alpha\s*=\s*{NUMBER}"
    rf"|\bwe measured (?:about |roughly )?\$?{NUMBER}",
)

#: (lesson number, literal) -> why it is not a measurement of this run.
ALLOWED = {
    ("05", "2.67x"): "the blog's worked example (50 ms target, 5 ms draft, five drafts)",
    ("05", "c = 0.1"): "the blog's worked example in the paper's terms",
    ("05", "c = 0.05"): "an exercise's input",
    ("exercises/05", "\\alpha = 1"): "a limit the exercise asks about (every draft accepted)",
    ("exercises/05", "\\alpha = 0"): "a limit the exercise asks about (every draft rejected)",
    ("exercises/05", "c = 0"): "a limit the exercise asks about (a free draft)",
    ("05", "50 ms"): "the blog's worked example (50 ms target, 5 ms draft, five drafts)",
    ("05", "5 ms"): "the blog's worked example",
    ("05", "18.75 ms"): "the blog's worked example, worked out by hand",
    ("05", "15 %"): "the tolerance the operations-factor cell asserts",
    ("09", "10 %"): "the least gain in tokens per forward the tree cell asserts",
    ("10", "40 %"): "how far a flipped near-tie cannot move a count: the assert's margin, argued",
    ("11", "5 %"): "the bound the head-size cell asserts, and the held-out share of the data",
    ("11", "3.3 %"): "one layer of 30, arithmetic",
    ("11", "3 %"): "the shipped head's parameter share, a count the head-size cell prints",
    ("11", "95 %"): "the reduced vocabulary's coverage, a parameter of the recipe",
    ("11", "75 %"): "the bound the reduced-head cell asserts",
    ("11", "25 %"): "the allowance the cost-model cell asserts for the costs it leaves out",
    ("05", "c = 0"): "a context drafter's cost, by assumption",
    ("05", "r(4) = 5"): "what a compute-bound step would pay, by definition",
    ("05", "3.2x"): "Leviathan et al.'s Table 2 (TPU-v4), the published point section 8 checks",
    ("05", "3.4x"): "Leviathan et al.'s Table 2 (TPU-v4), the published point section 8 checks",
    ("05", "c = 0.02"): "Leviathan et al.'s Table 2 (TPU-v4), the published point section 8 checks",
    ("05", "\\alpha = 0.75"): "Leviathan et al.'s Table 2, the published point section 8 checks",
    ("06", "\\alpha = 0.5"): "an input at which the chapter's table is evaluated",
    ("06", "\\alpha = 0.7"): "an input at which the chapter's table is evaluated",
    ("08", "c = 1.24"): "published parameter counts (Llama-3.2-1B over Llama-3.1-8B), the GPU "
                        "prediction's input",
    ("10", "1.4×"): "the bound the cell's assert checks",
    ("11", "3x"): "the bound the cell's assert checks",
    ("11", "1.15x"): "the bound the cell's assert checks",
}


def literals(path: Path) -> list[str]:
    found = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            found += [m.group() for m in MEASURED.finditer("".join(cell["source"]))]
    return found


def test_the_pattern_catches_what_went_stale_before():
    stale = ("r between 1.15 and 1.35, packed ≈ 1.2x, eager ≈ 2x; we measured about 30 %; "
             "r(4) = 1.7 and c = 0.04 at \\alpha = 0.72; a step of 46.0 ms at 30.8 GB/s, "
             "the fast path's ~10 µs a call; tokens per forward 1.19")
    assert [m.group() for m in MEASURED.finditer(stale)] == [
        "1.2x", "2x", "we measured about 30", "r(4) = 1.7", "c = 0.04", "\\alpha = 0.72",
        "46.0 ms", "30.8 GB/s", "10 µs", "tokens per forward 1.1"]
    assert not MEASURED.search("k = 4, B = 16, 96 new tokens, lesson 05, 538 MB, 1/30")


def key(path: Path) -> str:
    """``"05"`` for lesson 05, ``"exercises/05"`` for its exercise."""
    return ("exercises/" if path.parent.name == "exercises" else "") + path.name[:2]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_measured_number_is_written_into_a_lessons_prose(path):
    bad = [x for x in literals(path) if (key(path), x) not in ALLOWED]
    assert not bad, (f"{path.name}: literal numbers in markdown {bad}; render measured ones from "
                     "the run (IPython.display.Markdown), or list a non-measurement in ALLOWED")


def test_every_allowed_literal_is_still_on_its_page():
    """An entry whose literal left the page is dead: it would let the same number back unasked."""
    found = {(key(path), x) for path in LESSONS for x in literals(path)}
    assert not [entry for entry in ALLOWED if entry not in found]
