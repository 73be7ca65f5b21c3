"""One accept walk: ``ms.verify`` is what both drivers run, for every live row of every round.

``minispec.decoding.runner.verify`` (the name the runner calls) is replaced by a recorder that
delegates to the real function; ``SpeculativeRunner.score`` (the round's scoring phase) is wrapped
to tie each recorded call to its row. Then ``speculative_generate`` and the ``Engine`` run chains
and trees, greedy (the argmaxes alone, or one-hot rows under a repetition penalty) and sampled,
and the test asserts that:

* every round calls the walk exactly once per live row, on that row's own proposal, and the verdict
  it returns is the one the round uses;
* a request's calls are its rounds: as many as ``stats.rounds``, with the depths and accepted counts
  of ``stats.drafted_per_round`` and ``stats.accepted_per_round``;
* chains and trees, argmaxes and distributions all reach it (the proposal's nodes and the kind
  of target are recorded);
* the tokens are those of a run without the recorder.

The last tests check that no second accept function is left in the package.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass

import pytest
import torch
from tinymodels import noisy_copy, tiny_llama

import minispec as ms
import minispec.core.speculative as speculative
import minispec.core.tree as tree_module
from minispec.decoding import runner
from minispec.decoding.runner import SpeculativeRunner

NEW = 16
PROMPTS = [[1, 2, 3], [5, 6, 5, 6, 5], list(range(10, 22)), [40, 41, 42, 40, 41]]
SAMPLINGS = {
    "greedy": lambda i: ms.SamplingParams(temperature=0.0),                      # argmaxes only
    "greedy-penalty": lambda i: ms.SamplingParams(temperature=0.0, repetition_penalty=1.3),
    "sampled": lambda i: ms.SamplingParams(temperature=1.0, top_k=20, seed=100 + i),
}
#: what the walk is given per sampling: the argmax ids (a list) or ``[N, V]`` rows (a tensor)
ARGMAXES = {"greedy": True, "greedy-penalty": False, "sampled": False}
SHAPES = {"chain": None, "tree": (3, 2, 1)}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    """The tiny pair in float64 (as in test_round.py: batched and single forwards then agree on
    every sampled draw)."""
    target = tiny_llama(seed=0)
    return target.double(), noisy_copy(target, 0.05, seed=None).double()


@dataclass
class Call:
    """One call of the walk: what it was given and what it returned."""

    proposal: ms.Proposal
    nodes: int
    argmaxes: bool                 # target given as a list of argmax ids, not [N, V] rows
    verdict: ms.Verdict


class Recorder:
    """Stands in for ``runner.verify``: records every call, then delegates to the real walk. The
    wrapped ``SpeculativeRunner.score`` files each round's calls under their rows."""

    def __init__(self, monkeypatch):
        self.calls: list[Call] = []
        self.rounds: list[int] = []                   # live rows of every verify phase
        self.by_row: dict[int, list[Call]] = {}       # id(seq.stats) -> that row's calls
        real, phase = speculative.verify, SpeculativeRunner.score
        assert runner.verify is real                  # the runner calls the one walk

        def verify(proposal, target, generator=None, **kwargs):
            verdict = real(proposal, target, generator, **kwargs)
            argmaxes = not isinstance(target, torch.Tensor)
            if argmaxes:
                assert len(target) == len(proposal.tree) and verdict.final_probs is None
            else:
                assert target.shape[0] == len(proposal.tree)
            self.calls.append(Call(proposal, len(proposal.tree), argmaxes, verdict))
            return verdict

        def verify_phase(this, seqs, proposals):
            live = [b for b, seq in enumerate(seqs) if not seq.is_finished]
            start = len(self.calls)
            verdicts, hidden = phase(this, seqs, proposals)
            made = self.calls[start:]
            assert len(made) == len(live), "the walk must run once per live row"
            self.rounds.append(len(live))
            returned = {id(call.verdict): call for call in made}
            for b in live:                            # each row's verdict came from its own call
                call = returned.pop(id(verdicts[b]))
                assert call.proposal is proposals[b]
                self.by_row.setdefault(id(seqs[b].stats), []).append(call)
            assert not returned
            return verdicts, hidden

        monkeypatch.setattr(runner, "verify", verify)
        monkeypatch.setattr(SpeculativeRunner, "score", verify_phase)

    def check(self, result: ms.GenerationResult, argmaxes: bool, tree: bool) -> list[Call]:
        """A request's calls are its rounds, with their depths and accepted counts."""
        calls = self.by_row[id(result.stats)]
        stats = result.stats
        assert len(calls) == stats.rounds == stats.target_forwards > 0
        assert [c.proposal.depth for c in calls] == stats.drafted_per_round
        assert [c.verdict.num_accepted for c in calls] == stats.accepted_per_round
        assert all(c.argmaxes == argmaxes for c in calls)
        assert all(c.nodes == len(c.proposal.tree) for c in calls)
        if tree:
            assert any(not c.proposal.is_chain for c in calls)      # real trees were walked
        else:
            assert all(c.proposal.is_chain and c.nodes == c.proposal.depth + 1 for c in calls)
        return calls


