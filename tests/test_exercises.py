"""The exercise notebooks grade themselves: with the stub the grader says "not implemented" (and the
notebook still runs cleanly), with a reference solution injected it passes, with a wrong one (a
lab bug where one fits) injected the grader cell fails.

Each notebook is numbered as the lesson whose mechanism it asks for (``04a``, ``04b``: two for
lesson 04). It has one code cell tagged ``exercise`` (the stub the student fills in) and one tagged
``grader`` (runs ``minispec.check`` and leaves its report in ``report``). The test executes the
code cells in order, with the ``exercise`` cell replaced where needed. The references are
minispec's own functions, except where the package has no function of that shape: the
append-only cache of exercise 07 (its reference, the crop below, is the expected solution), the
scheduler's reservation of exercise 08 (the package's rule is a method of ``Scheduler``, which
the grader runs), the reduced-vocabulary drafter of exercise 11 (minispec's EAGLE head reduces its
vocabulary inside its own forward, not as a drafter of this shape), and the fixed verifier of
exercise 12 (whose wrong solution is the notebook's own buggy verifier, unfixed).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

EXERCISES = Path(__file__).resolve().parent.parent / "lessons" / "exercises"

#: Exercise 12's verifier with both of its bugs fixed: a fresh uniform per draft, and the bonus
#: token from the row after the last draft.
FIXED_VERIFIER = """
import torch

def verify(draft_tokens, draft_probs, target_probs, generator):
    vocab = target_probs.shape[-1]
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        p = target_probs[i]
        q = torch.zeros(vocab) if draft_probs is None else draft_probs[i]
        if draft_probs is None:
            q[x] = 1.0
        if torch.rand((), generator=generator) * q[x] < p[x]:
            out.append(x)
            continue
        excess = (p - q).clamp_min(0)
        out.append(int(torch.multinomial(excess / excess.sum(), 1, generator=generator)))
        return out
    bonus = target_probs[len(out)]
    out.append(int(torch.multinomial(bonus, 1, generator=generator)))
    return out
"""

REFERENCES = {
    "01a_speculative_sampling": """
import minispec as ms

def speculative_sample(p, q, generator):
    return ms.speculative_sample(p, q, generator)
""",
    "01b_residual": """
import minispec as ms

def residual(p, q):
    return ms.residual(p, q)
""",
    "02_acceptance": """
import minispec as ms

def acceptance_rate(p, q):
    return ms.theory.acceptance_rate(p, q)
""",
    "03_adjustment": """
import minispec as ms

def adjust(logits, temperature, top_k, top_p):
    return ms.probs_from_logits(logits, ms.SamplingParams(temperature, top_k, top_p))
""",
    "04a_verify": """
import minispec as ms

def verify(draft_tokens, draft_probs, target_probs, generator):
    proposal = ms.Proposal.chain(draft_tokens, draft_probs)
    return ms.verify(proposal, target_probs, generator).tokens
""",
    "04b_greedy_verify": """
import minispec as ms

def verify_greedy(draft_tokens, draft_probs, target_probs, generator):
    argmax = target_probs.argmax(dim=-1).tolist()
    return ms.verify(ms.Proposal.chain(draft_tokens), argmax).tokens
""",
    "05_speedup": """
import minispec as ms

def walltime_speedup(alpha, gamma, c, r):
    return ms.theory.walltime_speedup(alpha, gamma, c, r)
""",
    "06_ngram_proposer": """
import minispec as ms

def propose(context, k):
    return ms.NGramDrafter().lookup(context, k)
""",
    "07_cache_truncation": """
def truncate_to(cache, slot, n):
    cache.table.truncate_to(slot, n)
    for layer in range(cache.num_layers):
        for store in (cache.keys, cache.values):
            if (slot, layer) in store:
                store[slot, layer] = store[slot, layer][:n]
""",
    "08_reservation": """
