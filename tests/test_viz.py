"""minispec.tools.viz: the overlap picture draws exactly min(p, q), max(0, q - p) and
max(0, p - q)."""

import subprocess
import sys

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import minispec as ms  # noqa: E402
from minispec.tools import viz  # noqa: E402
from minispec.tools.viz import OVERLAP_LABELS, plot_overlap  # noqa: E402


def _bars(ax):
    """label -> (heights, bottoms) of every bar container on ``ax``."""
    out = {}
    for container in ax.containers:
        heights = torch.tensor([r.get_height() for r in container.patches], dtype=torch.float64)
        bottoms = torch.tensor([r.get_y() for r in container.patches], dtype=torch.float64)
        out[container.get_label()] = (heights, bottoms)
    return out


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _pair():
    # Zeros on both sides and a token where p == q.
    p = torch.tensor([0.30, 0.00, 0.25, 0.10, 0.35, 0.00], dtype=torch.float64)
    q = torch.tensor([0.10, 0.20, 0.25, 0.30, 0.00, 0.15], dtype=torch.float64)
    return p, q


def test_bar_heights_are_the_overlap_pieces():
    p, q = _pair()
    ax = plot_overlap(p, q)
    bars = _bars(ax)
    assert set(bars) == set(OVERLAP_LABELS.values())
    acc_h, acc_b = bars[OVERLAP_LABELS["accepted"]]
    exc_h, exc_b = bars[OVERLAP_LABELS["excess"]]
    res_h, res_b = bars[OVERLAP_LABELS["residual"]]
    tgt_h, tgt_b = bars[OVERLAP_LABELS["target"]]
    torch.testing.assert_close(acc_h, torch.minimum(p, q))
    torch.testing.assert_close(exc_h, (q - p).clamp_min(0))
    torch.testing.assert_close(res_h, (p - q).clamp_min(0))
    torch.testing.assert_close(tgt_h, p)
    # Stacking: green from 0, red and blue on top of green; green + red = q, green + blue = p.
    torch.testing.assert_close(acc_b, torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(exc_b, acc_h)
    torch.testing.assert_close(res_b, acc_h)
    torch.testing.assert_close(acc_h + exc_h, q)
    torch.testing.assert_close(acc_h + res_h, p)
    # The green area is the acceptance rate; the blue area, normalised, is ms.residual.
    assert abs(float(acc_h.sum()) - float(ms.theory.acceptance_rate(p, q))) < 1e-12
    torch.testing.assert_close(res_h / res_h.sum(), ms.residual(p, q))
    assert f"{float(ms.theory.acceptance_rate(p, q)):.3f}" in ax.get_title()


def test_top_keeps_the_most_likely_tokens_with_their_labels():
    p, q = _pair()
    names = ["a", "b", "c", "d", "e", "f"]
    fig, ax = plt.subplots()
    assert plot_overlap(p, q, ax=ax, labels=names, top=3) is ax
    heights, _ = _bars(ax)[OVERLAP_LABELS["target"]]
    order = torch.argsort(torch.maximum(p, q), descending=True, stable=True)[:3]
    torch.testing.assert_close(heights, p[order])
    assert [t.get_text() for t in ax.get_xticklabels()] == [names[i] for i in order.tolist()]


def test_accepts_lists_and_float32_and_rejects_bad_input():
    ax = plot_overlap([0.5, 0.5], torch.tensor([0.9, 0.1]))
    acc, _ = _bars(ax)[OVERLAP_LABELS["accepted"]]
    torch.testing.assert_close(acc, torch.tensor([0.5, 0.1], dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        plot_overlap([0.5, 0.5], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="labels"):
        plot_overlap([0.5, 0.5], [0.5, 0.5], labels=["a"])
    with pytest.raises(ValueError, match="top"):
        plot_overlap([0.5, 0.5], [0.5, 0.5], top=0)


def test_import_does_not_load_matplotlib():
    code = "import sys, minispec.tools.viz; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_trace_figure_1_kinds():
    from minispec.core.sequence import Round
    from minispec.core.stats import SpecStats
    from minispec.decoding.request import GenerationResult

    result = GenerationResult(
        tokens=[1, 2, 9, 3, 4, 5, 6, 7],
        text=None, finish_reason="length", stats=SpecStats(),
        rounds=[Round([1, 2, 3], 2, [1, 2, 9]),      # d3 rejected, corrected to 9
                Round([3, 4, 5], 3, [3, 4, 5, 6]),   # all accepted + bonus 6
                Round([8, 8], 0, [7])],              # first draft rejected
    )
    t = viz.trace(result)
    assert t.rounds[0] == [("[1]", "accepted"), ("[2]", "accepted"), ("[3]", "rejected"),
                           ("[9]", "correction")]
    assert t.rounds[1][-1] == ("[6]", "bonus")
    assert t.counts() == {"accepted": 5, "rejected": 2, "correction": 2, "bonus": 1}
    page = t._repr_html_()
    assert page.count('class="ms-rejected"') == 2 and "line-through" in page
    assert "\x1b[31;9m[3]" in str(t)
    # A legend names all four kinds, in both forms; the correction (drawn from the residual) and
    # the bonus (the target's extra token) are told apart by colour.
    colours = {kind: html_colour for kind, (html_colour, _) in viz.TRACE_STYLES.items()}
    assert len(set(colours.values())) == 4
    assert colours["correction"] != colours["bonus"]
    assert viz.TRACE_STYLES["correction"][1] != viz.TRACE_STYLES["bonus"][1]
    assert 'class="ms-trace-legend"' in page
    legend = page[page.index('class="ms-trace-legend"'):]
    for kind, label in viz.TRACE_LABELS.items():
        assert f'class="ms-legend-{kind}" style="color:{colours[kind]}' in legend
        assert f"{viz.TRACE_STYLES[kind][1]}{label}" in str(t).splitlines()[-1]


def test_record_rounds_with_a_context_drafter_obeys_the_one_hot_rule():
    """Prompt lookup's q is one-hot: a copied token is kept iff u < p(x); a round without a match
    drafts nothing and ends with a token from p (a plain step)."""
    from tinymodels import tiny_llama

    model = tiny_llama(max_pos=200)
    prompt = [1, 2, 3, 4, 5, 6] * 3 + [1, 2]
    data = viz.record_rounds(model, ms.PromptLookupDrafter(), prompt, 12, 4,
                             ms.SamplingParams(temperature=1.0, seed=3))
    assert data["settings"]["drafter"] == "context"
    assert any(r["drafts"] for r in data["rounds"])
    for r in data["rounds"]:
        a, drafts = r["num_accepted"], r["drafts"]
        assert all(d["q"] == 1.0 and d["beta"] == pytest.approx(d["p"], abs=1e-6)
                   for d in drafts)
        for d in drafts[: a + 1]:
            assert (d["u"] < d["p"]) == (d["verdict"] == "accepted")
        assert r["final"]["kind"] == ("bonus" if a == len(drafts) else "correction")
        assert r["context_after"] == r["context_before"] + a + 1


def test_the_chart_of_a_rejected_draft_shows_the_token_drawn_in_its_place():
    """The drawn correction is among the bars of the rejected position, even where it is not one
    of its most likely tokens (the widget's chart highlights it), and the bars stay in order."""
    from tinymodels import noisy_copy, tiny_llama

    target = tiny_llama(max_pos=200)
    data = viz.record_rounds(target, noisy_copy(target, 0.6), [1, 2, 3], 12, 4,
                             ms.SamplingParams(temperature=1.0, seed=5), top=2)
    corrections = [r for r in data["rounds"] if r["final"]["kind"] == "correction"]
    assert corrections
    for r in corrections:
        rejected = r["drafts"][r["num_accepted"]]
        shown = [b["token"] for b in rejected["bars"]]
        assert r["final"]["token"] in shown and rejected["token"] in shown and len(shown) == 2
        heights = [max(b["p"], b["q"]) for b in rejected["bars"]]
        assert heights == sorted(heights, reverse=True)


def test_record_race_times_both_runs_and_keeps_the_tokens():
    from tinymodels import tiny_llama

    model = tiny_llama(max_pos=200)
    prompt = [1, 2, 3, 4, 5, 6] * 3 + [1, 2]
    ticks = iter(range(10_000))
    race = viz.record_race(model, "prompt_lookup", prompt, 20, 4, clock=lambda: next(ticks))
    plain, spec = race["runs"]["plain"], race["runs"]["speculative"]
    assert race["identical"] and plain["tokens"] == ms.generate(model, prompt, 20).tokens
    assert len(plain["times"]) == len(spec["times"]) == 20 == len(spec["texts"])
    assert plain["times"] == sorted(plain["times"]) and spec["times"] == sorted(spec["times"])
    assert spec["target_forwards"] <= plain["target_forwards"]


def _contrast(a: str, b: str = "#ffffff") -> float:
    """WCAG 2 contrast ratio of two #rrggbb colours."""
    def lum(h: str) -> float:
        c = [int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        c = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_trace_and_overlap_colours_meet_wcag_aa():
    """Every colour a trace prints text in reads at 4.5:1 or more on white and on a code cell's
    grey (#f5f5f5), and each kind has a cue besides colour (struck, bold, underlined) except the
    accepted drafts, the plain text of the run."""
    colours = [c for c, _ in viz.TRACE_STYLES.values()] + [viz.TRACE_SEPARATOR]
    colours += [c for c in viz.OVERLAP_COLORS.values() if c.startswith("#")]
    for colour in colours:
        for background in ("#ffffff", "#f5f5f5"):
            assert _contrast(colour, background) >= 4.5, (colour, background)
    cues = {kind: viz.TRACE_CUES[kind] for kind in ("rejected", "correction", "bonus")}
    assert len(set(cues.values())) == 3 and all(cues.values()), cues
