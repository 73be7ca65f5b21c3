"""Batch-aware draft length: choose each step's ``k`` per request to maximise the batch's goodput.

Speculation trades work for latency: a round of ``k`` drafts costs ``k`` draft steps plus a verify
forward ``k + 1`` tokens wide, and yields ``E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)`` tokens
in expectation (Leviathan Eq. (1)). At batch size 1 a CPU or GPU has idle bandwidth and the verify
forward costs about one step, so drafting pays; at large batch sizes the forward becomes
compute-bound, ``k + 1`` tokens per row cost nearly ``k + 1`` times as much, and drafting loses.
Which side of the crossover a step is on depends on the batch size, the model, the machine and each
request's acceptance, so nothing here is hard-coded; everything is measured:

* [`StepCosts`][minispec.speed.goodput.StepCosts] learns the seconds of a verify forward by
  shape ``(B rows, T tokens per row)`` and of one draft step, from the engine's own steps;
* [`alpha_estimates`][minispec.speed.goodput.alpha_estimates] gives each request's acceptance
  estimate: its own record shrunk towards the pooled one, plus a little optimism;
* [`choose_ks`][minispec.speed.goodput.choose_ks] picks, for every ``K`` in ``0..k_max`` and
  every ``R``, the plan "the ``R`` requests with the highest acceptance draft ``K`` tokens, the
  others none" with the most expected tokens per second. ``K = 0`` is plain decoding, so the
  choice never predicts less than the plain engine; a drafting plan must beat it by a hurdle;
* [`GoodputK`][minispec.speed.goodput.GoodputK], the policy: it wraps the round (as
  [`FixedK`][minispec.decoding.runner.FixedK] does), chooses each row's ``k``, owns every clock
  (the round only marks its phases) and keeps its choices as
  [`KChoice`][minispec.speed.goodput.KChoice] records (``Engine.k_choices``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minispec.core.sequence import Sequence
    from minispec.decoding.runner import SpeculativeRunner

__all__ = ["GoodputK", "KChoice", "StepCosts", "alpha_estimates", "bucket", "choose_ks"]

HURDLE = 0.10  #: the least predicted gain over plain decoding a drafting plan needs (docstring)


def bucket(rows: int) -> int:
    """The batch-size bucket costs are kept for: the smallest power of two >= ``rows``.

    A batch shrinks one request at a time as requests finish; timing every size would cost more
    than it saves, and the cost of a forward changes smoothly with the number of rows.
    """
    return 1 << max(0, rows - 1).bit_length()


@dataclass
class StepCosts:
    """Measured seconds of a decoding step's two kinds of forward, by shape: the one cost type of
    the package. The engine and ``speculative_generate(adaptive=True)`` learn one from their own
    steps; the benchmarks (`minispec.tools.bench`, `minispec.tools.costs`) and the lessons fill one
    from timed forwards ([`measured`][minispec.speed.goodput.StepCosts.measured]) and read the
    cost model's terms off it: ``c`` ([`c`][minispec.speed.goodput.StepCosts.c]) and ``r(k)``
    ([`r`][minispec.speed.goodput.StepCosts.r]).

    A learning engine takes everything from its own steps (moving averages, kept per
    [`bucket`][minispec.speed.goodput.bucket] of the batch size); a shape not measured yet is
    read off a straight line through the measured ones (a forward's cost grows about linearly
    with the tokens it scores), or borrowed from the nearest bucket (``verify_seconds``).
    The first measurement of a shape is a warm-up (a new shape allocates; a draft model's first
    step also prefills its cache over every prompt): the second replaces it, the moving average
    starts there. A forward is never priced above a wider one of its bucket: a plain step measured
    once, cold, and never again (the engine drafts from then on) would otherwise make every plan
    with drafts look better than it is.

    In an engine a bucket's first step is plain (it measures the plain step) and the first
    drafting step is a full-``k`` one: real steps that emit tokens, nothing is spent on
    calibration. After that a bucket with only its plain step measured borrows the ratio of a wide
    to a plain step from the nearest bucket that has both, so the engine drafts at a new batch size
    only when the plan says it pays, instead of paying a full-``k`` step at every bucket to find
    out. A draft step's seconds leave out a lagging draft cache's catch-up (after plain rounds a
    draft model feeds every token since, once), which is kept apart in ``catch_up``
    ([`GoodputK.learn`][minispec.speed.goodput.GoodputK.learn]): counted as draft steps, a
    catch-up would price a draft step many times too high, and an engine at batch size 1 that
    paused would never draft again.

    Attributes:
        verify: ``{(B, T): seconds}`` of one target forward over ``B`` rows of ``T`` tokens.
        draft: ``{R: seconds}`` of one draft step over ``R`` drafting rows.
        catch_up: seconds per token a lagging draft cache feeds before it drafts; 0 until
            measured.
        smoothing: weight of a new measurement in the moving averages.
        samples: how many measurements each key of ``verify``, ``draft`` and ``catch_up`` has had.
    """

    verify: dict[tuple[int, int], float] = field(default_factory=dict)
    draft: dict[int, float] = field(default_factory=dict)
    catch_up: float = 0.0
    smoothing: float = 0.2
    samples: dict[object, int] = field(default_factory=dict)

    @classmethod
    def measured(cls, verify: dict[tuple[int, int], float],
                 draft: dict[int, float] | None = None) -> StepCosts:
        """Costs timed elsewhere (e.g. medians of a benchmark), taken as they are:
        ``verify[(B, T)]`` seconds of a forward over ``B`` rows of ``T`` tokens, ``draft[R]`` of
        one draft step over ``R`` rows."""
        return cls({(bucket(b), t): s for (b, t), s in verify.items()},
                   {bucket(r): s for r, s in (draft or {}).items()})

    def r(self, k: int, rows: int = 1) -> float:
        """The verify cost ``r(k)``: a forward of ``k + 1`` tokens per row over a one-token one,
        as measured (estimated only where a width was not)."""
        return self._seconds(rows, k + 1) / self._seconds(rows, 1)

    def c(self, rows: int = 1) -> float:
        """The draft cost ``c``: one draft step over one target step (one token per row)."""
        if (draft := self.draft_seconds(rows)) is None:
            raise ValueError("no draft step has been measured")
        return draft / self._seconds(rows, 1)

    def _seconds(self, rows: int, tokens: int) -> float:
        """A measured forward as it was measured, else ``verify_seconds``' estimate."""
        if (seconds := self.verify.get((bucket(rows), tokens))) is None:
            seconds = self.verify_seconds(rows, tokens)
        if seconds is None:
            raise ValueError(f"no forward of {rows} x {tokens} tokens has been measured")
        return seconds

    def as_json(self) -> dict:
        """The measurements as JSON-friendly lists: ``[[B, T, seconds]]`` and ``[[R, seconds]]``."""
        return {"verify": [[b, t, s] for (b, t), s in sorted(self.verify.items())],
                "draft": [[r, s] for r, s in sorted(self.draft.items())]}

    def record_verify(self, rows: int, tokens: int, seconds: float) -> None:
        """Add one verify forward of ``rows`` x ``tokens``."""
        key = (bucket(rows), tokens)
        self.verify[key] = self._average(("verify", key), self.verify.get(key), seconds)

    def record_draft(self, rows: int, steps: int, seconds: float) -> None:
        """Add ``steps`` draft steps over ``rows`` rows that took ``seconds`` in all."""
        if steps > 0 and rows > 0:
            rows = bucket(rows)
            self.draft[rows] = self._average(("draft", rows), self.draft.get(rows), seconds / steps)

    def record_catch_up(self, tokens: int, seconds: float) -> None:
        """Add a step whose draft caches fed ``tokens`` lagging tokens in ``seconds``."""
        if tokens > 0:
            self.catch_up = self._average("catch_up", self.catch_up, seconds / tokens)

    def _average(self, key: object, old: float | None, new: float) -> float:
        """The moving average after ``new``; the second measurement replaces the first."""
        self.samples[key] = self.samples.get(key, 0) + 1
        return new if self.samples[key] <= 2 else (1 - self.smoothing) * old + self.smoothing * new

    def verify_seconds(self, rows: int, tokens: int) -> float | None:
        """A ``rows`` x ``tokens`` verify forward: measured, else on the line through the measured
        widths of this batch-size bucket (two at least), else one measured width times the ratio
        of the two widths at the nearest bucket that has a line (the smaller on a tie: the ratio
        grows with the batch, so a borrowed one errs towards trying to draft, and the step that
        tries measures the truth), else ``None``; never more than a wider forward of the bucket
        was measured to cost, nor than the line through two or more wider ones gives: an engine
        that drafts at every step never measures its plain step again, and a stale plain step
        priced as high as a two-token one would make every one-draft plan look free."""
        rows = bucket(rows)
        wider = [(t, s) for (b, t), s in self.verify.items() if b == rows and t > tokens]
        estimate = self._estimate(rows, tokens)
        if estimate is None or not wider:
            return estimate
        if len(wider) >= 2:                         # nor above the line through the wider ones
            estimate = min(estimate, _line_through(sorted(wider), tokens, floor=0.5))
        return min(estimate, min(s for _, s in wider))

    def _estimate(self, rows: int, tokens: int) -> float | None:
        """``verify_seconds`` before its cap by the wider forwards."""
        if (rows, tokens) in self.verify:
            return self.verify[rows, tokens]
        known = self._widths(rows)
        if len(known) >= 2:
            return _line_through(known, tokens)
        lines = [b for b in {b for b, _ in self.verify} if len(self._widths(b)) >= 2]
        if not known or not lines:
            return None
        (width, seconds), = known
        near = self._widths(min(lines, key=lambda b: (abs(b.bit_length() - rows.bit_length()), b)))
        return seconds * _line_through(near, tokens) / _line_through(near, width)

    def _widths(self, rows: int) -> list[tuple[int, float]]:
        """``[(T, seconds)]`` measured at the bucket ``rows``, by width."""
        return sorted((t, s) for (b, t), s in self.verify.items() if b == rows)

    def draft_seconds(self, rows: int) -> float | None:
        """One draft step over ``rows`` rows: measured, else on the line through the measured
        bucket(s) (one point: taken as it is), else ``None``."""
        rows = bucket(rows)
        if rows in self.draft:
            return self.draft[rows]
        if not (known := sorted(self.draft.items())):
            return None
        return known[0][1] if len(known) == 1 else _line_through(known, rows)


