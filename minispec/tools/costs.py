"""``minispec bench costs``: what a decode step costs on this machine, eager against fast.

Decoding is memory-bound: a step reads every weight once, so its floor (the *roofline*) is
``weight bytes / read bandwidth``. Theorem 3.8 also assumes that scoring k+1 tokens costs about as
much as scoring one; the ratio ``r(k) = t(k+1 tokens) / t(1 token)`` measures how far that holds.
This benchmark measures, in one run and side by side for the eager forward and the packed one
([`minispec.speed.packed`][minispec.speed.packed]):

* the read bandwidth (a sum over a 256 MB tensor, probed between the timed steps so that it sees
  the same machine load; the median) and the roofline step time;
* the one-token step time, its multiple of the roofline and the fraction of the roofline it
  achieves (``roofline / step``; above 1 when the weights fit in a cache, as the shipped pair's
  do), and ``r(k)`` for k = 0..8 at batch 1 and
  at a larger batch (every row k+1 new tokens after a ``context``-token prefix in a KV cache);
* the start-up cost of the fast path (packing the weights; nothing is compiled, so there is no
  compile cache to warm);
* with a draft model, the draft's ``c = t_draft(1) / t_target(1)``, and the speedup Theorem 3.8
  predicts, ``E[tokens](alpha, k) / (k c + r(k))``, with each mode's measured ``r``.

Timing protocol: round-robin (every repeat times every mode and every shape once, so a change of
machine load slows all alike), one warm-up repeat thrown away, medians over the rest. The older
name of the command, ``minispec bench roofline``, still runs it.

``matmul_ms`` shows the cause of ``r > 1`` on one matrix: eager ``x @ W.T`` for a few rows against
the same product from weights packed once ([`PackedLinear`][minispec.speed.packed.PackedLinear]).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from minispec.core import theory
from minispec.models.kv_cache import ContiguousKVCache
from minispec.models.llama import Llama, ModelConfig
from minispec.speed.goodput import StepCosts
from minispec.speed.packed import PackedLinear, is_fast, make_fast
from minispec.tools import records
from minispec.tools.argtypes import (
    MAX_THREADS,
    non_negative_int,
    positive_int,
    probability,
    thread_count,
)
from minispec.tools.lockstep import interleave

#: Clocks for timing: wall time, or the process's CPU time, which leaves out the time other
#: processes hold the cores (use it with ``--threads 1`` on a shared machine: with more threads
#: it adds up every thread's time).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

#: Shapes for ``random:NAME`` models: random weights, the real model's speed.
SHAPES: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True),
}


def random_model(name: str, seed: int = 0) -> Llama:
    """A random-weight fp32 ``Llama`` of the shape ``SHAPES[name]`` (speed only, no meaning)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    torch.manual_seed(seed)
    model = Llama(copy.deepcopy(SHAPES[name])).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1:
                param.normal_(0.0, 0.02)
    return model


def get_model(spec: str, dtype: torch.dtype = torch.float32) -> Llama:
    """``random:NAME`` (see ``SHAPES``) or anything ``minispec.load`` takes, in ``dtype``."""
    if spec.startswith("random:"):
        return random_model(spec.removeprefix("random:")).to(dtype)
    from minispec.loading.loader import load

    return load(spec, dtype=dtype)[0]


def weight_bytes(model: Llama) -> int:
    """Bytes of weights one decode step reads: every parameter, except that the embedding table is
    only gathered (a few rows), unless it is tied and so read whole as the LM head."""
    embed = model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total if model.lm_head is None else total - embed.numel() * embed.element_size()


