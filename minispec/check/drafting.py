"""Grade a student's drafter: its proposals agree with the ``q`` it declares, and decoding with it
is token-for-token plain greedy decoding.

A drafter is an object with ``draft(context, k, sampling, generator) -> Draft`` (as
[`minispec.NGramDrafter`][minispec.drafters.ngram.NGramDrafter] and
a [`minispec.ModelDrafter`][minispec.drafters.model.ModelDrafter] through
[`OneContext`][minispec.check.one_context.OneContext]; a minispec
[`Drafter`][minispec.drafters.base.Drafter] decodes as itself in the parity case, any other object
through [`ChainDrafter`][minispec.check.drafting.ChainDrafter]), or a plain function
``propose(context, k) -> list[int]`` (a deterministic drafter, e.g. an n-gram proposer). A
``Draft`` has ``tokens`` ``[n <= k]`` and ``probs`` ``[n, V]`` (the ``q`` each token was drawn
from) or ``None`` (deterministic: one-hot ``q``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.check import harness
from minispec.check.harness import GRADE_BUDGET, TIMEOUT, Failure, as_tokens, call, run_cases
from minispec.check.models import tiny_llama
from minispec.check.one_context import OneContext
from minispec.check.report import CheckReport, Counterexample, fmt
from minispec.check.statistics import BUDGET, expect_law, per_test_alpha
from minispec.core.sampling import SamplingParams
from minispec.core.sequence import Sequence
from minispec.core.speculative import Draft
from minispec.core.tree import Proposal
from minispec.decoding.loop import generate, speculative_generate
from minispec.drafters.base import Drafter
from minispec.drafters.model import ModelBackedDrafter
from minispec.models.llama import Llama

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.7, top_p=0.8)
#: Proposals per context in the consistency test of a drafter that declares its ``q``.
PROPOSALS = 150


class ChainDrafter(Drafter):
    """A one-context ``draft(context, k, sampling, generator) -> Draft`` as a minispec
    [`Drafter`][minispec.drafters.base.Drafter] of chains, for the decoding loop: called once per
    row, drafts beyond ``k`` cut."""

    def __init__(self, draft: Callable[..., Draft]) -> None:
        self.draft = draft

    def propose(self, seqs: list[Sequence], shapes: list[int]) -> list[Proposal]:
        drafts = [self.draft(list(seq.context), k, seq.sampling, seq.generator)
                  for seq, k in zip(seqs, shapes, strict=True)]
        return [Proposal.chain(d.tokens[:k], None if d.probs is None else d.probs[:k])
                for d, k in zip(drafts, shapes, strict=True)]


def from_function(fn: Callable[[list[int], int], Any]) -> Callable[..., Draft]:
    """A plain ``propose(context, k) -> ids`` function as a ``draft`` with one-hot ``q``; at most
    ``k + 1`` ids are read (a generator may never end), and ids that are not integers are kept
    for the check to report."""

    def draft(context: list[int], k: int, sampling: Any = None, generator: Any = None) -> Draft:
        return Draft(torch.tensor(list(itertools.islice(fn(list(context), k), k + 1))))

    return draft


def _declared_q(probs: Any, tokens: list[int], vocab: int) -> bool:
    """Whether ``probs`` is a real floating-point ``[n, V]`` tensor of distributions that gives
    each proposed token ``q > 0``."""
    if not (isinstance(probs, Tensor) and probs.is_floating_point()
            and probs.shape == (len(tokens), vocab)):
        return False
    probs = probs.double()
    return bool((probs >= 0).all() and ((probs.sum(-1) - 1).abs() < 1e-3).all()
                and all(probs[i, t] > 0 for i, t in enumerate(tokens)))


def _propose(draft: Callable, context: list[int], k: int, sampling: SamplingParams, g,
             vocab: int):
    """Call ``draft`` and check the draft's form; returns ``(tokens, probs or None)``."""
    inputs = {"context": context, "k": k, "temperature": sampling.temperature}
    out = call(draft, list(context), k, sampling, g, inputs=inputs)
    tokens, probs = as_tokens(out, inputs, k), getattr(out, "probs", None)
    inputs["proposed"] = tokens
    if any(not 0 <= t < vocab for t in tokens):
        raise Failure(Counterexample(f"a proposed id is not in [0, {vocab})", inputs))
    if probs is not None and not _declared_q(probs, tokens, vocab):
        raise Failure(Counterexample(
            "declared probs must be a real floating-point [n, V] tensor of distributions giving "
            "each proposed token q > 0 (the q it was drawn from)",
            dict(inputs, probs=f"{getattr(probs, 'dtype', type(probs).__name__)} "
                               f"{list(getattr(probs, 'shape', []))}")))
    return tokens, None if probs is None else probs.double()


