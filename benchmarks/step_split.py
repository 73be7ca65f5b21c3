"""Where a plain engine step's time goes: the target's forward, its matrix products and attention,
and the engine's bookkeeping around the forward.

For each batch size ``B`` a warm plain ``minispec.Engine`` (it has first served ``2 x B`` other
prompts) serves ``2 x B`` prompts of about 24 tokens, 64 new tokens each, EOS ignored, for
``--repeats`` waves; the wave's two prefills are included, as in ``benchmarks/engine.py``. The
clock is this process's CPU time on one thread (``--threads``), read around every target forward,
every ``torch.nn.functional.linear`` (the projections and the output head) and every
``scaled_dot_product_attention`` call; the start-up heap is frozen (``gc.freeze``, see
``benchmarks/lockstep.py``). It prints, per wave, the milliseconds per step of the whole step,
the forward, the products, attention, the rest of the forward (norms, RoPE, cache writes, the
paged gather, the modules' calls) and the bookkeeping outside the forward; and the speedup over
the current engine that no bookkeeping at all would give.

Example::

    python benchmarks/step_split.py --batch-sizes 4 16

Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from engine import load_models, make_prompts  # benchmarks/engine.py

from minispec.serving.engine import Engine
from minispec.speed import packed


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--repeats", type=int, default=3, help="timed waves per batch size")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--kv-cache", choices=["paged", "contiguous"], default="paged")
    parser.add_argument("--fast", action="store_true",
                        help="the packed CPU path (its products are timed as products too)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or min(args.batch_sizes) < 1:
        parser.error("--repeats, --threads and --batch-sizes must be at least 1")
    return args


class Timers:
    """CPU seconds spent inside wrapped callables, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.inside: set[str] = set()

    def wrap(self, name: str, fn):
        """``fn``, timed under ``name``; a call inside another call of the same name (a packed
        product that falls back to ``F.linear``) is counted once."""
        def timed(*args, **kwargs):
            if name in self.inside:
                return fn(*args, **kwargs)
            self.inside.add(name)
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside.discard(name)
                self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start
        return timed


def split_wave(engine: Engine, prompts: list[list[int]], timers: Timers) -> dict[str, float]:
    """Serve one wave; milliseconds per step of each part."""
    timers.seconds.clear()
    for prompt in prompts:
        engine.add_request(prompt, max_new_tokens=64, eos_token_id=[])
    start, steps = time.process_time(), 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    total = time.process_time() - start
    forward, products, attention = (timers.seconds.get(k, 0.0)
                                    for k in ("forward", "products", "attention"))
    parts = dict(step=total, forward=forward, products=products, attention=attention,
                 rest_of_forward=forward - products - attention, bookkeeping=total - forward)
    return {name: 1e3 * s / steps for name, s in parts.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        target, _, tok, _, label = load_models(False, False, Path(tmp))
    gc.collect()
    gc.freeze()
    timers = Timers()
    target.forward = timers.wrap("forward", target.forward)
    F.linear = timers.wrap("products", F.linear)
    if args.fast:
        packed.make_fast(target)
        packed.PackedLinear.forward = timers.wrap("products", packed.PackedLinear.forward)
        label += ", packed CPU path"
    F.scaled_dot_product_attention = timers.wrap("attention", F.scaled_dot_product_attention)
    print(f"{label}, plain engine ({args.kv_cache} cache); {args.threads} thread(s); process CPU "
          f"time; ms per step (each wave's two prefills included)")
    for batch in args.batch_sizes:
        n = 2 * batch
        engine = Engine(target, max_batch_size=batch, kv_cache=args.kv_cache, max_seq_len=176)
        warm = make_prompts(n, 24, tok, target.config.vocab_size, other=True)
        engine.generate(warm, progress=False, max_new_tokens=64, eos_token_id=[])
        prompts = make_prompts(n, 24, tok, target.config.vocab_size)
        for _ in range(args.repeats):
            ms = split_wave(engine, prompts, timers)
            print(f"B={batch:>2}  step {ms['step']:.2f}  forward {ms['forward']:.2f} "
                  f"({ms['forward'] / ms['step']:.0%}: products {ms['products']:.2f}, attention "
                  f"{ms['attention']:.2f}, the rest {ms['rest_of_forward']:.2f})  bookkeeping "
                  f"{ms['bookkeeping']:.2f}  (none at all: {ms['step'] / ms['forward']:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
