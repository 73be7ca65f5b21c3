"""Draft trees from an EAGLE head (:class:`minispec.extra_drafters.eagle.EagleDrafter`).

The tiny random targets and heads are those of tests/test_eagle.py; the law check is the sampled
tree test's of tests/test_tree_attention.py, with the head as the drafter. Three properties:

* greedy: the output is the target's, for several branchings, full and reduced ``V'``;
* sampled: the first two tokens follow the target's exact law (chi-square over seeds), and the
  check has power (a wrong ``q`` is caught);
* features: after each verify the head gets the target's features of the root and the ACCEPTED
  path only, and every tree it drafts equals an uncached reference tree (each node fed its
  parent's predicted feature, the context's pairs fed the target's real features).
"""

from __future__ import annotations

import pytest
import torch
from test_eagle import every_other, full_hidden, random_head, self_copy_head
from test_real_model import GROUNDED, chat_ids, eagle, smol  # noqa: F401 (fixtures)
from test_real_model import PROMPTS as CHAT_PROMPTS
from test_tree_attention import law_models, law_pvalue  # noqa: F401 (fixture)
from tinymodels import tiny_llama

import minispec as ms
from minispec.core.tree import Proposal
from minispec.decoding import runner
from minispec.extra_drafters.eagle import EagleDrafter

NEW = 24
PROMPTS = [[1], [1, 2], [5, 6, 5, 6, 5], list(range(10, 22)), list(range(20, 44))]
BRANCHINGS = [(3, 2, 1, 1), (2, 2, 2), (1,), (4,)]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_tree_output_is_the_targets(target, vocab):
    head = random_head(target, None if vocab == "full" else every_other(target.config.vocab_size))
    for prompt in PROMPTS:
        base = ms.generate(target, prompt, NEW).tokens
        for branching in BRANCHINGS:
            out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=4,
                                          branching=branching)
            assert out.tokens == base and out.finish_reason == "length"
            assert out.stats.target_forwards == out.stats.rounds


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_a_head_that_knows_the_target_gets_a_tree_accepted(vocab):
    """On a one-layer target the self-copy head drafts well: a tree accepts at least its chain."""
    target = tiny_llama(seed=0, layers=1)
    head = self_copy_head(target,
                          None if vocab == "full" else every_other(target.config.vocab_size))
    per_forward = {}
    for branching in [(1,), (3, 2, 1, 1)]:
        tokens = forwards = 0
        for prompt in PROMPTS:
            out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=4,
                                          branching=branching)
            assert out.tokens == ms.generate(target, prompt, NEW).tokens
            if vocab == "reduced":                   # q = 0 outside V': never an odd draft
                assert all(d % 2 == 0 for r in out.rounds for d in r.drafts)
            tokens, forwards = tokens + len(out.tokens), forwards + out.stats.target_forwards
        per_forward[branching] = tokens / forwards
    assert per_forward[(1,)] > 1.5                                    # drafts do get accepted
    assert per_forward[(3, 2, 1, 1)] >= per_forward[(1,)]


def test_a_tree_drafter_is_refused_for_another_target(target):
    head = random_head(target)
    with pytest.raises(ValueError, match="another target"):
        ms.speculative_generate(tiny_llama(seed=0), EagleDrafter(head), [1, 2], 5, k=2,
                                branching=(2,))


# ---------------------------------------------------------------------- sampled law


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_sampled_tree_output_has_the_target_law(law_models, vocab):  # noqa: F811
    """Depth-2 trees with 2 draws per node; with ``V' = {0, 2, 4}`` q is zero on 1 and 3."""
    target, _, law = law_models
    head = random_head(target, None if vocab == "full" else every_other(5), seed=4)
    assert law_pvalue(target, EagleDrafter(head), law, 2000) > 1e-3   # false alarm: 1e-3


def test_the_eagle_law_test_catches_a_wrong_q(law_models, monkeypatch):  # noqa: F811
    """Power: the same check, with the draws verified against a q they were not drawn from."""
    target, _, law = law_models
    monkeypatch.setattr(runner, "verify", wrong_q(runner.verify))
    assert law_pvalue(target, EagleDrafter(random_head(target, seed=4)), law, 1000) < 1e-3


# ---------------------------------------------------------------------- features


def reference_tree(target, head, context: list[int], branching) -> tuple[list[int], list[int]]:
    """Greedy tree with no cache, breadth-first ``(tokens, parents)``: the head over the pairs
    of the target's real features of ``context[:-1]``, then, below a node, its ancestors' pairs
    fed with the head's own predicted features."""
    with torch.inference_mode():
        real = full_hidden(target, context[:-1])[None]                          # (1, n-1, D)
        tokens, parents, frontier = [context[-1]], [-1], [([], real)]           # (path, features)
        nodes = [0]
        for b in branching:
            next_frontier, next_nodes = [], []
            for (path, features), node in zip(frontier, nodes, strict=True):
                ids = torch.tensor([context[1:] + path])
                logits, predicted = head(ids, features, torch.arange(ids.shape[1])[None])
                full = torch.full((target.config.vocab_size,), float("-inf"))
                full[head.vocab] = logits[0, -1]
                for token in full.topk(b).indices.tolist():
                    tokens.append(token)
                    parents.append(node)
                    next_nodes.append(len(tokens) - 1)
                    next_frontier.append((path + [token],
                                          torch.cat([features, predicted[:, -1:]], dim=1)))
            frontier, nodes = next_frontier, next_nodes
    return tokens, parents


