"""Benchmarks: minispec against transformers on one sequence, and the cost model, measured.

Two questions, two entry points:

* [`run_speed`][minispec.tools.bench.run_speed] -- how fast is each way of decoding the same greedy
  continuation? minispec's ``generate``, ``speculative_generate`` with the draft model (every
  ``k``), with n-gram tables and with prompt lookup, against transformers' ``generate`` (greedy,
  assisted generation with the draft as assistant, prompt lookup). Every method's tokens are
  checked against minispec greedy: greedy speculation must not change a single token.
* [`measure_costs`][minispec.tools.bench.measure_costs] -- the quantities of Leviathan's
  Theorem 3.8 on *this* machine: the acceptance rate ``alpha``, the cost ratio ``c`` and the verify
  ratio ``r(gamma) = t(target forward of gamma + 1 tokens) / t(one-token forward)``.
  [`predict`][minispec.tools.bench.predict] turns them into the speedup the cost model expects,
  ``E[tokens](alpha, gamma) / (gamma c + r(gamma))``, next to the paper's ``r = 1`` form.

Timing protocol: [`lockstep.interleave`][minispec.tools.lockstep.interleave], the package's one
way of timing runs: every repeat runs every method on every prompt, in turn, the order reversed
every other repeat, so a machine whose load changes during the run slows all methods alike; the
first ``warmup`` repeats are thrown away; the reported time of a method is the median over repeats
of its total time on the prompt set. ``minispec bench`` (see `minispec.tools.cli`) drives both and
writes JSON and a plot.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from minispec.core import theory
from minispec.decoding.loop import generate, speculative_generate
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import NGramDrafter, PromptLookupDrafter
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama
from minispec.speed.goodput import StepCosts
from minispec.tools import records
from minispec.tools.lockstep import interleave

__all__ = [
    "PROMPTS",
    "REPETITIVE_PROMPTS",
    "Costs",
    "Method",
    "MethodResult",
    "hf_greedy",
    "measure_costs",
    "predict",
    "run_speed",
    "time_methods",
]

#: Eight fixed prompts in the style of the training text (public-domain Shakespeare).
PROMPTS: tuple[str, ...] = (
    "ROMEO.\nBut soft, what light through yonder window breaks?\n",
    "HAMLET.\nTo be, or not to be, that is the question:\n",
    "GLOUCESTER.\nNow is the winter of our discontent\nMade glorious summer by this sun of York;\n",
    "SCENE I. Elsinore. A platform before the Castle.\n\nEnter Francisco and Barnardo.\n",
    "MACBETH.\nIs this a dagger which I see before me,\n",
    "PORTIA.\nThe quality of mercy is not strain'd,\n",
    "JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\n",
    "FIRST WITCH.\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n",
)

_PASSAGES: tuple[str, ...] = (
    "FIRST CITIZEN.\nBefore we proceed any further, hear me speak.\n\nALL.\nSpeak, speak.\n\n",
    "SECOND WITCH.\nFillet of a fenny snake,\nIn the cauldron boil and bake;\n\n",
    "KING.\nCome, let us go.\n\nQUEEN.\nI follow you, my lord.\n\n[Exeunt.]\n\n",
    "MESSENGER.\nMy lord, the army of the king is near.\n\nLORD.\nThen let us arm.\n\n",
    "NURSE.\nMadam!\n\nJULIET.\nNurse?\n\nNURSE.\nYour lady mother is coming to your chamber.\n\n",
    "HAMLET.\nWords, words, words.\n\nPOLONIUS.\nWhat is the matter, my lord?\n\n",
    "ALL.\nDouble, double, toil and trouble;\nFire burn and cauldron bubble.\n\n",
    "GLOUCESTER.\nNow, my lord, what news?\n\nMESSENGER.\nThe king is dead.\n\n",
)

#: Prompts that repeat a passage three times and start a fourth copy: text an n-gram table or
#: prompt lookup predicts well (the situation of code, templates and quoted context).
REPETITIVE_PROMPTS: tuple[str, ...] = tuple(3 * p + p[: len(p) // 2] for p in _PASSAGES)


# ------------------------------------------------------------------------------------ speed


@dataclass
class Method:
    """One way of decoding: ``run(prompt_ids) -> (new tokens, stats or None)``."""

    name: str
    family: str                      # "minispec" or "transformers"
    prompt_set: str                  # "shakespeare" or "repetitive"
    run: Callable[[list[int]], tuple[list[int], object]]
    k: int | str | None = None       # drafts per round, "auto" for goodput k (adaptive=True)


@dataclass
class MethodResult:
    """Timing and outcome of one method over its prompt set."""

    name: str
    family: str
    prompt_set: str
    k: int | str | None
    seconds: float                   # median over repeats of the total time on the prompt set
    seconds_all: list[float]         # each repeat's total
    tokens: int                      # new tokens over the prompt set
    tokens_per_s: float
    token_equal: bool | None         # identical to minispec greedy on every prompt (None: sampled)
    mismatches: list[int] = field(default_factory=list)      # prompt indices that differ
    vs_minispec_greedy: float = float("nan")                 # speedup over minispec generate
    vs_hf_greedy: float = float("nan")                       # speedup over transformers generate
    acceptance_rate: float = float("nan")
    tokens_per_round: float = float("nan")
    target_forwards: int = 0
    mean_k: float = float("nan")


def _runners(target: Llama, max_new_tokens: int):
    """``(plain, with_drafter)``: run functions ``ids -> (tokens, stats)`` for the timing loop."""
    def plain(ids):
        out = generate(target, ids, max_new_tokens)
        return out.tokens, out.stats

    def with_drafter(make, k, adaptive=False):
        def run(ids):
            out = speculative_generate(target, make(), ids, max_new_tokens, k=k,
                                       adaptive=adaptive)
            return out.tokens, out.stats
        return run

    return plain, with_drafter


def _minispec_methods(target: Llama, draft: Llama | None, ks: Sequence[int], max_new_tokens: int,
                      adaptive: bool) -> list[Method]:
    plain, with_drafter = _runners(target, max_new_tokens)
    methods = [Method("minispec generate", "minispec", "shakespeare", plain)]
    if draft is not None:
        methods += [Method(f"minispec draft k={k}", "minispec", "shakespeare",
                           with_drafter(lambda: ModelDrafter(draft), k), k) for k in ks]
        if adaptive:
            methods.append(Method("minispec draft k=auto", "minispec", "shakespeare",
                                  with_drafter(lambda: ModelDrafter(draft), max(ks), True),
                                  "auto"))
    return methods


def _ngram_methods(target: Llama, draft: Llama | None, k_best: int, k_ngram: int,
                   max_new_tokens: int) -> list[Method]:
    plain, with_drafter = _runners(target, max_new_tokens)
    methods = [Method("minispec generate", "minispec", "repetitive", plain)]
    if draft is not None:
        methods.append(Method(f"minispec draft k={k_best}", "minispec", "repetitive",
                              with_drafter(lambda: ModelDrafter(draft), k_best), k_best))
    for prompt_set in ("shakespeare", "repetitive"):
        methods += [
            Method(f"minispec n-gram k={k_ngram}", "minispec", prompt_set,
                   with_drafter(NGramDrafter, k_ngram), k_ngram),
            Method(f"minispec prompt lookup k={k_ngram}", "minispec", prompt_set,
                   with_drafter(PromptLookupDrafter, k_ngram), k_ngram),
        ]
    return methods


def hf_greedy(hf_model, max_new_tokens: int) -> Callable[..., tuple[list[int], None]]:
    """``run(ids, **generate_kwargs) -> (new tokens, None)``: transformers' greedy ``generate``."""
    eos = hf_model.config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos

    def run(ids, **kwargs):
        input_ids = torch.tensor([ids])
        with torch.inference_mode():
            out = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                    max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=pad, **kwargs)
        return out[0, len(ids):].tolist(), None

    return run