class BandwidthProbe:
    """Memory read bandwidth: the time to sum a ``megabytes`` tensor (far larger than any cache).

    Called between the timed steps, so that it sees the same machine load as they do (on a shared
    machine the bandwidth one process gets changes from second to second).
    """

    def __init__(self, megabytes: int = 256, clock=time.perf_counter) -> None:
        self.clock = clock
        self.data = torch.ones(megabytes * 2**20 // 4)
        self.data.sum()  # first touch

    def __call__(self) -> float:
        """One measurement, in GB/s."""
        start = self.clock()
        self.data.sum()
        return self.data.numel() * 4 / (self.clock() - start) / 1e9


def read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Memory read bandwidth in GB/s: the median of ``repeats`` probes."""
    probe = BandwidthProbe(megabytes)
    return statistics.median(probe() for _ in range(repeats))


@torch.inference_mode()
def matmul_ms(out_features: int = 2304, in_features: int = 9216, rows: Sequence[int] = (1, 5),
              repeats: int = 15, clock: str = "wall", seed: int = 0, per_repeat: bool = False
              ) -> dict[str, dict[int, float]] | dict[str, dict[int, list[float]]]:
    """Median ms of one product ``x @ W.T`` with ``W`` (out_features, in_features) in float32 and
    ``x`` of each number of ``rows``: eager, and from ``W`` packed once (``PackedLinear``);
    ``per_repeat=True``: every repeat's ms instead, in order (repeat ``i`` of every mode and row
    count ran side by side, so ratios of repeat ``i`` are paired and their spread is the noise).

    The skinny-GEMM effect on one matrix: a decode step is dozens of such products. Interleaved
    ([`lockstep.interleave`][minispec.tools.lockstep.interleave]: every repeat times every mode and
    row count once), one warm-up repeat thrown away.
    The default shape is 85 MB, larger than the last-level cache of most CPUs (or one core's share
    of it), so every product reads it from memory.

    Returns: {"eager": {rows: ms}, "fast": {rows: ms}} (``per_repeat``: lists of ms).
    """
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    packed = PackedLinear(weight)
    xs = {m: torch.randn(m, in_features, generator=gen) for m in rows}
    run = {"eager": lambda x: x @ weight.T, "fast": packed}
    tasks = {(mode, m): (lambda fn=fn, x=x: lambda: fn(x))
             for mode, fn in run.items() for m, x in xs.items()}
    timed = interleave(tasks, repeats, warmup=1, clock=CLOCKS[clock])
    times = {mode: {m: [s * 1e3 for s in timed[mode, m].seconds] for m in rows} for mode in run}
    if per_repeat:
        return times
    return {mode: {m: statistics.median(v) for m, v in per.items()} for mode, per in times.items()}


class _Stepper:
    """One model with a cache of ``batch`` slots, each prefilled with ``context`` random tokens."""

    def __init__(self, model: Llama, batch: int, context: int, max_tokens: int) -> None:
        self.model, self.context = model, context
        self.cache = ContiguousKVCache.for_model(model, batch, context + max_tokens)
        self.slots = [self.cache.allocate() for _ in range(batch)]
        gen = torch.Generator().manual_seed(0)
        vocab = model.config.vocab_size
        self.ids = torch.randint(0, vocab, (batch, context + max_tokens), generator=gen)
        self.step(context, start=0)  # the prefill

    @torch.inference_mode()
    def step(self, tokens: int, start: int | None = None) -> None:
        """One forward of ``tokens`` new tokens per row; then the cache rolled back."""
        start = self.context if start is None else start
        B = len(self.slots)
        ids = self.ids[:, start:start + tokens]  # (B, T)
        positions = torch.arange(start, start + tokens).expand(B, tokens)  # (B, T)
        self.model(ids, positions, self.cache, self.slots)
        for slot in self.slots:
            self.cache.truncate_to(slot, self.context)


def time_steps(models: dict[str, Llama], batch: int, context: int, max_k: int, repeats: int,
               progress: bool = True, probe: BandwidthProbe | None = None,
               clock=time.perf_counter) -> tuple[dict[str, StepCosts], list[float]]:
    """Median seconds of a forward of 1..max_k+1 tokens per row for every model, interleaved
    ([`lockstep.interleave`][minispec.tools.lockstep.interleave]; one warm-up repeat).

    Before a model's first shape in a repeat, untimed, ``probe`` reads the bandwidth and the model
    takes one step (its weights are then in the caches as they are for the rest).

    Returns: ``({name: StepCosts}, bandwidths in GB/s probed once per model per repeat)``; each
    [`StepCosts`][minispec.speed.goodput.StepCosts] holds ``verify[(batch, tokens)]``, so
    ``steps.r(k, batch)`` is the verify cost ``r(k)``.
    """
    steppers = {name: _Stepper(m, batch, context, max_k + 1) for name, m in models.items()}
    widths = range(1, max_k + 2)
    per_repeat, bandwidths, seen, last = len(models) * len(widths), [], [0], [None]

    def task(name: str, tokens: int):
        def prepare():
            if seen[0] % per_repeat == 0 or last[0] != name:   # the model's first in a repeat
                if probe is not None and seen[0] >= per_repeat:  # not in the warm-up repeat
                    bandwidths.append(probe())
                steppers[name].step(1)
            seen[0], last[0] = seen[0] + 1, name
            return lambda: steppers[name].step(tokens)
        return prepare

    bar = tqdm(total=repeats + 1, desc=f"batch {batch}", disable=not progress, leave=False)
    timed = interleave({(n, t): task(n, t) for n in models for t in widths}, repeats, warmup=1,
                       clock=clock, log=lambda _line: bar.update())
    bar.close()
    steps = {n: StepCosts.measured({(batch, t): timed[n, t].median for t in widths})
             for n in models}
    return steps, bandwidths


@dataclass
class CostReport:
    """Everything ``measure`` found; ``format_report`` prints it. ``modes["eager"]`` and
    ``modes["fast"]`` hold each mode's step times at every batch size measured (and, with a draft
    model, its one-token draft step at batch 1)."""

    target: str
    threads: int
    context: int
    weight_bytes: int
    bandwidth_gbs: float
    roofline_ms: float
    pack_s: float
    modes: dict[str, StepCosts]
    batches: list[int]
    max_k: int
    draft: str | None = None
    dtype: str = "torch.float32"
    clock: str = "wall"
    blas_rows: int = 0

    @property
    def c(self) -> dict[str, float]:
        """``{mode: draft step / target step}`` (empty without a draft model)."""
        return {m: s.c() for m, s in self.modes.items() if s.draft}

    def predicted_speedup(self, mode: str, alpha: float, k: int, c: float | None = None) -> float:
        """Theorem 3.8 with this mode's measured r(k) at batch 1 (and c, default the draft's)."""
        c = self.c.get(mode, 0.0) if c is None else c
        return theory.walltime_speedup(alpha, k, c, self.modes[mode].r(k))

    def as_json(self) -> dict:
        """Everything, with the derived ``c``, as JSON-friendly values."""
        fields = {k: v for k, v in vars(self).items() if k != "modes"}
        return fields | {"modes": {m: s.as_json() for m, s in self.modes.items()}, "c": self.c}


def measure(target: str, draft: str | None = None, batches: Sequence[int] = (1, 8),
            context: int = 300, max_k: int = 8, repeats: int = 5, progress: bool = True,
            dtype: torch.dtype = torch.float32, clock: str = "wall") -> CostReport:
    """Measure eager against fast for ``target`` (and ``draft``); see the module docstring.

    ``dtype`` other than float32 (bfloat16) changes the model: its numbers are a different
    model's, which the report says.
    """
    eager = get_model(target, dtype)
    fast = copy.deepcopy(eager)
    start = time.perf_counter()
    make_fast(fast)
    pack_s = time.perf_counter() - start
    if not is_fast(fast):
        raise RuntimeError("the fast path is unavailable here (see the warning above)")
    tick = CLOCKS[clock]
    probe, bandwidths = BandwidthProbe(clock=tick), []
    nbytes = weight_bytes(eager)
    modes = {"eager": StepCosts(), "fast": StepCosts()}
    for batch in batches:
        steps, bw = time_steps({"eager": eager, "fast": fast}, batch, context, max_k, repeats,
                               progress, probe, tick)
        for mode in modes:
            modes[mode].verify.update(steps[mode].verify)
        bandwidths += bw
    bandwidth = statistics.median(bandwidths) if bandwidths else read_bandwidth()
    if draft is not None:      # c: the draft's step over the target's, timed side by side
        d_eager = get_model(draft, dtype)
        models = {"eager": eager, "fast": fast, "d-eager": d_eager,
                  "d-fast": make_fast(copy.deepcopy(d_eager))}
        steps, _ = time_steps(models, 1, context, 0, repeats, progress, clock=tick)
        for mode in modes:     # kept as seconds at the scale of the batch-1 step above
            ratio = steps["d-" + mode].verify[1, 1] / steps[mode].verify[1, 1]
            modes[mode].draft[1] = ratio * modes[mode].verify[1, 1]
    return CostReport(target, torch.get_num_threads(), context, nbytes, bandwidth,
                      nbytes / bandwidth / 1e6, pack_s, modes, sorted(batches), max_k, draft,
                      str(dtype), clock, fast.packed_head.blas_rows)


def format_report(report: CostReport, alphas: Sequence[float] = (0.6, 0.8)) -> str:
    """The report as a plain-text table: eager and fast side by side."""
    kernels = (f"products of 1-{report.blas_rows} rows run on the BLAS, wider ones packed"
               if report.blas_rows else "every product runs packed")
    lines = [
        f"target {report.target} ({report.dtype.removeprefix('torch.')}"
        f"{'' if report.dtype == 'torch.float32' else ': a different model than float32'}): "
        f"{report.weight_bytes / 1e6:.1f} MB of weights read per step; "
        f"{report.threads} thread(s); context {report.context} tokens; {report.clock} clock",
        f"read bandwidth {report.bandwidth_gbs:.1f} GB/s (median, probed between steps) -> "
        f"roofline step {report.roofline_ms:.1f} ms",
        f"fast start-up: packing and timing the kernels {report.pack_s:.2f} s (nothing compiled, "
        f"nothing to cache); {kernels}",
    ]
    eager, fast = report.modes["eager"], report.modes["fast"]
    for batch in report.batches:
        roof = report.roofline_ms  # a step of any batch reads the weights once
        e_ms, f_ms = ({t: s.verify_seconds(batch, t) * 1e3 for t in range(1, report.max_k + 2)}
                      for s in (eager, fast))
        e1, f1 = e_ms[1], f_ms[1]
        lines.append(f"\nbatch {batch}: one-token step  eager {e1:.1f} ms "
                     f"({e1 / roof:.2f}x roofline, fraction achieved {roof / e1:.2f})   "
                     f"fast {f1:.1f} ms ({f1 / roof:.2f}x roofline, "
                     f"fraction achieved {roof / f1:.2f})   fast/eager {f1 / e1:.2f}")
        lines.append(f"  {'k':>2} {'tokens':>6} {'eager ms':>9} {'r eager':>8} {'fast ms':>8} "
                     f"{'r fast':>7}")
        for k in range(report.max_k + 1):
            lines.append(f"  {k:>2} {k + 1:>6} {e_ms[k + 1]:>9.1f} {e_ms[k + 1] / e1:>8.2f} "
                         f"{f_ms[k + 1]:>8.1f} {f_ms[k + 1] / f1:>7.2f}")
    lines += _prediction_lines(report, alphas)
    return "\n".join(lines)


def _prediction_lines(report: CostReport, alphas: Sequence[float]) -> list[str]:
    """Theorem 3.8's speedup at batch 1 with each mode's r: with the draft's c, and with c = 0
    (a context drafter such as n-gram or prompt lookup, whose cost is negligible)."""
    if report.draft is not None:
        head = (f"\ndraft {report.draft}: c eager {report.c['eager']:.3f}   "
                f"c fast {report.c['fast']:.3f}")
    else:
        head = "\nno draft model given: c = 0 (a context drafter)"
    lines = [head, "predicted speedup, Theorem 3.8 with the measured r(k) (batch 1):",
             f"  {'alpha':>5} {'k':>2} {'eager':>6} {'fast':>6}"]
    for alpha in alphas:
        for k in (k for k in range(1, report.max_k + 1) if k in (1, 2, 4, 6, 8)):
            e, f = (report.predicted_speedup(mode, alpha, k) for mode in ("eager", "fast"))
            lines.append(f"  {alpha:>5.2f} {k:>2} {e:>6.2f} {f:>6.2f}")
    return lines


#: An input-grounded task (the answer quotes the prompt), where context drafters pay, and the
#: shipped pair's style of text. Rendered with the chat template when the tokenizer has one.
SPEEDUP_PROMPTS: tuple[str, ...] = (
    "Repeat the following text exactly, then summarise it in one sentence.\n\n"
    "The committee met on Tuesday to review the budget. The committee approved the budget for "
    "the library, the budget for the parks and the budget for the schools. The committee "
    "delayed the budget for the roads until the next meeting on Tuesday.",
    "ROMEO.\nBut soft, what light through yonder window breaks?\n",
)


def _prompt_ids(tokenizer, text: str) -> list[int]:
    """``text`` as token ids: a chat turn when the tokenizer has a chat template."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer.encode(text))