def reserve(held, needs, block_size, free_blocks):
    running, preempted, i = list(range(len(held))), [], 0
    while i < len(running):
        lacking = max(0, -(-needs[i] // block_size) - held[i])
        while lacking > free_blocks and i < len(running):
            victim = running.pop()
            free_blocks += held[victim]
            preempted.append(victim)
        if i < len(running):
            free_blocks -= lacking
            i += 1
    return preempted
""",
    "09_tree_verify": """
import minispec as ms

def verify_tree(tree, target_probs, draft_probs, generator):
    proposal = ms.Proposal.from_tree(tree, draft_probs)
    return ms.verify(proposal, target_probs, generator)
""",
    "11_reduced_head": '''
import torch

import minispec as ms


class ReducedHeadDrafter:
    """Drafts from `model` through an LM head that scores only the ids in `keep`."""

    def __init__(self, model, keep):
        self.model, self.keep = model, torch.tensor(keep)

    def draft(self, context, k, sampling, generator):
        ids, rows = list(context), []
        outside = torch.ones(self.model.config.vocab_size, dtype=torch.bool)
        outside[self.keep] = False
        for _ in range(k):
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1]
            q = ms.probs_from_logits(logits.masked_fill(outside, float("-inf")), sampling, ids)
            token = int(ms.sample(q, generator))
            rows.append(q)
            ids.append(token)
        return ms.Draft(torch.tensor(ids[len(context):]), torch.stack(rows))
''',
    "12_two_bugs": FIXED_VERIFIER,
    "13_masked_verify": """
import minispec as ms

def masked_verify(draft_tokens, draft_probs, target_probs, masks, generator):
    p = target_probs * masks
    q = draft_probs * masks[:-1]
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    return ms.verify(ms.Proposal.chain(draft_tokens, q), p, generator, greedy=False).tokens
""",
}



def _cells(name: str) -> list[nbformat.NotebookNode]:
    notebook = nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _stub(name: str) -> str:
    """The source of the notebook's ``exercise`` cell."""
    return next(c.source for c in _cells(name) if "exercise" in c.metadata.get("tags", []))


#: Exercise 12's buggy verifier as the student first runs it: the stub without its ``raise``.
BUGGY_VERIFIER = "import torch\n" + re.sub(r"\n *raise NotImplementedError\(.*\)", "",
                                            _stub("12_two_bugs"))

#: A wrong solution per exercise (from the lab where one fits, else a classic mistake): the grader
#: cell must fail.
WRONG = {
    "01a_speculative_sampling": """
from minispec.check.bugs.samplers import sample_resample_from_p as speculative_sample
""",
    "01b_residual": "from minispec.check.bugs.samplers import residual_q_minus_p as residual\n",
    "02_acceptance": """
def acceptance_rate(p, q):
    return (p * q).sum(-1)          # the chance that two independent draws agree
""",
    "03_adjustment": """
import minispec as ms

def adjust(logits, temperature, top_k, top_p):     # temperature applied after the nucleus
    if temperature == 0:
        return ms.probs_from_logits(logits, ms.SamplingParams(0.0))
    kept = ms.probs_from_logits(logits, ms.SamplingParams(1.0, top_k, top_p)) > 0
    return (logits / temperature).masked_fill(~kept, float("-inf")).softmax(-1)
""",
    "04a_verify": ("from minispec.check.bugs.verifiers import verify_bonus_from_wrong_row "
                   "as verify\n"),
    "04b_greedy_verify": """
from minispec.check.bugs.verifiers import verify_greedy_rows_shifted as verify_greedy
""",
    "05_speedup": """
def walltime_speedup(alpha, gamma, c, r):
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + r))   # 0 / 0 at alpha = 1
""",
    "06_ngram_proposer": """
def propose(context, k):
    return [context[-1]] * k        # repeats the last token: no pattern continued
""",
    "07_cache_truncation": """
def truncate_to(cache, slot, n):
    cache.table.truncate_to(slot, n)   # the tensors are not cropped
""",
    "08_reservation": """
def reserve(held, needs, block_size, free_blocks):
    running, preempted, i = list(range(len(held))), [], 0
    while i < len(running):
        lacking = max(0, -(-needs[i] // block_size) - held[i])
        while lacking > free_blocks and i < len(running):
            preempted.append(running.pop())     # its blocks never go back to the pool
        if i < len(running):
            free_blocks -= lacking
            i += 1
    return preempted
""",
    "09_tree_verify": """
from minispec.check.bugs.verifiers import tree_siblings_against_p as verify_tree
""",
    "12_two_bugs": BUGGY_VERIFIER,
    "13_masked_verify": """
import minispec as ms

def masked_verify(draft_tokens, draft_probs, target_probs, masks, generator):
    p = target_probs * masks                       # q left unmasked: accepts too often
    p = p / p.sum(-1, keepdim=True)
    return ms.verify(ms.Proposal.chain(draft_tokens, draft_probs), p, generator,
                     greedy=False).tokens
""",
}

#: Exercise 11, wrong: it draws from the reduced head but declares the full head's q.
REDUCED_DECLARES_FULL = REFERENCES["11_reduced_head"].replace(
    "rows.append(q)", "rows.append(ms.probs_from_logits(logits, sampling, ids))  # V, not V'")
assert REDUCED_DECLARES_FULL != REFERENCES["11_reduced_head"]
WRONG["11_reduced_head"] = REDUCED_DECLARES_FULL

NAMES = sorted(REFERENCES)

#: The lessons' numbers: every exercise carries one of them.
LESSONS = sorted(p.stem[:2] for p in EXERCISES.parent.glob("[0-9][0-9]_*.ipynb"))


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


def test_exercises_are_numbered_as_their_lessons_and_ten_lessons_have_one():
    numbers = {re.fullmatch(r"(\d\d)[a-z]?_\w+", name).group(1) for name in NAMES}
    assert numbers <= set(LESSONS) and len(numbers) >= 10, sorted(numbers)
    for name in NAMES:      # its title says its number, and it links its lesson
        title = nbformat.read(EXERCISES / f"{name}.ipynb", as_version=4).cells[0].source
        assert title.startswith(f"# Exercise {name.split('_')[0]} — "), title.splitlines()[0]
        assert re.search(rf"\(\.\./{name[:2]}_\w+\.ipynb\)", title), name


@pytest.mark.parametrize("name", NAMES)
def test_the_lesson_links_its_exercise(name):
    (lesson,) = EXERCISES.parent.glob(f"{name[:2]}_*.ipynb")
    assert f"(exercises/{name}.ipynb)" in lesson.read_text(encoding="utf-8"), lesson.name


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_output_free_and_tagged(name):
    cells = _cells(name)
    assert all(not cell.outputs and cell.execution_count is None for cell in cells)
    tags = [tag for cell in cells for tag in cell.metadata.get("tags", [])]
    assert tags.count("exercise") == 1 and tags.count("grader") == 1
    assert "raise NotImplementedError" in _stub(name)


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


@pytest.mark.parametrize("fixed", ["uniform", "bonus"])
def test_each_bug_of_exercise_12_alone_fails(fixed):
    """Fixing one of the two bugs is not enough: the grader still fails on the other."""
    one = {"uniform": ("u * q[x]", "torch.rand((), generator=generator) * q[x]"),
           "bonus": ("target_probs[len(out) - 1]", "target_probs[len(out)]")}[fixed]
    assert one[0] in BUGGY_VERIFIER
    with pytest.raises(AssertionError, match="read the counterexample"):
        _run("12_two_bugs", BUGGY_VERIFIER.replace(*one))
