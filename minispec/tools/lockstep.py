"""Load-stable speed ratios: engines run step by step in turn, each step timed in CPU time.

Two runs of equal work made seconds apart on a shared machine can differ by more than the
gains in question. Here every engine serves the same requests *at the same time*: one step of the
first engine, one step of the next, and again, each step timed by itself in this process's CPU
time, the order reversed every step. A slow spell of the machine then lands on all engines alike.
A whole lockstep run is repeated; each repeat gives one *paired* ratio per engine (its tokens per
CPU second over the baseline's in the same run), and the spread of those ratios over the repeats
is the noise of the measurement, printed and used beside every figure:

* a gain is claimed only when every repeat was faster than the baseline (the lowest ratio > 1),
* a loss only when every repeat was slower (the highest ratio < 1),
* anything else is *within noise*; and a gain is never claimed for more than drafting can
  explain: a round costs at least one plain step (``r(k) >= 1``), so speculation is at most its
  tokens per target forward times faster. An engine whose drafts yielded nothing (one token per
  forward), or almost nothing (a policy that drafted in one round of a hundred), whose repeats all
  came out faster, was faster by noise.

One engine serving one request runs the same round as
[`speculative_generate`][minispec.decoding.loop.speculative_generate], so single-sequence
comparisons use it too. What cannot be stepped (a ``generate`` call, transformers, one forward)
is run whole, in turn ([`interleave`][minispec.tools.lockstep.interleave]), and paired repeat by
repeat ([`ratios`][minispec.tools.lockstep.ratios]): the package's benchmarks time through here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minispec.serving.engine import Engine


@dataclass
class Paired:
    """One engine's speed over the baseline's, measured ``len(ratios)`` times in lockstep.

    Attributes:
        name: the engine's name.
        ratios: tokens per CPU second over the baseline's, one per repeat, sorted.
        speeds: each repeat's tokens per CPU second, sorted (their range is the noise of an
            absolute figure, as the ratios' is of the paired one).
        tokens_per_forward: generated tokens per target forward a request took (each request's
            own count, whether it waited in the queue or shared its batch; 1.0 for plain decoding;
            a round that accepts ``a`` drafts yields ``a + 1``).
        mean_k: the mean drafts per round per request chosen by the draft-length policy (``None``
            for an engine without one: plain, or a fixed ``k``).
        same: every repeat's outputs equal the baseline's, token for token.
    """

    name: str
    ratios: list[float]
    speeds: list[float]
    tokens_per_forward: float
    mean_k: float | None
    same: bool
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        """The median over the repeats of the engine's tokens per CPU second."""
        return statistics.median(self.speeds)

    @property
    def ratio(self) -> float:
        """The median paired ratio."""
        return statistics.median(self.ratios)

    @property
    def low(self) -> float:
        return self.ratios[0]

    @property
    def high(self) -> float:
        return self.ratios[-1]

    @property
    def drafted(self) -> bool:
        """Did drafting yield anything (more than one token per target forward)?"""
        return self.tokens_per_forward > 1

    @property
    def explained(self) -> bool:
        """Could drafting have made even the slowest repeat's gain? Only if the run yielded at
        least that many tokens per target forward (a round costs one plain step or more)."""
        return self.drafted and self.tokens_per_forward >= self.low

    @property
    def verdict(self) -> str:
        """``"faster"``, ``"slower"`` or ``"within noise"`` (see the module docstring)."""
        if self.low > 1 and self.explained:
            return "faster"
        if self.high < 1:
            return "slower"
        return "within noise"

    def __str__(self) -> str:
        k = "" if self.mean_k is None else f", mean k {self.mean_k:.2f}"
        return (f"{self.name}: {self.ratio:.2f}x [{self.low:.2f}-{self.high:.2f}] "
                f"({self.verdict}; {self.tokens_per_forward:.2f} tokens/forward{k})")


def lockstep(engines: dict[str, Engine], prompts: Sequence[list[int]], max_new_tokens: int,
             clock: Callable[[], float] = time.process_time) -> dict[str, dict]:
    """Serve ``prompts`` on every engine, one step each in turn (the order reversed every step).

    EOS is ignored, so every engine does the same work. Returns per engine its ``seconds`` (its
    own steps only), ``tokens``, ``outputs`` (one token list per prompt), ``forwards`` (the
    target forwards each request took, summed over the requests) and ``ks`` (the drafts per
    round its policy chose, per request).
    """
    ids = {name: [e.add_request(p, max_new_tokens=max_new_tokens, eos_token_id=[])
                  for p in prompts] for name, e in engines.items()}
    tokens = {name: {i: [] for i in ids[name]} for name in engines}
    seconds = dict.fromkeys(engines, 0.0)
    choices = {name: len(e.k_choices) for name, e in engines.items()}
    forwards = dict.fromkeys(engines, 0)          # target forwards each request took, summed
    order, step = list(engines), 0
    while any(e.has_unfinished() for e in engines.values()):
        for name in order if step % 2 == 0 else order[::-1]:
            engine = engines[name]
            if engine.has_unfinished():
                start = clock()
                outputs = engine.step()
                seconds[name] += clock() - start
                for out in outputs:
                    if out.token is not None:
                        tokens[name][out.request_id].append(out.token)
                    if out.stats is not None:                  # a request's last output
                        forwards[name] += out.stats.target_forwards
        step += 1
    result = {}
    for name, engine in engines.items():
        ks = [k for choice in list(engine.k_choices)[choices[name]:] for k in choice.ks]
        outputs = [tokens[name][i] for i in ids[name]]
        result[name] = dict(seconds=seconds[name], tokens=sum(map(len, outputs)), outputs=outputs,
                            forwards=forwards[name], ks=ks)
    return result