@dataclass
class SpeedupRow:
    """Greedy decoding with one drafter, eager against fast (seconds are medians over repeats).

    Attributes: method ("greedy", "ngram", "prompt_lookup" or "draft"); seconds — {mode: s};
    tokens_equal — every mode's and method's tokens equal eager plain greedy's.
    """

    method: str
    seconds: dict[str, float]
    tokens_equal: bool


def measure_speedups(target: str, draft: str | None = None, new_tokens: int = 64, k: int = 4,
                     repeats: int = 2, progress: bool = True, clock: str = "wall",
                     ) -> list[SpeedupRow]:
    """Time plain greedy and greedy speculative decoding (n-gram, prompt lookup, the draft model)
    on ``SPEEDUP_PROMPTS``, eager and fast, interleaved
    ([`lockstep.interleave`][minispec.tools.lockstep.interleave]); check every output against eager
    greedy.
    """
    import minispec as ms  # the decoding layer, imported late: this module is also a library
    from minispec.loading.loader import load

    models = {"eager": load(target)[0]}
    tokenizer = load(target)[1]
    models["fast"] = make_fast(copy.deepcopy(models["eager"]))
    drafts = {}
    if draft is not None:
        drafts["eager"] = load(draft)[0]
        drafts["fast"] = make_fast(copy.deepcopy(drafts["eager"]))
    prompts = [_prompt_ids(tokenizer, text) for text in SPEEDUP_PROMPTS]
    methods = ["greedy", "ngram", "prompt_lookup"] + (["draft"] if drafts else [])

    def run(mode: str, method: str, prompt: list[int]) -> list[int]:
        if method == "greedy":
            return ms.generate(models[mode], prompt, new_tokens).tokens
        drafter = {"ngram": ms.NGramDrafter, "prompt_lookup": ms.PromptLookupDrafter,
                   "draft": lambda: ms.ModelDrafter(drafts[mode])}[method]()  # a fresh one
        return ms.speculative_generate(models[mode], drafter, prompt, new_tokens, k=k,
                                       adaptive=False).tokens

    base = [run("eager", "greedy", p) for p in prompts]
    equal = {m: True for m in methods}

    def task(mode: str, method: str):
        def timed_run() -> None:
            equal[method] &= [run(mode, method, p) for p in prompts] == base
        return lambda: timed_run

    timed = interleave({(mode, m): task(mode, m) for mode in models for m in methods}, repeats,
                       clock=CLOCKS[clock])
    return [SpeedupRow(m, {mode: timed[mode, m].median for mode in models}, equal[m])
            for m in methods]


