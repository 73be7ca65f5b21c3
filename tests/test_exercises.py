"""The exercise notebooks grade themselves: with the stub the grader says "not implemented" (and the
notebook still runs cleanly), with a reference solution injected it passes, with a lab bug
injected the grader cell fails.

Each notebook has one code cell tagged ``exercise`` (the stub the student fills in) and one tagged
``grader`` (runs ``minispec.check`` and leaves its report in ``report``). The test executes the
code cells in order, with the ``exercise`` cell replaced where needed. The references are
minispec's own functions, except for the append-only cache of exercise 06, which has no
counterpart in the package (its reference, the crop below, is the expected solution).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

EXERCISES = Path(__file__).resolve().parent.parent / "lessons" / "exercises"

REFERENCES = {
    "01_speculative_sampling": """
import minispec as ms

def speculative_sample(p, q, generator):
    return ms.speculative_sample(p, q, generator)
""",
    "02_residual": """
import minispec as ms

def residual(p, q):
    return ms.residual(p, q)
""",
    "03_verify": """
import minispec as ms

def verify(draft_tokens, draft_probs, target_probs, generator):
    proposal = ms.Proposal.chain(draft_tokens, draft_probs)
    return ms.verify(proposal, target_probs, generator).tokens
""",
    "04_greedy_verify": """
import minispec as ms

def verify_greedy(draft_tokens, draft_probs, target_probs, generator):
    argmax = target_probs.argmax(dim=-1).tolist()
    return ms.verify(ms.Proposal.chain(draft_tokens), argmax).tokens
""",
    "05_ngram_proposer": """
import minispec as ms

def propose(context, k):
    return ms.NGramDrafter().propose(context, k).tokens.tolist()
""",
    "06_cache_truncation": """
def truncate_to(cache, slot, n):
    cache.table.truncate_to(slot, n)
    for layer in range(cache.num_layers):
        for store in (cache.keys, cache.values):
            if (slot, layer) in store:
                store[slot, layer] = store[slot, layer][:n]
""",
    "07_tree_verify": """
import minispec as ms

def verify_tree(tree, target_probs, draft_probs, generator):
    proposal = ms.Proposal.from_tree(tree, draft_probs)
    return ms.verify(proposal, target_probs, generator)
""",
}

#: A wrong solution per exercise (from the lab where one fits): the grader cell must fail.
WRONG = {
    "01_speculative_sampling": """
from minispec.check.bugs.samplers import sample_resample_from_p as speculative_sample
""",
    "02_residual": "from minispec.check.bugs.samplers import residual_q_minus_p as residual\n",
    "03_verify": ("from minispec.check.bugs.verifiers import verify_bonus_from_wrong_row "
                  "as verify\n"),
    "04_greedy_verify": """
from minispec.check.bugs.verifiers import verify_greedy_rows_shifted as verify_greedy
""",
    "05_ngram_proposer": """
def propose(context, k):
    return [context[-1]] * k        # repeats the last token: no pattern continued
""",
    "06_cache_truncation": """
def truncate_to(cache, slot, n):
    cache.table.truncate_to(slot, n)   # the tensors are not cropped
""",
    "07_tree_verify": """
from minispec.check.bugs.verifiers import tree_siblings_against_p as verify_tree
""",
}

NAMES = sorted(REFERENCES)


def _cells(name: str) -> list[nbformat.NotebookNode]:
    notebook = nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _run(name: str, exercise: str | None = None) -> dict:
    """Execute the notebook's code cells; ``exercise`` replaces the stub cell when given."""
    namespace: dict = {"__name__": f"exercise_{name}"}
    for cell in _cells(name):
        tags = cell.metadata.get("tags", [])
        source = exercise if exercise is not None and "exercise" in tags else cell.source
        exec(compile(source, f"{name}.ipynb", "exec"), namespace)  # noqa: S102 - our notebooks
    return namespace


def test_every_exercise_is_covered():
    assert sorted(path.stem for path in EXERCISES.glob("*.ipynb")) == NAMES == sorted(WRONG)


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_output_free_and_tagged(name):
    cells = _cells(name)
    assert all(not cell.outputs and cell.execution_count is None for cell in cells)
    tags = [tag for cell in cells for tag in cell.metadata.get("tags", [])]
    assert tags.count("exercise") == 1 and tags.count("grader") == 1
    assert "raise NotImplementedError" in next(c.source for c in cells
                                               if "exercise" in c.metadata.get("tags", []))


@pytest.mark.parametrize("name", NAMES)
def test_the_stub_is_reported_as_not_implemented(name):
    report = _run(name)["report"]
    assert report.not_implemented and not report.passed
    assert "NOT IMPLEMENTED" in str(report)


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_passes(name):
    report = _run(name, REFERENCES[name])["report"]
    assert report.passed, str(report)


@pytest.mark.parametrize("name", NAMES)
def test_a_wrong_solution_turns_the_grader_cell_red(name):
    with pytest.raises(AssertionError, match="read the counterexample"):
        _run(name, WRONG[name])