@dataclass(frozen=True)
class KChoice:
    """One step's choice: the batch size, the chosen ``k`` per request, and why.

    Attributes:
        batch_size: ``B``, the running requests.
        ks: the draft length given to each request (0: plain decoding for it).
        alphas: each request's acceptance estimate.
        goodput: ``{(K, R): predicted tokens per second}`` of each ``K``'s best plan (and of
            plain decoding, ``(0, 0)``).
        proposal_rates: each request's proposal-rate estimate ``P_b`` (empty when not planned).
    """

    batch_size: int
    ks: list[int]
    alphas: list[float]
    goodput: dict[tuple[int, int], float]
    proposal_rates: list[float] = field(default_factory=list)


def alpha_estimates(accepted: list[int], tested: list[int], pooled: float, strength: float = 4.0,
                    optimism: float = 1.0) -> list[float]:
    """Each request's acceptance: the mean of a Beta posterior whose prior is worth ``strength``
    drafts at the pooled rate, ``m = (acc + strength * pooled) / (tested + strength)``, plus
    ``optimism`` standard deviations ``sqrt(m (1 - m) / (tested + strength + 1))``, capped at 1.

    The prior starts a new request from what the engine has seen; the engine passes
    ``optimism = 1 / B`` at batch size ``B`` (an upper confidence bound): a request that stopped
    drafting on an unlucky start gets to try again as the bonus outweighs the evidence, and one
    with a long record is judged on it. The bonus shrinks with the batch because one request
    learns from a draft while every row pays for the wider verify it brings (one standard
    deviation for all made a wave of 16 new requests draft, and lose, at batch size 16)."""
    out = []
    for a, t in zip(accepted, tested, strict=True):
        mean = (a + strength * pooled) / (t + strength)
        out.append(min(1.0, mean + optimism * (mean * (1 - mean) / (t + strength + 1)) ** 0.5))
    return out