def format_speedups(rows: Sequence[SpeedupRow]) -> str:
    """Speedups over eager plain greedy, eager and fast side by side."""
    base = next(r for r in rows if r.method == "greedy").seconds["eager"]
    lines = ["\nmeasured greedy decoding (speedup over eager plain greedy; tokens checked):",
             f"  {'method':<14} {'eager s':>8} {'fast s':>8} {'eager x':>8} {'fast x':>7} "
             f"{'same tokens':>11}"]
    for r in rows:
        e, f = r.seconds["eager"], r.seconds["fast"]
        lines.append(f"  {r.method:<14} {e:>8.2f} {f:>8.2f} {base / e:>8.2f} {base / f:>7.2f} "
                     f"{str(r.tokens_equal):>11}")
    return "\n".join(lines)


#: What ``minispec bench costs`` measures when neither ``--target`` nor ``--model`` is given.
SHIPPED_PAIR = ("shakespeare-target", "shakespeare-draft")


def build_parser(prog: str = "minispec bench costs") -> argparse.ArgumentParser:
    """The options of ``minispec bench costs``; every number is checked by its ``type=``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A decode step against the memory roofline, eager and fast (oneDNN-packed "
                    "weights, minispec.speed.packed) side by side: read bandwidth, roofline "
                    "step time (weight bytes / bandwidth) and the fraction achieved, one-token "
                    "step time, r(k) = t(k+1 tokens) / t(1 token), the draft's c, the fast "
                    "path's start-up, and the speedup Theorem 3.8 predicts with each mode's r. "
                    f"Default: the shipped pair ({' + '.join(SHIPPED_PAIR)}). Both modes are "
                    "always measured.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", default=None, metavar="NAME",
                       help="a chat model to measure as the target, with no draft model unless "
                            "--draft is given (c = 0, a context drafter), e.g. "
                            "smollm2-135m-instruct")
    which.add_argument("--target", default=None,
                       help="a model name/dir for minispec.load, or random:SHAPE (random weights, "
                            f"the real model's speed; shapes: {', '.join(SHAPES)}); default "
                            f"{SHIPPED_PAIR[0]}, with draft {SHIPPED_PAIR[1]}")
    parser.add_argument("--draft", default=None, help="a draft model, to measure c")
    parser.add_argument("--fast", action="store_true",
                        help="accepted for symmetry with 'minispec bench --model --fast'; changes "
                             "nothing: eager and fast are always measured side by side")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 8],
                        help="batch sizes, each >= 1, one of them 1 (default: 1 8)")
    parser.add_argument("--context", type=positive_int, default=300,
                        help="cached tokens per row, >= 1 (default 300)")
    parser.add_argument("--max-k", type=non_negative_int, default=8,
                        help="largest k, >= 0 (k+1 tokens verified; default 8)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed repeats, >= 1 (medians; default 5)")
    parser.add_argument("--alpha", type=probability, nargs="+", default=[0.6, 0.8],
                        help="acceptance rates in [0, 1] for the predicted speedup "
                             "(default: 0.6 0.8)")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help=f"torch threads, 1 to {MAX_THREADS} on this machine (4 per CPU; "
                             "default: torch's own choice)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights' dtype; bfloat16 is a different (rounded) model")
    parser.add_argument("--speedups", action="store_true",
                        help="also time greedy decoding with each drafter, eager and fast "
                             "(needs a loadable target with a tokenizer)")
    parser.add_argument("--new-tokens", type=positive_int, default=64,
                        help="tokens per --speedups run, >= 1 (default 64)")
    parser.add_argument("--clock", default="wall", choices=list(CLOCKS),
                        help="wall time, or this process's CPU time (steadier on a shared "
                             "machine; use with --threads 1)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the report as JSON to FILE")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="also write the report as JSON to DIR/costs.json")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "minispec bench costs") -> int:
    """Command-line entry point (``minispec bench costs``, alias ``minispec bench roofline``, or
    ``python -m minispec.tools.costs``); returns the exit status."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if 1 not in args.batch:
        parser.error("--batch must include 1 (r and the predicted speedup are at batch 1)")
    if args.fast:
        print(f"{prog}: note: --fast changes nothing here; eager and fast are always measured "
              "side by side", file=sys.stderr)
    target, draft = args.model or args.target, args.draft
    if target is None:
        target, draft = SHIPPED_PAIR[0], draft or SHIPPED_PAIR[1]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        report = measure(target, draft, args.batch, args.context, args.max_k, args.repeats,
                         dtype=getattr(torch, args.dtype), clock=args.clock)
    except (RuntimeError, ValueError, OSError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    print(format_report(report, args.alpha), flush=True)
    rows = []
    if args.speedups:
        rows = measure_speedups(target, draft, args.new_tokens, k=4, clock=args.clock)
        print(format_speedups(rows))
    paths = [args.json] if args.json else []
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        paths.append(str(Path(args.out) / "costs.json"))
    for path in paths:
        records.write(path, {"costs": report.as_json(), "speedups": [asdict(r) for r in rows]},
                      args.clock)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m minispec.tools.costs"))
