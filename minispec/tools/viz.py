"""Pictures of speculative decoding for lessons and notebooks (layer "faces").

One concept per function. Matplotlib is imported inside the functions that draw, so that
``import minispec.tools.viz`` stays cheap and the package does not need matplotlib to run.

* [`plot_overlap`][minispec.tools.viz.plot_overlap] -- the overlap picture of one position: how much
  of the draft ``q`` the target ``p`` keeps (``min(p, q)``), how much it throws away
  (``max(0, q - p)``), and what the residual has to supply after a rejection (``max(0, p - q)``).
* [`trace`][minispec.tools.viz.trace] -- Leviathan et al.'s Figure 1 for a generation: accepted
  drafts in green, the rejected draft in red (struck through), the target's own token
  (correction) in blue, the bonus token in purple; HTML in a notebook, ANSI colours in a terminal.
* [`record_race`][minispec.tools.viz.record_race] -- plain and speculative decoding of one prompt,
  each token with the time it came out (the data of the site's race);
* [`record_rounds`][minispec.tools.viz.record_rounds] -- every number of a few real rounds (the
  drafts with their ``q(x)`` and ``p(x)``, the uniform ``u`` each test drew, the verdicts, the
  ``min(p, q)`` picture of the judged position, the residual, the correction or bonus), as plain
  data: the site's step-through widget draws it.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minispec.core.theory import acceptance_rate

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["OVERLAP_COLORS", "OVERLAP_LABELS", "Trace", "plot_overlap", "record_race",
           "record_rounds", "trace"]

#: Legend labels of the four layers drawn by [`plot_overlap`][minispec.tools.viz.plot_overlap]
#: (tests look bars up by them).
OVERLAP_LABELS = {
    "accepted": "accepted: min(p, q)",
    "excess": "draft excess: max(0, q - p)",
    "residual": "residual: max(0, p - q)",
    "target": "target p",
}

#: Colours of the layers: green is kept, red is thrown away, blue is what the residual adds back.
#: The site's widgets use the same palette (docs/stylesheets/extra.css); each colour has a contrast
#: of at least 4.5:1 on white (WCAG AA for text), and the residual is also told apart by its hatch.
OVERLAP_COLORS = {
    "accepted": "#1b7a1b",
    "excess": "#c62828",
    "residual": "#1565c0",
    "target": "black",
}


def _as_distribution(x: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty [V] distribution, got shape {tuple(t.shape)}")
    if torch.isnan(t).any() or (t < 0).any():
        raise ValueError(f"{name} must be non-negative and free of NaN")
    return t


def plot_overlap(
    p: Any,
    q: Any,
    ax: Axes | None = None,
    labels: Sequence[str] | None = None,
    top: int | None = None,
) -> Axes:
    """Draw the overlap of target ``p`` and draft ``q`` at one position, token by token.

    For every token ``x`` the draft's bar ``q(x)`` is split in two stacked parts:

    * green, ``min(p(x), q(x))`` -- the part of the proposal speculative sampling keeps. A token
      drawn from ``q`` survives with probability ``min(1, p(x)/q(x))``, i.e. green height over
      total bar height, and the green areas add up to the acceptance rate
      ``beta = sum_x min(p(x), q(x))`` (Leviathan Thm 3.5);
    * red, ``max(0, q(x) - p(x))`` -- where the draft over-proposes; these proposals are rejected.

    On top of ``q`` a hatched blue part ``max(0, p(x) - q(x))`` marks what the draft under-proposes:
    the residual distribution (after normalisation) that a rejection samples from. The target
    ``p(x)`` itself is the black outline, so green + blue always reaches the outline: kept
    proposals plus residual refills rebuild ``p`` exactly. The title reports ``beta`` and
    ``D_LK = 1 - beta``.

    Args:
        p: ``[V]`` target distribution (tensor, array or list).
        q: ``[V]`` draft distribution, same ``V``.
        ax: the matplotlib Axes to draw on; ``None`` creates a new figure.
        labels: ``V`` tick labels (token strings); default: token ids.
        top: show only the ``top`` tokens with the largest ``max(p, q)``, most likely first;
            ``None`` shows the whole vocabulary in id order. ``beta`` in the title is always
            computed on the whole vocabulary.

    Returns:
        The Axes. Its bar containers carry the labels in ``OVERLAP_LABELS``, in the order
        accepted, draft excess, residual, target.
    """
    import matplotlib.pyplot as plt

    p_t, q_t = _as_distribution(p, "p"), _as_distribution(q, "q")
    if p_t.shape != q_t.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p_t.shape)} and "
                         f"{tuple(q_t.shape)}")
    vocab = p_t.numel()
    if labels is not None and len(labels) != vocab:
        raise ValueError(f"labels must have one entry per token ({vocab}), got {len(labels)}")
    if top is not None and top < 1:
        raise ValueError(f"top must be >= 1, got {top}")

    beta = float(acceptance_rate(p_t, q_t))
    if top is None or top >= vocab:
        order = torch.arange(vocab)
    else:
        order = torch.argsort(torch.maximum(p_t, q_t), descending=True, stable=True)[:top]
    p_s, q_s = p_t[order], q_t[order]                                     # (n,)
    accepted = torch.minimum(p_s, q_s)
    excess = (q_s - p_s).clamp_min(0)
    refill = (p_s - q_s).clamp_min(0)
    ticks = [labels[i] if labels is not None else str(i) for i in order.tolist()]

    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(ticks) + 1.5), 3.2))
    xs = list(range(len(ticks)))
    ax.bar(xs, accepted.tolist(), width=0.7, color=OVERLAP_COLORS["accepted"],
           label=OVERLAP_LABELS["accepted"])
    ax.bar(xs, excess.tolist(), width=0.7, bottom=accepted.tolist(),
           color=OVERLAP_COLORS["excess"], label=OVERLAP_LABELS["excess"])
    ax.bar(xs, refill.tolist(), width=0.7, bottom=accepted.tolist(), color="none",
           edgecolor=OVERLAP_COLORS["residual"], hatch="///", linewidth=0.0,
           label=OVERLAP_LABELS["residual"])
    ax.bar(xs, p_s.tolist(), width=0.86, color="none", edgecolor=OVERLAP_COLORS["target"],
           linewidth=1.4, label=OVERLAP_LABELS["target"])
    ax.set_xticks(xs, ticks, rotation=0 if max((len(t) for t in ticks), default=0) <= 3 else 45)
    ax.set_xlabel("token")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1.15 * max(float(torch.maximum(p_s, q_s).max()), 1e-12))
    ax.set_title(rf"$\beta = \sum \min(p, q) = {beta:.3f}$,  "
                 rf"$D_{{LK}} = 1 - \beta = {1 - beta:.3f}$")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


#: Figure-1 colours of a trace: kind -> (HTML colour, ANSI escape). The HTML colours read at
#: 4.5:1 or more on white and on a code cell's grey (WCAG AA), the palette of the site's widgets.
TRACE_STYLES = {
    "accepted": ("#1b7a1b", "\x1b[32m"),
    "rejected": ("#c62828", "\x1b[31;9m"),
    "correction": ("#1565c0", "\x1b[34;1m"),
    "bonus": ("#6a3d9a", "\x1b[35;1m"),
}

#: What tells the kinds apart besides colour (for a reader who cannot see it): a rejected draft is
#: struck through, a correction is bold, a bonus token bold and underlined.
TRACE_CUES = {
    "accepted": "",
    "rejected": ";text-decoration:line-through",
    "correction": ";font-weight:700",
    "bonus": ";font-weight:700;text-decoration:underline",
}

#: The round separator ``|``: grey at 5.3:1 on white.
TRACE_SEPARATOR = "#6b6b6b"

#: What each kind of span is, as the legend under a trace says it.
TRACE_LABELS = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "correction": "correction (from the residual)",
    "bonus": "bonus (target's extra token)",
}


def _html_style(kind: str) -> str:
    return f"color:{TRACE_STYLES[kind][0]}{TRACE_CUES[kind]}"


@dataclass(frozen=True)
class Trace:
    """A decoded generation split into coloured spans, one list of ``(text, kind)`` per round.

    ``kind`` is ``"accepted"`` (a draft the target kept), ``"rejected"`` (the first draft it
    refused; later drafts of that round were never tested and are not shown), ``"correction"``
    (the token drawn from the residual in its place) or ``"bonus"`` (the target's extra token after
    a round where every draft was accepted). Displays as HTML in a notebook and with ANSI colours
    in a terminal (``print(trace)``), each with a legend of the four colours
    (``TRACE_LABELS``) and ``|`` between rounds.
    """

    rounds: list[list[tuple[str, str]]]

    def counts(self) -> dict[str, int]:
        """How many spans of each kind."""
        out = dict.fromkeys(TRACE_STYLES, 0)
        for spans in self.rounds:
            for _, kind in spans:
                out[kind] += 1
        return out

    def _repr_html_(self) -> str:
        parts = []
        for spans in self.rounds:
            for text, kind in spans:
                parts.append(f'<span class="ms-{kind}" style="{_html_style(kind)}">'
                             f"{html.escape(text)}</span>")
            parts.append(f'<span style="color:{TRACE_SEPARATOR}">|</span>')
        legend = " &nbsp; ".join(
            f'<span class="ms-legend-{kind}" style="{_html_style(kind)}">'
            f'{html.escape(label)}</span>'
            for kind, label in TRACE_LABELS.items()
        ) + f' &nbsp; <span style="color:{TRACE_SEPARATOR}">|</span> end of a round'
        return ('<div class="ms-trace-figure">'
                '<div class="ms-trace" style="font-family:monospace;white-space:pre-wrap">'
                + "".join(parts) + "</div>"
                + '<div class="ms-trace-legend" style="font-size:0.85em;margin-top:0.4em">'
                + legend + "</div></div>")

    def __str__(self) -> str:
        """The trace in ANSI colours, then a one-line legend."""
        reset = "\x1b[0m"
        text = "\x1b[2m|\x1b[0m".join(
            "".join(f"{TRACE_STYLES[kind][1]}{text}{reset}" for text, kind in spans)
            for spans in self.rounds
        )
        legend = "  ".join(f"{TRACE_STYLES[kind][1]}{label}{reset}"
                           for kind, label in TRACE_LABELS.items())
        return f"{text}\n\x1b[2mkey:{reset} {legend}  \x1b[2m|{reset} end of a round"


def trace(result: Any, tokenizer: Any = None) -> Trace:
    """Figure 1 of Leviathan et al. for a
    [`GenerationResult`][minispec.decoding.request.GenerationResult].

    Args:
        result: the output of ``speculative_generate`` (its ``rounds``).
        tokenizer: decodes each token; without one tokens are shown as ``[id]``.

    Returns:
        A [`Trace`][minispec.tools.viz.Trace] (HTML in notebooks, ANSI with ``print``).
    """
    def show(token: int) -> str:
        return tokenizer.decode([token]) if tokenizer is not None else f"[{token}]"

    rounds = []
    for rnd in result.rounds:
        spans = []
        for i, token in enumerate(rnd.emitted):
            if i < rnd.num_accepted:
                spans.append((show(token), "accepted"))
            else:
                if rnd.num_accepted < len(rnd.drafts):
                    spans.append((show(rnd.drafts[rnd.num_accepted]), "rejected"))
                    spans.append((show(token), "correction"))
                else:
                    spans.append((show(token), "bonus"))
        rounds.append(spans)
    return Trace(rounds)


def _top(dist: torch.Tensor, n: int) -> list[int]:
    """The ``n`` most likely token ids of ``dist``, most likely first (ties: lower id first)."""
    return torch.argsort(dist, descending=True, stable=True)[:n].tolist()


@torch.inference_mode()
def record_rounds(
    target: Any,
    draft: Any,
    prompt_ids: Sequence[int],
    num_rounds: int = 10,
    k: int = 4,
    sampling: Any = None,
    tokenizer: Any = None,
    top: int = 8,
) -> dict[str, Any]:
    """Run ``num_rounds`` speculative rounds and record every number they use.

    Each round is Algorithm 1 of Leviathan et al. as the lessons teach it, with no cache (every
    forward reads the whole context, so the numbers do not depend on cache bookkeeping):

    1. a draft model samples ``k`` tokens one after another, each from its adjusted
       distribution ``q_i`` (``probs_from_logits`` with ``sampling``); a context drafter
       (``PromptLookupDrafter``, ``NGramDrafter``) proposes up to ``k`` tokens copied from the
       text, with a one-hot ``q`` (none when it finds no match: the round is a plain step);
    2. one target forward over the context and the drafts gives ``p_1..p_{k+1}``;
    3. ``k`` uniforms ``u_i`` are drawn and [`verify`][minispec.core.speculative.verify] judges the
       drafts with them (``uniforms=``): draft ``i`` is kept iff ``u_i < p_i(x_i) / q_i(x_i)``, the
       first rejection ends the round with a correction drawn from the residual
       ``norm(max(0, p - q))``, and a round that keeps all ``k`` ends with a bonus token from
       ``p_{k+1}``.

    One ``torch.Generator`` seeded from ``sampling.seed`` draws everything, in that order.

    Args:
        target: the target model ``p`` (a [`Llama`][minispec.models.llama.Llama]).
        draft: the draft model ``q`` (same vocabulary), or a context drafter
            ([`ContextDrafter`][minispec.drafters.ngram.ContextDrafter]: ``lookup(context, k)``).
        prompt_ids: the prompt's token ids.
        num_rounds: how many rounds to record.
        k: drafts per round.
        sampling: a [`SamplingParams`][minispec.core.sampling.SamplingParams] applied to both models
            (default: temperature 1, seed 0); the repetition penalty is not supported here.
        tokenizer: decodes tokens to text (default: ``[id]``).
        top: how many tokens the ``min(p, q)`` picture of the judged position lists.

    Returns:
        A JSON-ready dict: ``prompt`` (text), ``settings`` (``drafter``: ``"model"`` or
        ``"context"``), and ``rounds``, each with
        ``context_before`` and ``context_after`` (tokens in the context), ``drafts`` (per draft:
        ``token``, ``text``, ``q``, ``p``, ``u``, ``beta`` = ``sum min(p_i, q_i)``, ``verdict``
        ``"accepted"``, ``"rejected"`` or ``"untested"``, and for a tested position ``bars``: its
        ``top`` tokens with ``p``, ``q`` and ``min(p, q)``), ``final`` (the correction or bonus
        token, its ``kind``, the probability it was drawn with, and the residual's top tokens or
        the bonus position's ``bars``), ``num_accepted`` and ``emitted``. Probabilities are
        rounded to six decimals.
    """
    from minispec.core.sampling import SamplingParams, one_hot, probs_from_logits, sample
    from minispec.core.speculative import residual, verify
    from minispec.core.tree import Proposal
    from minispec.drafters.ngram import ContextDrafter

    sampling = sampling if sampling is not None else SamplingParams(temperature=1.0, seed=0)
    if sampling.repetition_penalty != 1.0:
        raise ValueError("record_rounds does not apply a repetition penalty")
    if k < 1 or num_rounds < 1:
        raise ValueError(f"k and num_rounds must be >= 1, got {k} and {num_rounds}")
    generator = sampling.make_generator()

    def text(token: int) -> str:
        return tokenizer.decode([token]) if tokenizer is not None else f"[{token}]"

    def probs(model: Any, ids: list[int], rows: int) -> torch.Tensor:
        """The adjusted distributions after the last ``rows`` positions of ``ids``: (rows, V)."""
        x = torch.tensor([ids])
        logits = model(x, torch.arange(len(ids))[None])[0, -rows:]
        return probs_from_logits(logits, sampling).double()

    def bars(p: torch.Tensor, q: torch.Tensor | None, *keep: int) -> list[dict[str, Any]]:
        """The ``top`` tokens of max(p, q) (or of p alone), the tokens ``keep`` (the draft, the
        token drawn from the residual) always among them, in order of max(p, q)."""
        score = p if q is None else torch.maximum(p, q)
        ranked = _top(score, top)
        for t in keep:
            if t not in ranked:                              # in place of the least, not kept
                ranked[max(i for i, r in enumerate(ranked) if r not in keep)] = t
        ranked.sort(key=lambda t: -float(score[t]))
        out = []
        for t in ranked:
            row = {"token": t, "text": text(t), "p": round(float(p[t]), 6)}
            if q is not None:
                row.update(q=round(float(q[t]), 6), min=round(float(min(p[t], q[t])), 6))
            out.append(row)
        return out

    def propose(ids: list[int]) -> tuple[list[int], torch.Tensor]:
        """Step 1: the drafts and their ``q`` rows ``(n, V)``."""
        if isinstance(draft, ContextDrafter):                # a context drafter: one-hot q
            tokens = draft.lookup(list(ids), k)
            return tokens, one_hot(torch.tensor(tokens, dtype=torch.long), vocab).double()
        drafts, qs = [], []
        for _ in range(k):                                   # k draft steps, each from q_i
            q_i = probs(draft, ids + drafts, 1)[0]
            drafts.append(int(sample(q_i, generator)))
            qs.append(q_i)
        return drafts, torch.stack(qs)                       # (k, V)

    vocab = target.config.vocab_size
    ids = list(prompt_ids)
    rounds = []
    for _ in range(num_rounds):
        before = len(ids)
        drafts, q = propose(ids)                             # 1. the guesses and their q
        n = len(drafts)
        p = probs(target, ids + drafts, n + 1)               # 2. one target forward: (n+1, V)
        u = torch.rand(n, generator=generator, dtype=torch.float64)   # 3. the n uniforms
        verdict = verify(Proposal.chain(drafts, q), p, generator, greedy=False, uniforms=u)
        a = verdict.num_accepted
        rows = []
        for i, x in enumerate(drafts):
            rows.append({
                "token": x, "text": text(x), "q": round(float(q[i, x]), 6),
                "p": round(float(p[i, x]), 6), "u": round(float(u[i]), 6),
                "beta": round(float(torch.minimum(p[i], q[i]).sum()), 6),
                "verdict": "accepted" if i < a else ("rejected" if i == a else "untested"),
                # the min(p, q) picture of every tested position
                "bars": [],
            })
        last = verdict.tokens[-1]
        for i in range(min(a + 1, n)):                       # a rejected draft's chart also
            keep = (drafts[i], last) if i == a else (drafts[i],)     # shows the token drawn
            rows[i]["bars"] = bars(p[i], q[i], *keep)
        if a < n:
            res = residual(p[a], q[a])
            final = {"token": last, "text": text(last), "kind": "correction",
                     "prob": round(float(res[last]), 6),
                     "residual": [{"token": t, "text": text(t), "prob": round(float(res[t]), 6)}
                                  for t in _top(res, 5) if res[t] > 0]}
        else:
            final = {"token": last, "text": text(last), "kind": "bonus",
                     "prob": round(float(p[n, last]), 6), "bars": bars(p[n], None, last)}
        ids += verdict.tokens
        rounds.append({"context_before": before, "context_after": len(ids), "drafts": rows,
                       "final": final, "emitted": list(verdict.tokens), "num_accepted": a})
    return {
        "prompt": (tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
                   if tokenizer is not None else ""),
        "prompt_tokens": len(prompt_ids),
        "settings": {"k": k, "temperature": sampling.temperature, "top_k": sampling.top_k,
                     "top_p": sampling.top_p, "seed": sampling.seed,
                     "drafter": "context" if isinstance(draft, ContextDrafter) else "model"},
        "rounds": rounds,
    }


def record_race(target: Any, drafter: Any, prompt: Any, max_new_tokens: int = 64, k: int = 4,
                tokenizer: Any = None, clock: Any = time.process_time) -> dict[str, Any]:
    """Plain and speculative greedy decoding of one prompt, with the time each token came out.

    Both run in the [`Engine`][minispec.serving.engine.Engine] at batch size 1, greedy, the
    speculative one with a fixed ``k`` (``adaptive=False``): ``Engine.stream`` yields each token
    when its step is done, so the tokens of one round come out together. Each is warmed up once
    first; times are seconds of ``clock`` since the request was added (its prefill included).
    The default clock is the process's CPU time: on one thread (set it before calling) it counts
    this work only, not what other processes do meanwhile.

    Args:
        target: the target model.
        drafter: what ``Engine(drafter=...)`` takes, e.g. ``"prompt_lookup"``.
        prompt: token ids, a string or chat messages (``tokenizer`` needed for the last two).
        max_new_tokens: tokens per run.
        k: drafts per round.
        tokenizer: encodes the prompt and decodes each token for display.
        clock: a function returning seconds.

    Returns:
        A JSON-ready dict: ``settings``, ``clock``, ``identical`` (the two outputs are the same
        tokens, as greedy speculation guarantees) and ``runs``: ``{"plain": ..., "speculative":
        ...}``, each with ``tokens``, ``texts``, ``times`` (one per token), ``seconds`` and
        ``target_forwards``.
    """
    from minispec.serving.engine import Engine

    def run(engine: Engine, n: int) -> dict[str, Any]:
        start, tokens, times, stats = clock(), [], [], None
        for out in engine.stream([prompt], max_new_tokens=n):
            if out.token is not None:
                tokens.append(out.token)
                times.append(round(clock() - start, 6))
            stats = out.stats or stats
        texts = [tokenizer.decode([t]) if tokenizer is not None else f"[{t}]" for t in tokens]
        return {"tokens": tokens, "texts": texts, "times": times,
                "seconds": times[-1] if times else 0.0,
                "target_forwards": stats.target_forwards if stats is not None else 0}

    runs = {}
    for name, spec in (("plain", None), ("speculative", drafter)):
        engine = Engine(target, drafter=spec, k=k, max_batch_size=1, tokenizer=tokenizer,
                        adaptive=False if spec is not None else None)
        run(engine, 8)                                           # warm-up
        runs[name] = run(engine, max_new_tokens)
    return {"settings": {"k": k, "max_new_tokens": max_new_tokens, "greedy": True,
                         "drafter": str(drafter), "threads": torch.get_num_threads()},
            "clock": getattr(clock, "__name__", str(clock)),
            "identical": runs["plain"]["tokens"] == runs["speculative"]["tokens"],
            "runs": runs}
