"""Benchmark the continuous-batching engine against transformers, batch size by batch size.

For each batch size it runs the same greedy prompts through

* ``minispec.Engine`` without speculation, and with each drafter (the draft model, n-gram
  drafting, an EAGLE head with ``--eagle``) twice: with a fixed ``k`` (``adaptive=False``) and as a
  user gets it by default (goodput control: ``k`` per request and step from the measured costs,
  see ``minispec.speed.goodput``);
* transformers' continuous batching (``model.generate_batch``) and static batched ``generate``
  (left-padded; every request runs to ``max_new_tokens``, EOS ignored, so the work is equal);

and reports generated tokens per second, mean tokens per target forward (per request, and per
batched target forward of the engine), and whether the greedy tokens equal plain single-request
``minispec.generate``. Every mode runs ``--repeats`` times through ``minispec.tools.lockstep``'s
``interleave`` (every other repeat in reverse order; a fresh engine and its warm wave untimed) and
reports its median speed on the ``--clock`` (wall by default; ``cpu``: this process's CPU time,
with ``--threads 1`` on a shared machine). A mode's speed as a multiple of the plain engine's is
the median of ``lockstep.ratios``: its tokens/s over the plain engine's in the same repeat, printed
with the lowest and highest of those ratios; for differences of a few per cent,
``benchmarks/lockstep.py`` runs the engines step by step in turn instead.
``--controls`` adds, per drafter, the default engine with a
policy that never drafts: what the drafter's machinery costs without speculation, so that a loss
of the default can be told apart from it. ``--warm`` first serves every engine (and transformers)
an untimed wave of as many other prompts: a server's steady state, in which what the default's
policy learns once per engine (the step costs at each batch size, the pooled acceptance, its
re-check schedule) is already paid for; without it each cell times a fresh engine, which charges
a whole server life's exploration to one short run. The start-up heap is frozen before timing
(``gc.freeze``: a full collection that scans it costs about 170 ms, see ``lockstep.py``). Results
go to ``<out>/engine.json`` and ``<out>/engine.png``.

Examples::

    python benchmarks/engine.py --quick              # small run; random models if none are shipped
    python benchmarks/engine.py --threads 2          # the full table on the shipped pair
    python benchmarks/engine.py --model smollm2-135m-instruct --eagle --batch-sizes 1 4 16 --skip-hf
    python benchmarks/engine.py --threads 1 --clock cpu --batch-sizes 16 32 --skip-hf \
        --repeats 3 --controls                         # is the default's loss the policy's?

Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

import minispec as ms
from minispec.serving.engine import Engine
from minispec.speed.goodput import GoodputK
from minispec.tools import records
from minispec.tools.lockstep import interleave, ratios

SNIPPET = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout_snippet.txt"
#: The shipped pair's shapes (notes/tiny-models.md), for random stand-ins when it is not built.
SHAPES = {
    "target": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
                   intermediate_size=704),
    "draft": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=352),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--requests-per-batch", type=int, default=2,
                        help="requests run per batch size = this x the batch size (min 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=24, help="approximate prompt length")
    parser.add_argument("--k", type=int, default=4, help="drafts per round")
    parser.add_argument("--kv-cache", choices=["paged", "contiguous"], default="paged")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's)")
    parser.add_argument("--skip-hf", action="store_true", help="skip the transformers baselines")
    parser.add_argument("--fast", action="store_true",
                        help="minispec's models on the packed CPU path (ms.load(..., fast=True)); "
                             "transformers stays eager")
    parser.add_argument("--random", action="store_true", help="random models of the shipped shape")
    parser.add_argument("--model", default=None,
                        help="a target to load instead of the shipped pair (no draft model then)")
    parser.add_argument("--eagle", action="store_true",
                        help="also draft with the model's EAGLE head (<model>-eagle in the zoo)")
    parser.add_argument("--drafters", nargs="+", default=["draft", "ngram"],
                        choices=["draft", "ngram"], help="which other drafters to run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    parser.add_argument("--statistic", choices=["best", "median"], default="median",
                        help="accepted for the recorded commands; a mode reports the median of "
                             "its interleaved repeats (minispec.tools.lockstep)")
    parser.add_argument("--warm", action="store_true",
                        help="time a second wave: every engine first serves other prompts, untimed")
    parser.add_argument("--hurdle", type=float, default=None,
                        help="the least predicted gain a drafting plan needs under goodput k "
                             "(default: the policy's, 0.10; 0 drafts on any predicted gain)")
    parser.add_argument("--controls", action="store_true",
                        help="also each drafter's engine with a policy that never drafts")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--quick", action="store_true",
                        help="batch sizes 1 2 4, 16 new tokens; random models if none are shipped")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.max_new_tokens = ([b for b in args.batch_sizes if b <= 4]
                                                 or [1, 2, 4], 16)
    return args


def random_pair(directory: Path) -> tuple[Path, Path]:
    """Random Llama checkpoints with the shipped pair's shapes, saved in HF format."""
    from transformers import LlamaConfig, LlamaForCausalLM

    paths = []
    for seed, name in enumerate(("target", "draft")):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=2048, num_key_value_heads=2, max_position_embeddings=256,
                             tie_word_embeddings=True, initializer_range=0.1, bos_token_id=0,
                             eos_token_id=1, **SHAPES[name])
        path = directory / name
        LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
        paths.append(path)
    return paths[0], paths[1]