class TreeSpy:
    """Records every proposal (its context; tokens and parents in creation order, as
    :func:`reference_tree` makes them) and every ``observe`` call, with the context of ``seq``
    then (a round with no room for drafts observes a root-only tree it did not draw)."""

    def __init__(self, drafter: EagleDrafter):
        self.proposals, self.observed = [], []
        propose, observe = drafter.propose, drafter.observe

        def propose_hook(seqs, shapes):
            proposals = propose(seqs, shapes)
            (seq,), (branching,), (proposal,) = seqs, shapes, proposals     # one sequence
            self.proposal = proposal
            if branching:
                tree, created = proposal.tree, proposal.created    # depth-first -> creation id
                tokens, parents = [0] * len(tree), [-1] * len(tree)
                for i, c in enumerate(created):
                    tokens[c] = tree.tokens[i]
                    parents[c] = created[tree.parents[i]] if i else -1
                self.proposals.append((list(seq.context), branching, tokens, parents))
            return proposals

        def observe_hook(seqs, num_accepted, hidden, paths):
            tree, path = self.proposal.tree, paths[0]
            accepted = [tree.tokens[i] for i in path]
            siblings = [tree.tokens[i] for i in range(1, len(tree)) if tree.parents[i] == 0]
            self.observed.append((list(seqs[0].context), accepted, hidden[0].clone(), siblings))
            observe(seqs, num_accepted, hidden, paths)

        drafter.propose, drafter.observe = propose_hook, observe_hook


def check_features(target, spy: TreeSpy) -> None:
    """Each verify hands ``len(path) + 1`` rows: the target's features at the root and the accepted
    drafts, as a forward over the committed tokens computes them."""
    for context, accepted, hidden, _ in spy.observed:
        n = len(context)
        assert hidden.shape == (len(accepted) + 1, target.config.hidden_size)
        assert torch.allclose(hidden, full_hidden(target, context + accepted)[n - 1:], atol=1e-5)


def spied_run(target, head, prompt, branching, k=4) -> TreeSpy:
    drafter = EagleDrafter(head, 96)
    spy = TreeSpy(drafter)
    ms.speculative_generate(target, drafter, prompt, NEW, k=k, branching=branching, max_seq_len=96)
    return spy


def wrong_q(right):
    """The runner's ``verify`` judging every draw against a ``q`` it was not drawn from."""
    def verify(proposal, p, generator=None, **kwargs):
        draws = [[(c, None if q is None else 0.5 * q + 0.5 / q.shape[-1]) for c, q in d]
                 for d in proposal.draws]
        return right(Proposal(proposal.tree, draws, proposal.created), p, generator, **kwargs)
    return verify


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_the_head_only_gets_features_of_the_accepted_path(vocab):
    target = tiny_llama(seed=0, layers=1)                 # a self-copy head: paths get accepted
    head = self_copy_head(target,
                          None if vocab == "full" else every_other(target.config.vocab_size))
    spies = [spied_run(target, head, prompt, (3, 2, 1, 1)) for prompt in PROMPTS]
    observed = [o for spy in spies for o in spy.observed]
    assert any(len(a) > 0 for _, a, _, _ in observed) and any(len(a) < 4 for _, a, _, _ in observed)
    for spy in spies:
        check_features(target, spy)


def test_the_feature_check_fails_when_rejected_nodes_are_passed():
    """Not vacuous: the features of a rejected sibling's path in place of the accepted one's are
    caught, and so is one row too many (the first rejected draft's)."""
    target = tiny_llama(seed=0, layers=1)
    spy = spied_run(target, self_copy_head(target), PROMPTS[3], (3, 2, 1, 1))
    context, accepted, hidden, siblings = next(o for o in spy.observed if o[1])
    n, other = len(context), next(t for t in siblings if t != accepted[0])
    for wrong in (full_hidden(target, context + [other] + accepted[1:])[n - 1:],
                  full_hidden(target, context + accepted + [other])[n - 1:]):
        spy.observed = [(context, accepted, wrong, siblings)]
        with pytest.raises(AssertionError):
            check_features(target, spy)


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_every_tree_equals_an_uncached_reference(target, vocab):
    """Round by round the cached tree (tree attention in the head's layer, compaction of the real
    pairs) is the reference tree of the committed context: a head fed a rejected node's feature,
    or keeping a node fed with its own guess, drafts another tree."""
    head = random_head(target, None if vocab == "full" else every_other(target.config.vocab_size))
    rounds = 0
    for prompt in PROMPTS[1:4]:
        for branching in [(3, 2, 1, 1), (2, 2, 2)]:
            spy = spied_run(target, head, prompt, branching)
            for context, depth_branching, tokens, parents in spy.proposals:
                assert (tokens, parents) == reference_tree(target, head, context, depth_branching)
                rounds += 1
            check_features(target, spy)
    assert rounds > 20


# ---------------------------------------------------------------------- the shipped head


@pytest.mark.slow
@pytest.mark.parametrize("text", ["open-ended", "grounded"])
def test_shipped_head_trees_on_smollm2(smol, eagle, text):  # noqa: F811 (fixtures)
    """SmolLM2 with its shipped head (skipped offline, as tests/test_real_model.py): greedy trees
    give the target's greedy output, and accept at least as much per target forward as the chain
    (the chain is the tree's first-child path)."""
    model, tokenizer, _, _ = smol
    ids = chat_ids(tokenizer, {"open-ended": CHAT_PROMPTS[0], "grounded": GROUNDED}[text])
    base = ms.generate(model, ids, 48).tokens
    chain = ms.speculative_generate(model, eagle, ids, 48, k=4, adaptive=False)
    tree = ms.speculative_generate(model, eagle, ids, 48, k=4, branching=(3, 2, 1, 1))
    assert tree.tokens == chain.tokens == base
    assert tree.stats.tokens_per_target_forward >= chain.stats.tokens_per_target_forward