def _hf_methods(target_dir, draft_dir, ks: Sequence[int], k_ngram: int,
                max_new_tokens: int) -> list[Method]:
    """transformers' own decoding of the same checkpoints (fp32, eager CPU), greedy."""
    from transformers import AutoModelForCausalLM

    hf_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    hf_draft = (AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
                if draft_dir is not None else None)
    call = hf_greedy(hf_target, max_new_tokens)

    def assisted(k):
        def run(ids):
            # transformers 5 reads the assistant's settings from the assistant's own
            # generation_config (arguments to generate() are ignored). Constant schedule, and no
            # confidence-based early stop: exactly k drafts per round, like minispec.
            config = hf_draft.generation_config
            config.num_assistant_tokens = k
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
            return call(ids, assistant_model=hf_draft)
        return run

    methods = [Method("transformers generate", "transformers", "shakespeare",
                      lambda ids: call(ids))]
    if hf_draft is not None:
        methods += [Method(f"transformers assisted k={k}", "transformers", "shakespeare",
                           assisted(k), k) for k in ks]
    for prompt_set in ("shakespeare", "repetitive"):
        methods.append(Method(f"transformers prompt lookup k={k_ngram}", "transformers", prompt_set,
                              lambda ids: call(ids, prompt_lookup_num_tokens=k_ngram), k_ngram))
    methods.append(Method("transformers generate", "transformers", "repetitive",
                          lambda ids: call(ids)))
    return methods