def _contexts(vocab: int, g: torch.Generator) -> list[list[int]]:
    period = torch.randint(0, vocab, (5,), generator=g).tolist()
    return [torch.randint(0, vocab, (12,), generator=g).tolist(), period * 3 + period[:2],
            torch.randint(0, vocab, (2,), generator=g).tolist()]


def _form_case(draft: Callable, vocab: int, seed: int) -> str:
    g, declared = torch.Generator().manual_seed(seed), False
    for context, k, sampling in itertools.product(_contexts(vocab, g), (1, 3, 5),
                                                  (GREEDY, SAMPLED)):
        tokens, probs = _propose(draft, context, k, sampling, g, vocab)
        declared |= probs is not None
        if probs is None:                # one-hot q: the proposal cannot depend on randomness
            with harness.perturbed_global_rng(seed + 1):
                again, _ = _propose(draft, context, k, sampling,
                                    torch.Generator().manual_seed(seed + 7), vocab)
            if again != tokens:
                raise Failure(Counterexample(
                    "the drafter declares no q (probs=None: a deterministic, one-hot q) but "
                    "proposes different tokens for the same context when the random numbers "
                    "change; declare the q the tokens are sampled from",
                    {"context": context, "k": k, "run_1": tokens, "run_2": again}))
    return "18 calls; " + ("declares q" if declared else "deterministic (one-hot q)")


def _pit(probs: Tensor, tokens: list[int], g: torch.Generator) -> list[float]:
    """Randomised probability integral transform: ``U(0, 1)`` iff each token ~ its row."""
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.rand(len(tokens), generator=g, dtype=torch.float64)
    return [float(cdf[i, t] - probs[i, t] + u[i] * probs[i, t]) for i, t in enumerate(tokens)]


def _law_case(draft: Callable, vocab: int, seed: int) -> str:
    """The first token's counts against the declared ``q_1`` per context, then the PIT of all."""
    g, g_pit = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    contexts = _contexts(vocab, g)[:2]
    alpha, pits = per_test_alpha(len(contexts) + 1), []
    for context in contexts:
        counts, q1 = torch.zeros(vocab, dtype=torch.float64), None
        for _ in range(PROPOSALS):
            tokens, probs = _propose(draft, context, 3, SAMPLED, g, vocab)
            if probs is None or not tokens:
                return "nothing declared"
            counts[tokens[0]] += 1
            q1 = probs[0] if q1 is None else q1
            pits += _pit(probs, tokens, g_pit)
        expect_law(counts, q1, alpha, "the first proposed token does not follow the q the drafter "
                   "declares for it", {"context": context, "sampling": "temperature 0.7, top-p "
                                       "0.8", "calls": PROPOSALS})
    bins = torch.bincount((torch.tensor(pits) * 10).long().clamp(0, 9), minlength=10)
    fitted = expect_law(bins, torch.full((10,), 0.1, dtype=torch.float64), alpha,
                        "the proposals at later positions do not follow their declared q (the "
                        "randomised PIT u = F(x-) + U q(x) must be uniform)",
                        {"tokens tested": len(pits)}, lambda i: f"u in [{i / 10}, {(i + 1) / 10})")
    return f"{len(contexts) * PROPOSALS} calls; PIT p-value {fmt(fitted.pvalue)}"


def _pattern_case(draft: Callable, vocab: int) -> str:
    context = [3, 1, 4, 5, 9] * 3 + [3, 1]
    tokens, _ = _propose(draft, context, 3, GREEDY, torch.Generator().manual_seed(0), vocab)
    if tokens != [4, 5, 9]:
        raise Failure(Counterexample(
            "on a context that repeats a pattern, the drafter must propose its continuation",
            {"context": context, "k": 3, "proposed": tokens, "expected": [4, 5, 9]}))
    return f"proposed {tokens}"