def load_models(use_random: bool, quick: bool, tmp: Path, model: str | None = None):
    """(target, draft, tokenizer, target checkpoint dir, label)."""
    if model is not None:
        target, tok = ms.load(model)
        return (target, None, tok,
                ms.zoo.path(model) if model in ms.zoo.REGISTERED else Path(model), model)
    if not use_random:
        try:
            target, tok = ms.load("shakespeare-target")
            draft, _ = ms.load("shakespeare-draft")
            return target, draft, tok, ms.zoo.path("shakespeare-target"), "shipped pair"
        except (FileNotFoundError, ValueError) as err:
            if not quick:
                sys.exit(f"the shipped pair is missing ({err}); use --random or --quick")
            print(f"shipped pair missing ({err}): using random models of the same shape")
    target_dir, draft_dir = random_pair(tmp)
    target, _ = ms.load(target_dir)
    draft, _ = ms.load(draft_dir)
    return target, draft, None, target_dir, "random models (shipped shape)"


def make_prompts(n: int, length: int, tokenizer, vocab: int, other: bool = False
                 ) -> list[list[int]]:
    """``n`` prompts of about ``length`` tokens: held-out text when a tokenizer is at hand;
    ``other``: a second set that shares no prompt with the first (the warm-up wave)."""
    if tokenizer is not None and SNIPPET.exists():
        ids = tokenizer.encode(SNIPPET.read_text())
        step = max(1, (len(ids) - 2 * length) // max(1, n))
        start = step // 2 if other else 0
        return [ids[start + i * step: start + i * step + length + (i % 5)] for i in range(n)]
    g = torch.Generator().manual_seed(int(other))
    return [torch.randint(2, vocab, (length + i % 5,), generator=g).tolist() for i in range(n)]


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


class NeverDrafts(GoodputK):
    """A control policy: the default engine's drafter and policy calls, with k = 0 every step."""

    def choose(self, requests, caps, fixed=None, lags=None) -> list[int]:
        self.steps += 1
        return [0] * len(caps)


def prepare_engine(target, prompts, batch, args, control: bool = False, warm=None, **kwargs):
    """A task for ``lockstep.interleave``: a fresh engine (after the untimed ``warm`` wave) and its
    timed run over ``prompts``, which returns its tokens, choices and outputs."""
    engine = Engine(target, k=args.k, max_batch_size=batch, kv_cache=args.kv_cache, **kwargs)
    if control:
        engine.policy = NeverDrafts(args.k)
    elif engine.policy is not None and args.hurdle is not None:
        engine.policy = GoodputK(args.k, hurdle=args.hurdle)
    if warm:
        engine.generate(warm, progress=False, max_new_tokens=args.max_new_tokens, eos_token_id=[])
    choices_before, forwards_before = len(engine.k_choices), engine.target_forwards  # warm wave

    def run() -> dict:
        results = engine.generate(prompts, progress=False, max_new_tokens=args.max_new_tokens,
                                  eos_token_id=[])
        tokens = sum(len(r.tokens) for r in results)
        chosen = [k for choice in list(engine.k_choices)[choices_before:] for k in choice.ks]
        return dict(tokens=tokens, mean_k=sum(chosen) / len(chosen) if chosen else None,
                    tokens_per_target_forward=sum(r.stats.tokens_per_target_forward
                                                  for r in results) / len(results),
                    tokens_per_batched_forward=tokens / max(1, engine.target_forwards
                                                           - forwards_before),
                    acceptance=_mean([r.stats.acceptance_rate for r in results]),
                    outputs=[r.tokens for r in results])

    return run


def run_hf_continuous(hf, prompts, batch, args, eos) -> dict:
    """transformers' continuous batching (``generate_batch``) over ``prompts``, greedy."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=args.max_new_tokens,
                              min_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos)
    # Size the KV pool for this workload: left to itself on CPU it sizes from free RAM (slow).
    per_request = -(-(max(map(len, prompts)) + args.max_new_tokens) // 16)
    cb = ContinuousBatchingConfig(max_requests_per_batch=batch, page_size=16,
                                  num_blocks=len(prompts) * per_request + 16)
    out = hf.generate_batch(inputs=prompts, generation_config=config, progress_bar=False,
                            continuous_batching_config=cb)
    by_prompt = sorted(out.values(), key=lambda o: int(str(o.request_id).rsplit("_", 1)[-1]))
    outputs = [list(o.generated_tokens) for o in by_prompt]
    return dict(tokens=sum(len(o) for o in outputs), outputs=outputs)


def run_hf_static(hf, prompts, batch, args, eos) -> dict:
    """Static batches of ``batch`` left-padded prompts through ``generate`` (greedy)."""
    outputs = []
    pad = eos if eos is not None else 0
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                          min_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
        outputs += out[:, width:].tolist()
    return dict(tokens=sum(len(o) for o in outputs), outputs=outputs)


def prepare_hf(run, hf, prompts, batch, args, eos, warm=None):
    """A task for ``lockstep.interleave``: transformers' ``run``, after its untimed warm wave."""
    if warm:
        run(hf, warm, batch, args, eos)
    return lambda: run(hf, prompts, batch, args, eos)


def _mean(values) -> float:
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else float("nan")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft, tok, target_dir, label = load_models(args.random, args.quick, Path(tmp),
                                                            args.model)
        hf = None
        if not args.skip_hf:
            from transformers import AutoModelForCausalLM
            hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    if args.fast:
        from minispec.speed.packed import make_fast
        target, draft = make_fast(target), draft and make_fast(draft)
        label += ", packed CPU path"
    drafters = {name: spec for name, spec in (("draft", draft), ("ngram", "ngram"))
                if name in args.drafters and spec is not None}
    if args.eagle:
        drafters["eagle"] = ms.load_drafter(f"{args.model}-eagle", target)
    gc.collect()
    gc.freeze()         # a full collection no longer scans the start-up heap (docstring)
    eos = target.config.eos_token_ids[0] if target.config.eos_token_ids else None
    print(f"{label}; {torch.get_num_threads()} threads; k={args.k}; "
          f"{args.max_new_tokens} new tokens; {args.clock} clock, "
          f"median of {args.repeats} interleaved repeats"
          f"{'; warm engines (second wave timed)' if args.warm else '; fresh engines'}")

    rows = []
    for batch in args.batch_sizes:
        n = max(4, args.requests_per_batch * batch)
        prompts = make_prompts(n, args.prompt_tokens, tok, target.config.vocab_size)
        warm = (make_prompts(n, args.prompt_tokens, tok, target.config.vocab_size, other=True)
                if args.warm else None)
        reference = [ms.generate(target, p, max_new_tokens=args.max_new_tokens,
                                 eos_token_id=[]).tokens
                     for p in prompts]
        runs = {"engine": dict()}
        for name, spec in drafters.items():
            runs[f"{name} k={args.k}"] = dict(drafter=spec, adaptive=False)
            runs[f"{name} default"] = dict(drafter=spec)
            if args.controls:
                runs[f"{name} never"] = dict(drafter=spec, control=True)
        tasks = {name: partial(prepare_engine, target, prompts, batch, args, warm=warm, **kwargs)
                 for name, kwargs in runs.items()}
        if hf is not None:
            for name, run in (("hf-continuous", run_hf_continuous), ("hf-static", run_hf_static)):
                tasks[name] = partial(prepare_hf, run, hf, prompts, batch, args, eos, warm)
        timed = interleave(tasks, args.repeats, clock=CLOCK[args.clock])
        modes = {name: summary(t, reference) for name, t in timed.items()}
        paired_ = ratios({name: t.seconds for name, t in timed.items()}, "engine",
                         {name: t.output["tokens"] for name, t in timed.items()})
        for name, result in modes.items():   # each repeat's tokens/s over the plain engine's
            result["paired"] = paired_[name]
        rows.append(dict(batch_size=batch, requests=len(prompts), modes=modes))
        print_row(batch, modes)
    print_table(rows, list(drafters), args.k)

    report = dict(label=label, threads=torch.get_num_threads(), k=args.k,
                  max_new_tokens=args.max_new_tokens, kv_cache=args.kv_cache, rows=rows)
    records.write(args.out / "engine.json", report, args.clock)
    plot(rows, args.out / "engine.png", label)
    print(f"wrote {args.out / 'engine.json'} and {args.out / 'engine.png'}")


def summary(timed, reference: list[list[int]]) -> dict:
    """A mode's report from its interleaved runs: the median speed over the repeats, the speeds
    themselves, and the share of its outputs equal to ``ms.generate``'s."""
    result = dict(timed.output)
    outputs = result.pop("outputs")
    speeds = sorted(result["tokens"] / max(s, 1e-9) for s in timed.seconds)
    result.update(seconds=timed.median, tokens_per_s=statistics.median(speeds), speeds=speeds,
                  same_as_generate=sum(o == r for o, r in zip(outputs, reference, strict=True))
                  / len(reference))
    return result


def paired(result: dict) -> float:
    """A mode's speed as a multiple of the plain engine's: the median, over repeats, of its
    tokens/s over the plain engine's in the same repeat. Pairing runs made seconds apart cancels
    the machine's slow drift, which medians taken mode by mode keep."""
    return statistics.median(result["paired"])


def spread(result: dict) -> str:
    """The lowest and highest of a mode's paired ratios, ``[lo-hi]``."""
    return f"[{result['paired'][0]:.2f}-{result['paired'][-1]:.2f}]"


def print_row(batch: int, modes: dict) -> None:
    hf = modes.get("hf-static", {}).get("tokens_per_s")
    print(f"\nbatch {batch}")
    print(f"  {'mode':<22}{'tok/s':>9}{'vs engine':>11}{'paired range':>15}{'vs hf-static':>13}"
          f"{'tok/fwd':>9}{'tok/batch-fwd':>15}{'mean k':>8}{'same':>6}")
    for name, r in modes.items():
        vs_hf = f"{r['tokens_per_s'] / hf:.2f}x" if hf else "-"
        per_fwd = (f"{r['tokens_per_target_forward']:.2f}" if "tokens_per_target_forward" in r
                   else "-")
        per_batch = (f"{r['tokens_per_batched_forward']:.1f}" if "tokens_per_batched_forward" in r
                     else "-")
        mean_k = f"{r['mean_k']:.2f}" if r.get("mean_k") is not None else "-"
        print(f"  {name:<22}{r['tokens_per_s']:>9.0f}{paired(r):>10.2f}x{spread(r):>15}{vs_hf:>13}"
              f"{per_fwd:>9}{per_batch:>15}{mean_k:>8}{r['same_as_generate']:>6.0%}")


def print_table(rows: list[dict], drafters: list[str], k: int) -> None:
    """The summary: each drafter's fixed-k and default engine as multiples of the plain engine
    (paired medians), with the default's and the never-drafting control's paired ranges."""
    never = any(f"{d} never" in row["modes"] for row in rows for d in drafters)
    head = "".join(f"{d + ' k=' + str(k):>12}{d + ' default':>28}"
                   + (f"{d + ' never':>24}" if never else "") for d in drafters)
    print(f"\n{'B':>3}{'plain tok/s':>13}{head}{'hf-static':>11}{'same':>6}")
    for row in rows:
        modes, plain = row["modes"], row["modes"]["engine"]["tokens_per_s"]
        cells = ""
        for d in drafters:
            fixed, default = modes[f"{d} k={k}"], modes[f"{d} default"]
            mean_k = f" ({default['mean_k']:.2f})" if default.get("mean_k") is not None else ""
            cells += (f"{paired(fixed):>11.2f}x{paired(default):>8.2f}x{mean_k:>7}"
                      f"{spread(default):>12}")
            if f"{d} never" in modes:                 # the --controls column
                control = modes[f"{d} never"]
                cells += f"{paired(control):>11.2f}x{spread(control):>12}"
        hf = modes.get("hf-static")
        vs_hf = f"{1 / paired(hf):.2f}x" if hf else "-"
        same = min(r["same_as_generate"] for r in modes.values())
        print(f"{row['batch_size']:>3}{plain:>13.0f}{cells}{vs_hf:>11}{same:>6.0%}")
    print("(each drafter x the plain engine: the median over repeats of the two engines' tokens/s "
          "in the same repeat, [lowest-highest] of those ratios; default: goodput k, mean k "
          "chosen in brackets; never: the default engine with a policy that never drafts, which "
          "does the plain engine's work, so its range is the noise; hf-static: the plain engine "
          "x transformers' static batched generate, paired the same way; same: the least share "
          "of outputs equal to ms.generate)")


def plot(rows: list[dict], path: Path, label: str) -> None:
    try:
        import matplotlib
        import matplotlib.ticker
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [r["batch_size"] for r in rows]
    for name in rows[0]["modes"]:
        ax.plot(sizes, [r["modes"][name]["tokens_per_s"] for r in rows], marker="o", label=name)
    ax.set(xscale="log", xlabel="batch size", ylabel="generated tokens / s",
           title=f"minispec engine: {label}")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