def choose_ks(alphas: list[float], caps: list[int], k_max: int, costs: StepCosts,
              margin: float = 0.30, proposal_rates: list[float] | None = None,
              hurdle: float = HURDLE, lags: list[float] | None = None) -> KChoice | None:
    """The goodput-maximising plan; ``None`` when a needed cost is unknown.

    Of every ``K`` in ``0..k_max`` and every ``R``, the plan "the ``R`` requests with the highest
    acceptance draft ``K`` tokens, the others none" with the most expected tokens per second::

        tokens(K, R) = sum_{top R} t_b + (B - R),   t_b = 1 + P_b (E(alpha_b, K) - 1)
        seconds(K, R) = verify(B, 1)
                        + (1 + m) [P_any (verify(B, K + 1) - verify(B, 1)) + K draft(R)]
                        + catch_up sum_{top R} t_b lag_b / left_b

    where ``P_b`` is the rate at which request ``b``'s drafter proposes anything when asked (1 for
    a draft model; an n-gram table without a match proposes nothing, and that row yields one
    token) and ``P_any = 1 - prod_{top R} (1 - P_b)`` the chance that the verify is wider than a
    plain step. ``lag_b`` is what request ``b``'s draft cache must feed before it drafts (kept by
    [`GoodputK`][minispec.speed.goodput.GoodputK]: a draft model skips the plain steps and
    catches up on them when next asked), ``catch_up`` its measured seconds per token, and
    ``left_b`` the tokens the request may still generate: a catch-up buys drafting for the rest of
    the request, so its cost is spread over those tokens, and a step pays the share of the ``t_b``
    tokens it expects from the row. Unpriced, a catch-up costs about a whole plain step the plan
    did not foresee; charged in full to the step that catches up, the lag grows with every plain
    step until no plan can pay it. A request that stops early (a stop token) leaves part of its
    share unpaid.

    What drafting adds to a step's cost is charged ``1 + m`` times (``margin``, 0.3 by default).
    Drafting costs more than the step it is planned in: requests that accept drafts run ahead of the
    others, so the batch refills through more and smaller prefill forwards (and a draft model
    catches each newcomer up), and a run ends in a tail of small steps. None of that is in the
    step's seconds, so a plan predicting a small gain per step can lose end to end. A batch of one
    request has no batch to refill and no tail, so it is charged no margin (a margin there would
    decline a draft model at batch size 1 where it pays). Charging the extra cost (not the whole
    step) keeps cheap bets: a drafter that proposes nothing costs a plain step.

    A plan is run only if it predicts at least ``1 + h`` times plain decoding's goodput (``hurdle``,
    ``HURDLE`` = 0.1 by default): the estimates it is computed from (moving averages of a few steps,
    an acceptance learned from a few rounds) are not better than that, and a bet inside their error
    is a coin toss that pays the drafter's machinery either way. The results page measures the
    engine with and without this policy.

    Args:
        alphas: acceptance estimate of each running request.
        caps: the most drafts each request may take this round (its limits; 0: none).
        k_max: the engine's ``k``.
        costs: the measured step costs.
        margin: the factor ``m`` on what drafting adds to a step's seconds, with two requests or
            more (above).
        proposal_rates: ``P_b`` of each request (default: 1, a drafter that always proposes).
        hurdle: the least predicted gain over plain decoding a plan needs to be chosen (above).
        lags: each request's ``lag_b / left_b``, the catch-up it owes per token it may still
            generate (default: 0, none lags); of requests with equal expected gains, the one
            that owes less drafts first.
    """
    B = len(alphas)
    rates = proposal_rates if proposal_rates is not None else [1.0] * B
    lags = lags or [0] * B
    order = sorted(range(B), key=lambda b: (-alphas[b] * rates[b], lags[b]))  # best gain first
    verifies = [costs.verify_seconds(B, K + 1) for K in range(k_max + 1)]  # [K]: K drafts a row
    drafts = [costs.draft_seconds(R) for R in range(1, B + 1)]       # one draft step, R rows
    if None in verifies or None in drafts:
        return None
    plain = verifies[0]
    goodput, best = {(0, 0): B / plain}, ((1 + hurdle) * B / plain, 0, 0)  # to beat: plain + h
    # E(alpha_b, min(K, cap_b)) = 1 + alpha + ... + alpha^K, grown one power at a time, per row
    power, expected = [1.0] * B, [1.0] * B
    for K in range(1, k_max + 1):
        for b in range(B):
            if K <= caps[b]:
                power[b] *= alphas[b]
                expected[b] += power[b]
        tokens, none_propose, owed, top = float(B), 1.0, 0.0, (0.0, K, 0)  # R = 0: 1 token a row
        for R, b in enumerate(order, start=1):
            gain = rates[b] * (expected[b] - 1)        # row b drafts: E tokens instead of 1
            tokens += gain
            none_propose *= 1 - rates[b]
            owed += costs.catch_up * lags[b] * (1 + gain)  # its share of its cache's catch-up
            extra = (1 - none_propose) * (verifies[K] - plain) + K * drafts[R - 1]
            seconds = plain + (1 + margin * (B > 1)) * extra + owed     # B = 1: no margin
            top = max(top, (tokens / seconds, K, R), key=lambda p: p[0])
        goodput[top[1:]] = top[0]   # only each K's best: all K x B plans cost 17 KB a step at B=32
        best = max(best, top, key=lambda p: p[0])  # the first of equals stays
    _, K, R = best
    drafting = set(order[:R])
    ks = [min(K, caps[b]) if b in drafting else 0 for b in range(B)]
    return KChoice(B, ks, list(alphas), goodput, list(rates))