def _parity_case(d: Drafter, target: Llama, vocab: int, seed: int) -> str:
    for prompt in _contexts(vocab, torch.Generator().manual_seed(seed))[:2]:
        plain = generate(target, prompt, 24).tokens
        inputs = {"prompt": prompt, "k": 3, "max_new_tokens": 24}
        spec = call(speculative_generate, target, d, prompt, 24, 3, inputs=inputs).tokens
        if spec != plain:
            raise Failure(Counterexample("greedy speculative decoding with this drafter differs "
                                         "from plain greedy decoding",
                                         dict(inputs, plain=plain, speculative=spec)))
    return "2 prompts, 24 tokens"


def drafter(obj: Any, *, target: Llama | None = None, continues_patterns: bool = False,
            seed: int = 0, timeout: float = TIMEOUT, budget: float = GRADE_BUDGET) -> CheckReport:
    """Check a drafter: well-formed proposals that agree with the declared ``q``, and parity.

    Cases, in order:

    1. *well-formed*: 18 proposals (3 contexts, ``k`` in 1, 3, 5, greedy and sampled settings)
       have at most ``k`` ids in ``[0, V)`` and, when ``q`` is declared, ``[n, V]`` rows giving
       each token ``q > 0``; a drafter that declares no ``q`` (one-hot) must propose the same
       tokens whatever the random numbers;
    2. *the declared q is the law* (drafters that declare ``q``): 150 proposals on each of 2
       contexts at temperature 0.7, top-p 0.8; the first token's counts against the declared
       ``q_1`` (Pearson), and the randomised PIT of every token against its row (uniform in 10
       bins): catches tokens taken greedily but declared as sampled, and adjustments applied to
       one side only;
    3. *continues a pattern* (``continues_patterns=True``, for n-gram and prompt-lookup drafters):
       after ``3 1 4 5 9 3 1 4 5 9 3 1 4 5 9 3 1`` it proposes ``4 5 9``;
    4. *parity*: greedy ``speculative_generate`` with the drafter (``k = 3``, 24 tokens, 2 prompts)
       equals plain ``generate``, token for token.

    **False alarms.** Only case 2 is statistical: 3 tests at ``alpha = 8.3e-5`` (Bonferroni on a
    quarter of ``1e-3``, see [`minispec.check.statistics`][minispec.check.statistics]); the other
    cases are exact. So a correct drafter fails for at most 1 seed in
    1000; the fixed seed gives the same verdict on every run.

    Args:
        obj: the drafter (see the module docstring).
        target: the target model for the parity case; by default a tiny random Llama with the
            drafter's vocabulary and EOS ids (those of ``obj.model.config``, else 64 tokens).
        continues_patterns: also run case 3.
        seed: seeds contexts, prompts and generators.
        timeout: seconds each call of the drafter (each ``draft``, and each whole decoding of
            the parity case) may take before the check fails it (no hang).
        budget: seconds the whole check may take; past it the check fails, saying how many
            cases it ran ([`run_cases`][minispec.check.harness.run_cases]).

    Returns:
        A [`CheckReport`][minispec.check.report.CheckReport].
    """
    draft = (from_function(obj) if callable(obj) else
             OneContext(obj).draft if isinstance(obj, ModelBackedDrafter) else obj.draft)
    model = getattr(obj, "model", None)
    if target is None:
        own = model.config if isinstance(model, Llama) else None     # share its ids and EOS
        target = tiny_llama(own.vocab_size if own else 64, seed=seed + 100,
                            eos=own.eos_token_id if own else None)
    vocab = target.config.vocab_size
    loop = obj if isinstance(obj, Drafter) else ChainDrafter(draft)
    cases = [("proposals are well-formed", lambda: _form_case(draft, vocab, seed)),
             ("declared q is the law of the proposals",
              lambda: _law_case(draft, vocab, seed + 2))]
    if continues_patterns:
        cases.append(("continues a repeated pattern", lambda: _pattern_case(draft, vocab)))
    cases.append(("greedy decoding with it equals plain greedy decoding",
                  lambda: _parity_case(loop, target, vocab, seed + 3)))
    return run_cases("drafter", cases, BUDGET, timeout, budget)
