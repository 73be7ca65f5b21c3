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

LESSONS = sorted((Path(__file__).parent.parent / "lessons").glob("[0-9][0-9]_*.ipynb"))

#: A speed ratio ("1.18x", "2×"), a verify cost "r(4) = 1.3", a draft cost "c = 0.1", an
#: acceptance "alpha = 0.7" / "\alpha = 0.7", or a number right after "we measured".
NUMBER = r"\d+(?:\.\d+)?"
MEASURED = re.compile(
    rf"(?<![\w.]){NUMBER}\s*(?:x|×)(?!\w)"
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
             "r(4) = 1.7 and c = 0.04 at \\alpha = 0.72")
    assert [m.group() for m in MEASURED.finditer(stale)] == [
        "1.2x", "2x", "we measured about 30", "r(4) = 1.7", "c = 0.04", "\\alpha = 0.72"]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_no_measured_number_is_written_into_a_lessons_prose(path):
    bad = [x for x in literals(path) if (path.name[:2], x) not in ALLOWED]
    assert not bad, (f"{path.name}: literal numbers in markdown {bad}; render measured ones from "
                     "the run (IPython.display.Markdown), or list a non-measurement in ALLOWED")