def run_speed(target: Llama, draft: Llama | None, prompt_sets: dict[str, list[list[int]]], *,
              max_new_tokens: int = 128, ks: Sequence[int] = tuple(range(1, 9)),
              k_ngram: int = 4, hf_ks: Sequence[int] = (2, 4), repeats: int = 5, warmup: int = 1,
              target_dir=None, draft_dir=None, adaptive: bool = False,
              ngram: bool = True, log: Callable[[str], None] | None = print,
              clock: Callable[[], float] = time.perf_counter) -> list[MethodResult]:
    """Time every method on its prompt set (round-robin, medians) and check its tokens.

    Args:
        target: the minispec target model.
        draft: the minispec draft model (``None``: no draft-model methods).
        prompt_sets: ``{"shakespeare": [...], "repetitive": [...]}`` lists of prompt ids.
        max_new_tokens: per prompt.
        ks: draft lengths for minispec's draft-model speculation.
        k_ngram: draft length of the n-gram and prompt-lookup drafters (both libraries).
        hf_ks: draft lengths for transformers' assisted generation (each adds a slow method).
        repeats: timed repeats.
        warmup: discarded repeats before them.
        target_dir: Hugging Face directory of the target's checkpoint; ``None`` skips the
            transformers methods.
        draft_dir: Hugging Face directory of the draft's checkpoint; ``None`` skips the
            transformers methods.
        adaptive: also run the draft model with goodput ``k`` (``adaptive=True``, ``k`` up to
            ``max(ks)``) as ``k=auto``.
        ngram: include the n-gram and prompt-lookup drafters (and the draft model on the
            repetitive set).
        log: progress lines (``None``: silent).
        clock: what a time is read from: wall clock (default), or ``time.process_time`` -- the
            process's CPU time, which on one thread counts only its own work on a shared machine.

    Returns:
        One [`MethodResult`][minispec.tools.bench.MethodResult] per method, with ratios against both
        greedy baselines of the same prompt set.
    """
    methods = _minispec_methods(target, draft, ks, max_new_tokens, adaptive)
    k_best = ks[len(ks) // 2] if ks else 1
    if ngram:
        methods += _ngram_methods(target, draft, k_best, k_ngram, max_new_tokens)
    if target_dir is not None:
        methods += _hf_methods(target_dir, draft_dir, hf_ks, k_ngram, max_new_tokens)
    methods = [m for m in methods if prompt_sets.get(m.prompt_set)]
    # The reference: minispec greedy on every prompt of every set.
    reference = {name: [generate(target, ids, max_new_tokens).tokens for ids in prompts]
                 for name, prompts in prompt_sets.items()}
    return time_methods(methods, prompt_sets, reference, repeats=repeats, warmup=warmup, log=log,
                        clock=clock)


def time_methods(methods: Sequence[Method], prompt_sets: dict[str, list[list[int]]],
                 reference: dict[str, list[list[int]]] | None, *, repeats: int = 5,
                 warmup: int = 1,
                 log: Callable[[str], None] | None = print,
                 clock: Callable[[], float] = time.perf_counter) -> list[MethodResult]:
    """Run ``methods`` interleaved on their prompt sets
    ([`lockstep.interleave`][minispec.tools.lockstep.interleave]), check their tokens, report
    medians.

    Args:
        methods: what to time; each runs on ``prompt_sets[method.prompt_set]``.
        prompt_sets: ``{set name: [prompt ids, ...]}``.
        reference: ``{set name: [greedy tokens per prompt]}`` every method must reproduce
            (``None`` for sampled runs: ``token_equal`` is then ``None``).
        repeats: timed repeats.
        warmup: discarded repeats before them.
        log: progress lines (``None``: silent).
        clock: wall clock (default) or ``time.process_time`` (see
            [`run_speed`][minispec.tools.bench.run_speed]).

    Returns:
        One [`MethodResult`][minispec.tools.bench.MethodResult] per method; ratios are against the
        methods named ``"... generate"`` of each family on the same prompt set.
    """
    say = log or (lambda _line: None)

    def prepare(method: Method) -> Callable[[], Callable[[], list]]:
        def run() -> list:                 # nothing to set up: each run is the whole prompt set
            return [method.run(ids) for ids in prompt_sets[method.prompt_set]]
        return lambda: run

    timed = interleave({i: prepare(m) for i, m in enumerate(methods)}, repeats, warmup=warmup,
                       clock=clock, log=say)
    totals = {i: t.seconds for i, t in timed.items()}
    outputs = {i: [tokens for tokens, _ in t.output] for i, t in timed.items()}
    last_stats = {i: [stats for _, stats in t.output] for i, t in timed.items()}
    results = [_result(method, totals[i], outputs[i], last_stats[i],
                       None if reference is None else reference[method.prompt_set], say)
               for i, method in enumerate(methods)]
    _add_ratios(results)
    return results


def _result(method: Method, totals: list[float], outputs: list[list[int]], stats: list,
            reference: list[list[int]] | None, say: Callable[[str], None]) -> MethodResult:
    """One method's timings and outputs as a [`MethodResult`][minispec.tools.bench.MethodResult]
    (ratios filled in later); ``reference`` ``None``: sampled outputs, not compared."""
    mismatches = [] if reference is None else [
        j for j, (a, b) in enumerate(zip(outputs, reference, strict=True)) if a != b]
    if mismatches:
        say(f"!!! TOKEN MISMATCH: {method.name} differs from minispec greedy on prompts "
            f"{mismatches} of the {method.prompt_set} set")
    seconds = statistics.median(totals)
    n_tokens = sum(len(t) for t in outputs)
    result = MethodResult(method.name, method.family, method.prompt_set, method.k, seconds,
                          totals, n_tokens, n_tokens / seconds,
                          None if reference is None else not mismatches, mismatches)
    stats = [s for s in stats if s is not None]
    if stats and any(s.rounds for s in stats):
        accepted = sum(sum(s.accepted_per_round) for s in stats)
        tested = sum(s.tested for s in stats)
        rounds = sum(s.rounds for s in stats)
        result.acceptance_rate = accepted / tested if tested else float("nan")
        result.tokens_per_round = (accepted + rounds) / rounds
        result.target_forwards = sum(s.target_forwards for s in stats)
        drafted = [d for s in stats for d in s.drafted_per_round]
        result.mean_k = sum(drafted) / len(drafted) if drafted else 0.0
    return result


def _add_ratios(results: Sequence[MethodResult]) -> None:
    """Fill ``vs_minispec_greedy`` and ``vs_hf_greedy`` from each prompt set's greedy baselines."""
    for prompt_set in dict.fromkeys(r.prompt_set for r in results):
        base = {r.family: r.seconds for r in results
                if r.prompt_set == prompt_set and r.name.endswith(" generate")}
        for r in results:
            if r.prompt_set == prompt_set:
                if "minispec" in base:
                    r.vs_minispec_greedy = base["minispec"] / r.seconds
                if "transformers" in base:
                    r.vs_hf_greedy = base["transformers"] / r.seconds


def format_table(results: Sequence[MethodResult]) -> str:
    """A plain-text table: time, tokens/s, ratios, acceptance, token equality."""
    head = (f"{'prompt set':<13} {'method':<34} {'time s':>7} {'tok/s':>7} {'vs ms greedy':>12} "
            f"{'vs HF greedy':>12} {'accept':>6} {'tok/fwd':>7} {'same tokens':>11}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.prompt_set:<13} {r.name:<34} {r.seconds:7.3f} {r.tokens_per_s:7.0f} "
            f"{_ratio(r.vs_minispec_greedy)} {_ratio(r.vs_hf_greedy)} "
            f"{_fmt(r.acceptance_rate, 6, 3)} {_fmt(r.tokens_per_round, 7, 2)} "
            f"{_same(r.token_equal):>11}")
    return "\n".join(lines)


def _same(equal: bool | None) -> str:
    return "-" if equal is None else "yes" if equal else "NO <<<"


def overall(results: Sequence[MethodResult]) -> list[MethodResult]:
    """One row per method over every prompt set it ran on (``prompt_set="overall"``): times and
    tokens summed, tokens per round as all tokens over all target forwards, ratios against the
    overall greedy rows."""
    rows = []
    for name in dict.fromkeys(r.name for r in results):
        runs = [r for r in results if r.name == name]
        seconds, tokens = sum(r.seconds for r in runs), sum(r.tokens for r in runs)
        forwards = sum(r.target_forwards for r in runs)
        equal = None if any(r.token_equal is None for r in runs) else all(
            r.token_equal for r in runs)
        row = MethodResult(name, runs[0].family, "overall", runs[0].k, seconds,
                           [sum(x) for x in zip(*(r.seconds_all for r in runs), strict=True)],
                           tokens, tokens / seconds, equal)
        row.target_forwards = forwards
        row.tokens_per_round = tokens / forwards if forwards else float("nan")
        rows.append(row)
    _add_ratios(rows)
    return rows


def _fmt(x: float, width: int, digits: int) -> str:
    return f"{x:{width}.{digits}f}" if x == x else f"{'-':>{width}}"


def _ratio(x: float) -> str:
    """A speedup in 12 columns, ``-`` where its baseline did not run (e.g. ``--no-hf``)."""
    return f"{x:11.2f}x" if x == x else f"{'-':>12}"


# ------------------------------------------------------------------------------- cost model


@dataclass
class Costs:
    """The cost model's inputs, measured on this machine: the step times (the package's one cost
    type, [`StepCosts`][minispec.speed.goodput.StepCosts]) and the pair's acceptance.

    Attributes:
        steps: median seconds of target forwards of ``1..max_gamma + 1`` tokens and of a
            one-token draft forward, at batch size 1 with a warm cache.
        max_gamma: the largest ``gamma`` timed.
        alpha_t1: mean ``sum min(p, q)`` at temperature 1 along the prompts' own text.
        agreement_text: how often the two models' argmax agree along the prompts' own text.
        alpha_greedy: how often they agree along the target's greedy continuation: the
            acceptance rate of greedy speculation (a draft is accepted iff it is the target's
            argmax), the ``alpha`` that predicts greedy runs.
        context: cache length the forwards were timed at.
        threads: torch threads.
    """

    steps: StepCosts
    max_gamma: int
    alpha_t1: float
    agreement_text: float
    alpha_greedy: float
    context: int
    threads: int

    @property
    def t_target(self) -> float:
        """Seconds of a one-token target forward."""
        return self.steps.verify_seconds(1, 1)

    @property
    def t_draft(self) -> float:
        """Seconds of a one-token draft forward."""
        return self.steps.draft_seconds(1)

    @property
    def c(self) -> float:
        """``t_draft / t_target``."""
        return self.steps.c()

    @property
    def r(self) -> dict[int, float]:
        """``{gamma: r(gamma)}``: a ``gamma + 1``-token target forward over a one-token one."""
        return {g: self.steps.r(g) for g in range(1, self.max_gamma + 1)}

    def as_json(self) -> dict:
        """Everything, with the derived ``c`` and ``r``, as JSON-friendly values."""
        fields = {k: v for k, v in vars(self).items() if k != "steps"}
        return fields | {"steps": self.steps.as_json(), "c": self.c, "r": self.r}


def _feed(model: Llama, cache: ContiguousKVCache, slot: int, ids: list[int], start: int) -> None:
    """Feed ``ids`` at positions ``start..`` of ``slot`` (the model's public forward)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)              # (1, T)
    positions = torch.arange(start, start + len(ids), device=model.device)[None]         # (1, T)
    model(input_ids, positions, cache, [slot])


def _forward_once(model: Llama, cache: ContiguousKVCache, slot: int, context: int,
                  n_tokens: int) -> Callable[[], Callable[[], None]]:
    """A task for [`interleave`][minispec.tools.lockstep.interleave]: one forward of ``n_tokens``
    at position ``context``, then the cache rolled back to ``context``."""
    ids = list(range(3, 3 + n_tokens))

    def once() -> None:
        _feed(model, cache, slot, ids, start=context)
        cache.truncate_to(slot, context)

    return lambda: once


@torch.inference_mode()
def measure_step_times(target: Llama, draft: Llama, prompt: Sequence[int], max_gamma: int = 8,
                       repeats: int = 100, clock: Callable[[], float] = time.perf_counter
                       ) -> StepCosts:
    """Median seconds of target forwards of ``1..max_gamma + 1`` tokens and of a one-token draft
    forward, all at batch size 1 with a warm cache holding ``prompt``.

    Every repeat times every shape once, interleaved
    ([`lockstep.interleave`][minispec.tools.lockstep.interleave]), so load changes hit all shapes
    alike; three warm-up repeats are thrown away.
    """
    tasks = {}
    for name, model in (("target", target), ("draft", draft)):
        cache = ContiguousKVCache.for_model(model, num_slots=1,
                                            max_seq_len=len(prompt) + max_gamma + 2)
        slot = cache.allocate()
        _feed(model, cache, slot, list(prompt), start=0)
        sizes = range(1, max_gamma + 2) if name == "target" else (1,)
        for n in sizes:
            tasks[name, n] = _forward_once(model, cache, slot, len(prompt), n)
    med = {key: t.median for key, t in interleave(tasks, repeats, warmup=3, clock=clock).items()}
    return StepCosts.measured({(1, n): med["target", n] for n in range(1, max_gamma + 2)},
                              {1: med["draft", 1]})


@torch.inference_mode()
def measure_alpha(target: Llama, draft: Llama, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int = 128) -> tuple[float, float, float]:
    """``(alpha at T=1 on the prompts' text, argmax agreement on it, argmax agreement along the
    target's greedy continuations)``; each from one full forward per sequence, no cache."""
    betas, agree_text, agree_greedy = [], [], []
    for ids in prompts:
        continuation = generate(target, list(ids), max_new_tokens).tokens
        full = torch.tensor([list(ids) + continuation])
        positions = torch.arange(full.shape[1])[None]
        logits_p = target(full, positions)[0].float()                 # (n, V)
        logits_q = draft(full, positions)[0].float()
        n = len(ids)
        text_p, text_q = logits_p[: n - 1], logits_q[: n - 1]          # predicting prompt tokens
        betas.append(theory.acceptance_rate(text_p.softmax(-1), text_q.softmax(-1)))
        agree_text.append(text_p.argmax(-1) == text_q.argmax(-1))
        gen_p, gen_q = logits_p[n - 1: -1], logits_q[n - 1: -1]        # predicting the continuation
        agree_greedy.append(gen_p.argmax(-1) == gen_q.argmax(-1))
    return (float(torch.cat(betas).mean()), float(torch.cat(agree_text).float().mean()),
            float(torch.cat(agree_greedy).float().mean()))


def measure_costs(target: Llama, draft: Llama, prompts: Sequence[Sequence[int]], *,
                  max_gamma: int = 8, repeats: int = 100, max_new_tokens: int = 128,
                  context: int | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> Costs:
    """Measure ``alpha``, ``c`` and ``r(gamma)`` for the pair on this machine.

    Args:
        target: the target model of the pair.
        draft: the draft model of the pair.
        prompts: prompt ids; ``alpha`` is measured on their text and on the target's greedy
            continuation of each, the forward timings at a cache of ``context`` tokens.
        max_gamma: ``r`` is measured for ``gamma = 1..max_gamma``.
        repeats: timed forwards per shape.
        max_new_tokens: length of the greedy continuations.
        context: cache length for the timings (default: the mean prompt length plus half of
            ``max_new_tokens``, the middle of a benchmark run).
        clock: wall clock (default) or ``time.process_time`` (see
            [`run_speed`][minispec.tools.bench.run_speed]).
    """
    if context is None:
        context = round(statistics.mean(len(p) for p in prompts) + max_new_tokens / 2)
    filler = [t for p in prompts for t in p]
    prefix = (filler * (context // max(1, len(filler)) + 1))[:context]
    steps = measure_step_times(target, draft, prefix, max_gamma, repeats, clock)
    alpha_t1, agreement, alpha_greedy = measure_alpha(target, draft, prompts, max_new_tokens)
    return Costs(steps=steps, max_gamma=max_gamma, alpha_t1=alpha_t1, agreement_text=agreement,
                 alpha_greedy=alpha_greedy, context=context, threads=torch.get_num_threads())


def predict(costs: Costs, gamma: int, alpha: float | None = None) -> dict[str, float]:
    """Predicted speedups at ``gamma``: the r-extended cost model and Theorem 3.8's ``r = 1``.

    ``alpha`` defaults to ``costs.alpha_greedy`` (greedy speculation).
    """
    alpha = costs.alpha_greedy if alpha is None else alpha
    return {
        "expected_tokens": theory.expected_tokens(alpha, gamma),
        "r_model": theory.walltime_speedup(alpha, gamma, costs.c, costs.r[gamma]),
        "paper_r1": theory.walltime_speedup(alpha, gamma, costs.c, 1.0),
    }


def compare_with_measured(costs: Costs, results: Sequence[MethodResult]) -> list[dict]:
    """For every ``minispec draft k=...`` result: measured speedup next to both predictions.

    Also gives the prediction from the *measured* tokens per round in place of Eq. (1), which
    separates the error of the i.i.d. assumption from the error of the cost model.
    """
    rows = []
    for r in results:
        if (r.prompt_set != "shakespeare" or not r.name.startswith("minispec draft k=")
                or r.k == "auto"):
            continue
        k = int(r.k)
        if k not in costs.r:
            continue
        pred = predict(costs, k)
        cost = k * costs.c + costs.r[k]
        rows.append({
            "k": k,
            "measured": r.vs_minispec_greedy,
            "predicted_r_model": pred["r_model"],
            "predicted_paper_r1": pred["paper_r1"],
            "measured_over_r_model": r.vs_minispec_greedy / pred["r_model"],
            "expected_tokens": pred["expected_tokens"],
            "measured_tokens_per_round": r.tokens_per_round,
            "predicted_from_measured_tokens": r.tokens_per_round / cost,
            "r1_from_measured_tokens": r.tokens_per_round / (k * costs.c + 1.0),
            "measured_acceptance": r.acceptance_rate,
        })
    return rows


def format_costs(costs: Costs, comparison: Sequence[dict] = ()) -> str:
    """The cost model's inputs, then measured vs predicted speedup per k."""
    lines = [
        f"one-token forward: target {costs.t_target * 1e3:.3f} ms, "
        f"draft {costs.t_draft * 1e3:.3f} ms"
        f"  ->  c = {costs.c:.3f}   (cache of {costs.context} tokens, {costs.threads} threads)",
        "verify ratio r(gamma) = t(gamma+1 tokens) / t(1 token):",
        "  " + ", ".join(f"r({g})={v:.2f}" for g, v in costs.r.items()),
        f"alpha (T=1, sum min(p,q) on the prompts' text) = {costs.alpha_t1:.3f}; "
        f"argmax agreement on that text = {costs.agreement_text:.3f}",
        f"argmax agreement along the greedy path = {costs.alpha_greedy:.3f}"
        "  <- predicts greedy speculation",
    ]
    if comparison:
        lines.append("")
        lines.append(f"{'k':>2} {'measured':>9} {'r-model':>8} {'paper r=1':>9} "
                     f"{'meas/r-model':>12} {'E[tok]':>7} {'tok/round':>9} "
                     f"{'pred from tok/round':>19}")
        for row in comparison:
            lines.append(
                f"{row['k']:>2} {row['measured']:8.2f}x {row['predicted_r_model']:7.2f}x "
                f"{row['predicted_paper_r1']:8.2f}x {row['measured_over_r_model']:11.0%} "
                f"{row['expected_tokens']:7.2f} {row['measured_tokens_per_round']:9.2f} "
                f"{row['predicted_from_measured_tokens']:18.2f}x")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- output


def write_outputs(out_dir: Path, results: Sequence[MethodResult], costs: Costs | None,
                  comparison: Sequence[dict], settings: dict) -> list[Path]:
    """``bench.json`` (everything, stamped by
    [`records.write`][minispec.tools.records.write] with the machine, ``settings["clock"]``, the
    commit, the command and the date) and ``bench.png`` (tokens/s per method; speedup vs k)."""
    payload = {"settings": settings, "results": [asdict(r) for r in results],
               "costs": costs.as_json() if costs is not None else None,
               "cost_model_vs_measured": list(comparison)}
    paths = [records.write(out_dir / "bench.json", payload, settings.get("clock", "wall"))]
    if results or comparison:
        try:
            paths.append(_plot(out_dir / "bench.png", results, comparison))
        except ImportError:             # matplotlib is a dev extra
            pass
    return paths


def _plot(path: Path, results: Sequence[MethodResult], comparison: Sequence[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = sorted({r.prompt_set for r in results}, key=lambda s: s != "shakespeare")
    ncols = len(sets) + (1 if comparison else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 5), squeeze=False)
    for ax, prompt_set in zip(axes[0], sets, strict=False):
        rows = [r for r in results if r.prompt_set == prompt_set]
        colors = ["tab:blue" if r.family == "minispec" else "tab:orange" for r in rows]
        ax.barh([r.name for r in rows], [r.tokens_per_s for r in rows], color=colors)
        for y, r in enumerate(rows):
            if not r.token_equal:
                ax.text(r.tokens_per_s, y, " MISMATCH", va="center", color="red")
        ax.invert_yaxis()
        ax.set_xlabel("tokens / s (greedy, median)")
        ax.set_title(f"{prompt_set} prompts (blue: minispec, orange: transformers)")
    if comparison:
        ax = axes[0][-1]
        ks = [row["k"] for row in comparison]
        ax.plot(ks, [row["measured"] for row in comparison], "o-", label="measured")
        ax.plot(ks, [row["predicted_r_model"] for row in comparison], "s--",
                label="E[tokens] / (k c + r(k))")
        ax.plot(ks, [row["predicted_paper_r1"] for row in comparison], "^:",
                label="Theorem 3.8 (r = 1)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("k (drafts per round)")
        ax.set_ylabel("speedup over minispec generate")
        ax.set_title("speedup vs k: measured and predicted")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