def _same(plain: ms.GenerationResult, recorded: ms.GenerationResult) -> None:
    assert recorded.tokens == plain.tokens
    assert recorded.stats.accepted_per_round == plain.stats.accepted_per_round
    assert recorded.stats.drafted_per_round == plain.stats.drafted_per_round


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_speculative_generate_runs_the_one_walk_every_round(pair, monkeypatch, shape, sampling):
    target, draft = pair
    branching = SHAPES[shape]
    runs = [(prompt, SAMPLINGS[sampling](i)) for i, prompt in enumerate(PROMPTS[:2])]

    def generate(prompt, sp):
        return ms.speculative_generate(target, draft, prompt, NEW, k=3, sampling=sp,
                                       branching=branching)

    plain = [generate(prompt, sp) for prompt, sp in runs]
    recorder = Recorder(monkeypatch)
    for (prompt, sp), alone in zip(runs, plain, strict=True):
        before = len(recorder.calls)
        out = generate(prompt, sp)
        _same(alone, out)
        calls = recorder.check(out, ARGMAXES[sampling], branching is not None)
        assert len(recorder.calls) - before == len(calls)        # one row: every call is its
    assert recorder.rounds and set(recorder.rounds) == {1}
    assert any(c.verdict.num_accepted > 0 for c in recorder.calls)   # drafts were accepted


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_engine_runs_the_one_walk_for_every_live_row(pair, monkeypatch, shape):
    """Greedy, penalised greedy and sampled requests share the engine's batches."""
    target, draft = pair
    branching = SHAPES[shape]
    kinds = [list(SAMPLINGS)[i % len(SAMPLINGS)] for i in range(len(PROMPTS))]
    params = [SAMPLINGS[kind](i) for i, kind in enumerate(kinds)]

    def run():
        engine = ms.Engine(target, drafter=draft, k=3, branching=branching, max_batch_size=3,
                           block_size=4, adaptive=False)
        outs = engine.generate(PROMPTS, params, progress=False, max_new_tokens=NEW)
        return engine, outs

    _, plain = run()
    recorder = Recorder(monkeypatch)
    engine, outs = run()
    for alone, out, kind in zip(plain, outs, kinds, strict=True):
        _same(alone, out)
        recorder.check(out, ARGMAXES[kind], branching is not None)
    assert len(recorder.calls) == sum(o.stats.rounds for o in outs) == sum(recorder.rounds)
    assert len(recorder.rounds) == engine.target_forwards            # one verify phase a step
    assert max(recorder.rounds) > 1                                  # rows did share rounds
    assert {c.argmaxes for c in recorder.calls} == {True, False}
    # and it is the same walk speculative_generate runs: a request alone gets the same tokens
    for prompt, sp, out in zip(PROMPTS, params, outs, strict=True):
        alone = ms.speculative_generate(target, draft, prompt, NEW, k=3, sampling=sp,
                                        branching=branching)
        assert alone.tokens == out.tokens


def test_plain_decoding_walks_a_chain_of_no_drafts(pair, monkeypatch):
    target, _ = pair
    for sp, argmaxes in ((ms.SamplingParams(temperature=0.0), True),
                         (ms.SamplingParams(temperature=1.0, seed=3), False)):
        plain = ms.generate(target, PROMPTS[0], NEW, sampling=sp)
        with monkeypatch.context() as patch:
            recorder = Recorder(patch)
            out = ms.generate(target, PROMPTS[0], NEW, sampling=sp)
        assert out.tokens == plain.tokens
        calls = recorder.check(out, argmaxes, tree=False)
        assert len(calls) == NEW and all(c.nodes == 1 for c in calls)


# ---------------------------------------------------------------------- one accept function

REMOVED = ["verify_batch", "verify_greedy", "GreedyVerdict", "speculative_sample_batch",
           "verify_tree", "verify_proposal", "walk_greedy", "TreeVerdict", "TreeProposal",
           "_try_proposals"]


def test_there_is_one_accept_walk():
    assert [n for n in speculative.__all__ if n.startswith("verify")] == ["verify"]
    assert [n for n in speculative.__all__ if "Verdict" in n] == ["Verdict"]
    assert ms.verify is speculative.verify is runner.verify
    assert ms.Verdict is speculative.Verdict and ms.Proposal is tree_module.Proposal
    assert ms.iterative_speculative_sample is speculative.iterative_speculative_sample
    names = [n for n, obj in vars(tree_module).items() if callable(obj)]
    names += [n for cls in (tree_module.DraftTree, tree_module.Proposal) for n in vars(cls)]
    assert not [n for n in names if n.startswith(("verify", "walk"))]
    for module in (ms, ms.core, speculative, tree_module, runner):
        assert not [n for n in REMOVED if hasattr(module, n)], module.__name__


def test_no_other_module_defines_an_accept_function():
    """Every top-level function named ``verify*`` or ``walk*`` in the layers below the graders is
    the one walk (``minispec.check`` holds the students' signatures and the lab's bugs)."""
    found = []
    for package in ("minispec.core", "minispec.decoding", "minispec.drafters",
                    "minispec.serving"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (inspect.isfunction(obj) and obj.__module__ == info.name
                        and name.lstrip("_").startswith(("verify", "walk"))):
                    found.append(f"{info.name}.{name}")
    assert found == ["minispec.core.speculative.verify"]