def race(make_engines: Callable[[], dict[str, Engine]], prompts: Sequence[list[int]],
         max_new_tokens: int, repeats: int = 3, baseline: str | None = None,
         warm: Sequence[list[int]] = (), clock: Callable[[], float] = time.process_time
         ) -> dict[str, Paired]:
    """``repeats`` lockstep runs of fresh engines; each engine's paired ratios to ``baseline``.

    Args:
        make_engines: returns fresh engines by name (called once per repeat).
        prompts: the requests every engine serves (token ids), all at once.
        max_new_tokens: tokens generated per request (EOS ignored).
        repeats: lockstep runs; their spread is the measurement's noise (at least 2).
        baseline: the engine the ratios are over (default: the first).
        warm: an untimed first wave of other prompts (a server's steady state), if given.
        clock: the clock each step is timed with (default: this process's CPU time).

    Returns:
        A [`Paired`][minispec.tools.lockstep.Paired] per engine, in ``make_engines``' order.
    """
    if repeats < 2:
        raise ValueError(f"repeats must be at least 2 to measure a spread, got {repeats}")
    runs = []
    for _ in range(repeats):
        engines = make_engines()
        if warm:
            lockstep(engines, warm, max_new_tokens, clock)
        runs.append(lockstep(engines, prompts, max_new_tokens, clock))
    base = baseline or next(iter(runs[0]))
    speed = lambda run, name: run[name]["tokens"] / max(run[name]["seconds"], 1e-9)
    result = {}
    for name in runs[0]:
        ks = [k for run in runs for k in run[name]["ks"]]
        forwards = sum(run[name]["forwards"] for run in runs)
        result[name] = Paired(
            name=name,
            ratios=sorted(speed(run, name) / speed(run, base) for run in runs),
            speeds=sorted(speed(run, name) for run in runs),
            tokens_per_forward=sum(run[name]["tokens"] for run in runs) / max(forwards, 1),
            mean_k=statistics.mean(ks) if ks else None,
            same=all(run[name]["outputs"] == run[base]["outputs"] for run in runs),
            outputs=runs[0][name]["outputs"])
    return result


@dataclass
class Timed:
    """One task's runs in [`interleave`][minispec.tools.lockstep.interleave].

    Attributes:
        seconds: each timed repeat's seconds, in repeat order (repeat ``i`` of every task ran side
            by side, so ratios of repeat ``i`` are paired).
        output: what the task's last run returned.
    """

    seconds: list[float] = field(default_factory=list)
    output: Any = None

    @property
    def median(self) -> float:
        """The median over the timed repeats."""
        return statistics.median(self.seconds)


def interleave(tasks: dict[Hashable, Callable[[], Callable[[], Any]]], repeats: int, *,
               warmup: int = 0, clock: Callable[[], float] = time.process_time,
               log: Callable[[str], None] | None = None) -> dict[Hashable, Timed]:
    """Time every task once per repeat, in turn, the order reversed every other repeat.

    Args:
        tasks: ``{name: prepare}``; ``prepare()`` sets a run up, untimed, and returns it; only the
            run is timed.
        repeats: timed repeats.
        warmup: repeats run first and thrown away.
        clock: what a time is read from (default: this process's CPU time; ``time.perf_counter``
            for the wall clock).
        log: told ``"repeat i/n"`` as each repeat starts (``None``: silent).

    Returns:
        A [`Timed`][minispec.tools.lockstep.Timed] per task, in ``tasks``' order.
    """
    timed = {name: Timed() for name in tasks}
    order = list(tasks)
    for rep in range(warmup + repeats):
        if log is not None:
            log(f"repeat {rep + 1}/{warmup + repeats}{' (warm-up)' if rep < warmup else ''}")
        for name in order if rep % 2 == 0 else order[::-1]:
            run = tasks[name]()
            start = clock()
            output = run()
            elapsed = clock() - start
            if rep >= warmup:
                timed[name].seconds.append(elapsed)
            timed[name].output = output
    return timed


def ratios(seconds: dict[Hashable, Sequence[float]], baseline: Hashable,
           work: dict[Hashable, float] | None = None) -> dict[Hashable, list[float]]:
    """Each task's speed over the baseline's, repeat by repeat, sorted: the paired ratios whose
    spread is the noise of the comparison (see the module docstring).

    ``work`` gives each task's amount of work (tokens; default: equal), so a ratio is of work per
    second.
    """
    work = work or {}
    speed = lambda name, s: work.get(name, 1.0) / max(s, 1e-9)
    base = [speed(baseline, s) for s in seconds[baseline]]
    return {name: sorted(speed(name, s) / b for s, b in zip(times, base, strict=True))
            for name, times in seconds.items()}
