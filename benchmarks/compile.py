"""Does compiling the target pay? Inductor against the fast (packed) forward, start-up included.

``torch.compile`` (inductor) can fuse a step's ~1,300 small operations and, with
``freezing=True``, pack the weights as ``minispec.speed.packed`` does. This script measures
what it costs to get there and what it buys, for one model (default: SmolLM2-135M-Instruct):

1. **start-up**, cold and warm: ``--starts`` fresh processes in turn compile the whole forward
   (``torch.compile(model.forward, dynamic=True)``, inductor's ``freezing`` on) and run forwards
   of 1 to ``max_k + 1`` tokens through a KV cache, all sharing one inductor cache directory
   (``--cache``; emptied first unless ``--keep-cache``), so the first start is cold and the later
   ones find what torch keeps on disk. ``--threads`` sets torch's threads; ``--clock`` the step
   timer (``cpu``: process CPU time, steadier on a shared machine; start-up is always wall time).
   Each start reports its seconds and where the compiler spent them
   (``torch._dynamo.utils.compile_times``: tracing, AOT, inductor's lowering, the C++ compile);
2. **steps**: in the last start, forwards of 1 to ``max_k + 1`` tokens at batch 1, timed
   round-robin with the eager and the fast forward (``minispec.tools.costs.time_steps``: medians
   of ``--repeats``, after a warm-up), with the roofline from a bandwidth probe.

It prints one table; nothing is asserted. The numbers depend on the machine and its load.

Examples::

    python benchmarks/compile.py --threads 1                   # SmolLM2, 2 starts, max_k 4
    python benchmarks/compile.py --target random:smollm2-135m --starts 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._inductor.config

#: Where a start's compile time goes: (label, ``compile_times`` key).
PHASES = (("dynamo tracing", "bytecode_tracing"),
          ("AOT + inductor", "create_aot_dispatcher_function"),
          ("inductor lowering + codegen", "compile_fx_inner"), ("C++ compile", "compile_file"))


def one_start(target: str, max_k: int, repeats: int, clock: str) -> dict:
    """Compile the forward, run the first forwards; with ``repeats``, time the steps too."""
    from torch._dynamo.utils import compile_times

    from minispec.speed.packed import make_fast
    from minispec.tools import costs

    compiled = costs.get_model(target)
    begin = time.perf_counter()
    torch._inductor.config.freezing = True        # this process only: it is a child of main()
    compiled.forward = torch.compile(compiled.forward, dynamic=True)
    costs.time_steps({"compiled": compiled}, 1, 64, max_k, 0, progress=False)   # compiles
    headers, values = compile_times(repr="csv", aggregate=True)
    metrics = dict(zip(headers, map(float, values), strict=True))
    out = {"start_s": time.perf_counter() - begin,
           "phases": {label: metrics.get(key, 0.0) for label, key in PHASES}}
    if repeats:
        eager = costs.get_model(target)
        models = {"eager": eager, "fast": make_fast(costs.get_model(target)), "compiled": compiled}
        steps, _ = costs.time_steps(models, 1, 64, max_k, repeats, progress=False,
                                    clock=costs.CLOCKS[clock])
        out["roofline_ms"] = costs.weight_bytes(eager) / costs.read_bandwidth() / 1e6
        out["steps_ms"] = {name: [s.verify[(1, t)] * 1e3 for t in range(1, max_k + 2)]
                           for name, s in steps.items()}
    return out


def report(starts: list[dict], max_k: int) -> str:
    """The starts and the last start's step times as plain-text tables."""
    labels = [label for label, _ in PHASES]
    lines = [f"{'start':>5} {'seconds':>8} " + " ".join(f"{label:>27}" for label in labels)]
    for i, s in enumerate(starts):
        name = "cold" if i == 0 else "warm"
        lines.append(f"{name:>5} {s['start_s']:8.1f} "
                     + " ".join(f"{s['phases'][label]:27.1f}" for label in labels))
    last = starts[-1]
    if "steps_ms" in last:
        roof = last["roofline_ms"]
        lines.append(f"\nbatch 1, ms per forward of 1..{max_k + 1} tokens (roofline {roof:.1f} ms)")
        for name, ms in last["steps_ms"].items():
            lines.append(f"{name:>9} " + " ".join(f"{t:6.1f}" for t in ms)
                         + f"   one-token {ms[0] / roof:.2f}x roofline, r({max_k}) "
                           f"{ms[-1] / ms[0]:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/compile.py", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct",
                        help="a registered model, a checkpoint, or random:SHAPE")
    parser.add_argument("--starts", type=int, default=2, help="processes, the first cold")
    parser.add_argument("--max-k", type=int, default=4, help="forwards of 1..max_k + 1 tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats in the last start")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--clock", default="cpu", choices=("wall", "cpu"),
                        help="step timer: wall, or process CPU time")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir())
                        / "minispec-inductor", help="inductor's cache directory")
    parser.add_argument("--keep-cache", action="store_true", help="do not empty it first")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(one_start(args.target, args.max_k, args.repeats, args.clock)))
        return 0
    if not args.keep_cache:
        shutil.rmtree(args.cache, ignore_errors=True)
    starts = []
    for i in range(args.starts):
        print(f"start {i + 1} of {args.starts} ({'cold' if i == 0 else 'warm'})...", flush=True)
        command = [sys.executable, __file__, "--child", "--target", args.target, "--max-k",
                   str(args.max_k), "--threads", str(args.threads), "--clock", args.clock,
                   "--repeats", str(args.repeats if i == args.starts - 1 else 0)]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(args.cache)}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        starts.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(report(starts, args.max_k))
    if args.out is not None:
        args.out.write_text(json.dumps(starts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