def _line_through(points: list[tuple[int, float]], x: int, floor: float = 1.0) -> float:
    """Least-squares line through ``points`` (two or more widths) evaluated at ``x`` (never below
    ``floor`` times the smallest value)."""
    xs, ys = [p for p, _ in points], [s for _, s in points]         # widths or rows, seconds
    slope, intercept = statistics.linear_regression(xs, ys)
    return max(floor * min(ys), intercept + slope * x)


class GoodputK:
    """The engine's draft-length policy: learns step costs and acceptance from the steps it runs
    and picks each step's ``k`` per request with [`choose_ks`][minispec.speed.goodput.choose_ks].

    Args:
        k_max: the most drafts a request may take (the engine's ``k``).
        hurdle: the least predicted gain a drafting plan needs
            ([`choose_ks`][minispec.speed.goodput.choose_ks]).

    Attributes:
        costs: the measured [`StepCosts`][minispec.speed.goodput.StepCosts].
        choices: the latest [`KChoice`][minispec.speed.goodput.KChoice] records, one per step
            (a step whose rows may not draft at all included, so that a single sequence has one
            per round).
    """

    def __init__(self, k_max: int, hurdle: float = HURDLE) -> None:
        if not hurdle >= 0:                       # NaN fails this too
            raise ValueError(f"hurdle must be a number >= 0, got {hurdle!r}")
        self.k_max, self.hurdle, self.costs = k_max, hurdle, StepCosts()
        self.choices: deque[KChoice] = deque(maxlen=10_000)
        self.accepted = self.tested = 0             # drafts, pooled over all requests
        self.asked: dict[str, list[int]] = {}       # request -> [rounds asked to draft, proposed]
        self.proposals = [0, 0]                     # the same, pooled over all requests
        self.retry: dict[int, tuple[int, int]] = {}  # bucket -> (step to draft again, interval)
        self.steps = 0
        self.unchanged: tuple | None = None         # the inputs of the last plain plan
        self.lag: dict[str, int] = {}               # request -> tokens its draft cache lacks

    def round(self, runner: SpeculativeRunner, seqs: list[Sequence], caps: list[int]
              ) -> list[list[int]]:
        """Run ``runner.round`` with each row's ``k`` chosen here, and learn from it.

        The round has no clock: this policy times it (``time.perf_counter``), the draft phase
        up to the round's ``mark("draft")``. Each request's lag is kept here: the
        tokens a lazy draft cache (a draft model) must feed before it drafts again -- its context
        at first, then every token of the rounds it did not draft. A seeded sampled row always
        drafts its cap: which random numbers a round draws depends on ``k``, and a ``k`` chosen
        from the clock and the batch would make its tokens depend on them.
        """
        lags = [self.lag.setdefault(s.request_id, s.num_tokens - 1) for s in seqs]
        ks = self.choose([(s.request_id, s.stats.accepted, s.stats.tested) for s in seqs], caps,
                         fixed=[s.sampling.seed is not None and not s.sampling.greedy
                                for s in seqs],
                         lags=[n / max(1, s.tokens_left) for n, s in zip(lags, seqs, strict=True)])
        rounds, marks = [s.stats.rounds for s in seqs], {}
        start = time.perf_counter()
        emitted = runner.round(seqs, ks, mark=lambda phase: marks.setdefault(phase,
                                                                             time.perf_counter()))
        seconds, draft_s = time.perf_counter() - start, marks["draft"] - start
        verdicts = [(s.stats.drafted_per_round[-1], s.stats.accepted_per_round[-1])
                    if s.stats.rounds > r else (0, None) for s, r in zip(seqs, rounds, strict=True)]
        self.learn([s.request_id for s in seqs], ks, [d for d, _ in verdicts],
                   [a for _, a in verdicts], draft_s, seconds - draft_s, lags)
        for s, k, n, out in zip(seqs, ks, lags, emitted, strict=True):
            self.lag[s.request_id] = 0 if k else n + len(out)
        return emitted

    def choose(self, requests: list[tuple[str, int, int]], caps: list[int],
               fixed: list[bool] | None = None, lags: list[float] | None = None) -> list[int]:
        """Each request's ``k`` this step. ``requests[b]``: (id, drafts accepted, drafts tested);
        ``caps[b]``: its most drafts this round; ``fixed[b]``: it drafts ``caps[b]`` whatever the
        plan (a seeded sampled request, whose tokens must not depend on the batch); ``lags[b]``:
        the tokens its draft cache must catch up on before it drafts per token it may still
        generate (``choose_ks``). While the
        costs at this batch size are unknown, a plain step and a full step measure them. A plain
        plan that no drafting plan beat, hurdle aside, is not searched again while its inputs
        stand: no row has drafted (the records are the same), none has come or gone and no cap
        moved; a search is a visible share of a small model's step.
        A plan kept plain by the hurdle alone is searched every step: the costs drift, and it
        may win."""
        self.steps += 1
        # no row has drafted since the last plain plan and none came or went: the plan stands
        # (the costs' drift waits for the next re-check or change of batch)
        inputs = (tuple(requests), tuple(caps))
        if inputs == self.unchanged and self.steps < self.retry[bucket(len(caps))][0]:
            self.choices.append(self.choices[-1])
            return list(self.choices[-1].ks)
        pooled = (self.accepted + 1) / (self.tested + 2)
        alphas = alpha_estimates([a for _, a, _ in requests], [t for _, _, t in requests], pooled,
                                 optimism=1 / len(caps))    # one row learns, B rows pay the width
        P = self.proposal_rates([r for r, _, _ in requests])
        if not any(caps):                         # no row may draft (each one at its limits)
            choice = KChoice(len(caps), list(caps), alphas, {})
        elif (choice := choose_ks(alphas, caps, self.k_max, self.costs, proposal_rates=P,
                                  hurdle=self.hurdle, lags=lags)) is None:
            # explore: measure a plain step, then a full one
            plain_known = self.costs.verify_seconds(len(caps), 1) is not None
            choice = KChoice(len(caps), caps if plain_known else [0] * len(caps), alphas, {})
        elif not any(choice.ks) and self.time_to_retry(bucket(len(caps))):
            # look again (acceptance drifts) with the cheapest round that measures it: one draft,
            # by the row likeliest to take it (a draft model catches one row up, not B)
            best = max(range(len(caps)), key=lambda b: alphas[b] * P[b] * (caps[b] > 0))
            choice = KChoice(len(caps), [int(b == best) for b in range(len(caps))], alphas, {})
        # a plain plan stands if no drafting plan beat it, hurdle aside (a near one may win as
        # the costs drift, so it is searched again next step)
        g = choice.goodput
        stands = g and max(g.values()) == g[0, 0] and not any(fixed or ())
        self.unchanged = inputs if stands else None
        if fixed is not None and any(fixed):
            ks = [c if f else k for k, c, f in zip(choice.ks, caps, fixed, strict=True)]
            choice = dataclasses.replace(choice, ks=ks)
        self.choices.append(choice)
        return choice.ks

    def proposal_rates(self, request_ids: list[str], strength: float = 4.0) -> list[float]:
        """How often each request's drafter proposed anything when asked: its own rounds, shrunk
        towards the pooled rate (which starts at 1: a drafter is trusted to propose until seen)."""
        asked, proposed = self.proposals
        pooled = (proposed + 1) / (asked + 1)
        counts = [self.asked.get(rid, (0, 0)) for rid in request_ids]
        return [(p + strength * pooled) / (a + strength) for a, p in counts]

    def time_to_retry(self, rows: int) -> bool:
        """While drafting does not pay, one row drafts anyway after 8, then 16, 32, ... plain
        steps (at this batch-size bucket): an estimate spoiled by an unlucky start, or a text that
        turned repetitive, is measured again; the cost of looking shrinks geometrically."""
        due, interval = self.retry.setdefault(rows, (self.steps + 8, 8))
        if self.steps < due:
            return False
        self.retry[rows] = (self.steps + 2 * interval, 2 * interval)
        return True

    def learn(self, request_ids: list[str], ks: list[int], drafted: list[int],
              accepted: list[int | None], draft_s: float, verify_s: float, lags: list[int]
              ) -> None:
        """Feed one step's measured costs and outcomes (``accepted[b]`` is ``None`` for a row that
        failed; ``lags[b]`` its draft cache's lag before the step). A step that fed lagging
        caches prices the catch-up: what its draft phase took beyond the draft steps already
        known (all of it while none is known); the others price the draft steps. Acceptance is
        counted over the drafts proposed; how often a drafter proposes anything when asked is
        counted apart (an n-gram table without a match proposes nothing)."""
        rows, steps = sum(k > 0 for k in ks), max(ks, default=0)
        owed = sum(n for n, k in zip(lags, ks, strict=True) if k)     # lagging tokens fed
        self.costs.record_verify(len(ks), 1 + max(drafted, default=0), verify_s)
        if owed and steps:
            known = self.costs.draft_seconds(rows)             # None while none is measured
            self.costs.record_catch_up(owed, max(0.0, draft_s - steps * (known or 0.0)))
        else:
            self.costs.record_draft(rows, steps, draft_s)
        for rid, k, d, a in zip(request_ids, ks, drafted, accepted, strict=True):
            if a is not None and k > 0:
                self.accepted += a
                self.tested += a + (a < d)
                counts = self.asked.setdefault(rid, [0, 0])
                for c in (counts, self.proposals):
                    c[0] += 1
                    c[1] += d > 0

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a finished request."""
        self.asked.pop(request_id, None)
        self.lag.pop(request_id, None)
