"""mkdocs hook: the data behind the site's two interactive figures, made at build time.

* ``assets/data/rounds.json`` -- real speculative rounds of the shipped pair
  (``shakespeare-target`` judged against ``shakespeare-draft``), recorded by
  [`minispec.tools.viz.record_rounds`][minispec.tools.viz.record_rounds] when the site is built: the
  drafts with their ``q(x)`` and ``p(x)``, the uniform ``u`` each test drew, the verdicts, the
  ``min(p, q)`` bars of every tested position, the residual and the correction or bonus token.
  ``docs/javascripts/round.js`` steps through them.
* ``assets/data/rounds-smollm2.json`` -- the same for a model a reader knows:
  SmolLM2-135M-Instruct summarising a passage, drafted by prompt lookup (its ``q`` is one-hot:
  a copied token is kept with probability ``p(x)``); ``<div class="ms-round"
  data-source="smollm2">`` shows it.
* ``assets/data/race.json`` -- plain and speculative (prompt lookup, ``k = 4``) greedy decoding
  of the same prompt by SmolLM2, each token with the process CPU time at which it came out (one
  thread), recorded by [`minispec.tools.viz.record_race`][minispec.tools.viz.record_race];
  ``docs/javascripts/race.js`` replays both at their recorded speeds (``<div class="ms-race">``).
* ``assets/data/speedup.json`` -- the measured points and presets the speedup explorer
  (``docs/javascripts/speedup.js``) draws, from the CPU record (read by ``minispec.tools.records``:
  the shipped pair's cost-model run and the shipped head's run), the one the Results page renders.

A page shows a figure with an empty element: ``<div class="ms-round" markdown="0"></div>`` or
``<div class="ms-speedup"></div>`` (Markdown pages, and markdown cells of a notebook alike). The
scripts find the data from the site root that mkdocs-material writes into every page, so the same
element works on every page, with no network.
"""

from __future__ import annotations

import json

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

from minispec.tools import records

ROUNDS = "assets/data/rounds.json"
ROUNDS_SMOLLM2 = "assets/data/rounds-smollm2.json"
RACE = "assets/data/race.json"
SPEEDUP = "assets/data/speedup.json"

#: What the round widget replays: one prompt of the benchmark set, k = 4, plain sampling (T = 1),
#: ten rounds, and the first seed from 0 whose rounds show all three endings a student should see
#: (a draft rejected at once, a partly accepted round, a bonus token).
PROMPT_INDEX, K, NUM_ROUNDS, TEMPERATURE = 0, 4, 10, 1.0

#: SmolLM2's recordings: the summarize task (input-grounded: prompt lookup finds text to copy),
#: 96 new tokens for the race; the rounds start after the answer's first tokens (decoded
#: greedily), so that they copy from the passage, not from the chat template's markers.
SMOLLM2_TASK, RACE_TOKENS, ANSWER_PREFIX = "summarize", 96, 6


def _endings(data: dict) -> bool:
    """The rounds show a draft rejected at once, a partly accepted round and a bonus token."""
    rounds = [r for r in data["rounds"] if r["drafts"]]
    accepted = [r["num_accepted"] for r in rounds]
    return (0 in accepted and any(r["num_accepted"] == len(r["drafts"]) for r in rounds)
            and any(0 < r["num_accepted"] < len(r["drafts"]) for r in rounds))


def _record_rounds() -> dict:
    import torch

    import minispec as ms
    from minispec.tools import bench, viz

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, tok = ms.load("shakespeare-target")
        draft, _ = ms.load("shakespeare-draft")
        prompt = tok.encode(bench.PROMPTS[PROMPT_INDEX])
        for seed in range(50):
            params = ms.SamplingParams(temperature=TEMPERATURE, seed=seed)
            data = viz.record_rounds(target, draft, prompt, NUM_ROUNDS, K, params, tok)
            if _endings(data):
                break
    finally:
        torch.set_num_threads(threads)
    data["models"] = {"target": "shakespeare-target", "draft": "shakespeare-draft"}
    data["recorded_by"] = (
        f"minispec.tools.viz.record_rounds(target, draft, prompt, {NUM_ROUNDS}, k={K}, "
        f"SamplingParams(temperature={TEMPERATURE}, seed={data['settings']['seed']}), tokenizer)"
    )
    return data


def _record_smollm2() -> tuple[dict, dict]:
    """SmolLM2's rounds (prompt lookup, T = 1) and its race (greedy), on one thread."""
    import contextlib
    import io
    import time

    import torch

    import minispec as ms
    from minispec.loading.prompts import encode_prompt
    from minispec.tools import viz, workloads
    from minispec.zoo import smollm2

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stderr(io.StringIO()):    # the first build fetches the model
            smollm2.ensure(progress=False)
        target, tok = ms.load("smollm2-135m-instruct", fast=True)
        prompt = encode_prompt(workloads.TASKS[SMOLLM2_TASK], tok)
        prefix = ms.generate(target, prompt, ANSWER_PREFIX).tokens
        for seed in range(50):
            params = ms.SamplingParams(temperature=TEMPERATURE, seed=seed)
            rounds = viz.record_rounds(target, ms.PromptLookupDrafter(), prompt + prefix,
                                       NUM_ROUNDS, K, params, tok)
            if _endings(rounds):
                break
        race = viz.record_race(target, "prompt_lookup", prompt, RACE_TOKENS, K, tok,
                               clock=time.process_time)
    finally:
        torch.set_num_threads(threads)
    rounds["prompt"] = (workloads.TASKS[SMOLLM2_TASK][0]["content"] + "\n\n"
                        + tok.decode(prefix, skip_special_tokens=True))
    rounds["models"] = {"target": "SmolLM2-135M-Instruct", "draft": "prompt lookup"}
    rounds["recorded_by"] = (
        f"minispec.tools.viz.record_rounds(target, ms.PromptLookupDrafter(), prompt, "
        f"{NUM_ROUNDS}, k={K}, SamplingParams(temperature={TEMPERATURE}, "
        f"seed={rounds['settings']['seed']}), tokenizer)")
    race["prompt"] = workloads.TASKS[SMOLLM2_TASK][0]["content"]
    race["model"] = "SmolLM2-135M-Instruct (packed weights, fast=True)"
    return rounds, race


def _alpha_for(tokens: float, k: int) -> float:
    """The alpha at which Eq. (1) gives ``tokens`` per round of ``k`` drafts (bisection)."""
    from minispec.core.theory import expected_tokens

    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tokens else (lo, mid)
    return round((lo + hi) / 2, 3)


def _speedup_points(record: dict) -> dict:
    """The explorer's measured points and presets, from the runs of the CPU record."""
    pair, tasks = record["runs"]["shipped_pair"], record["runs"]["smollm2_tasks"]
    head = tasks["rows"]["overall"]
    alpha_head = _alpha_for(head["eagle_tokens_per_forward"], 2)
    return {
        "label": "shipped pair, 2-core VM, greedy",
        "alpha": pair["alpha_greedy"], "c": pair["c"],
        "points": [{"k": int(k), "r": row["r"], "measured": row["measured"]}
                   for k, row in pair["rows"].items()],
        "presets": [
            {"name": "shipped pair, 2-core CPU", "alpha": pair["alpha_greedy"], "k": 4,
             "c": pair["c"], "r": pair["rows"]["4"]["r"],
             "note": "Greedy agreement alpha, c and r(4) of the recorded minispec bench run "
                     "(Results page)."},
            {"name": "EAGLE head, SmolLM2, CPU", "alpha": alpha_head, "k": 2,
             "c": tasks["head_c"], "r": tasks["r4_fast"],
             "note": f"The shipped head at k = 2: alpha from its recorded "
                     f"{head['eagle_tokens_per_forward']} tokens per forward over five tasks, "
                     f"c about {tasks['head_c']}, r(4) of the fast path (Results page)."},
        ],
    }


@event_priority(50)
def on_files(files: Files, config) -> Files:
    rounds = json.dumps(_record_rounds(), ensure_ascii=False, separators=(",", ":"))
    files.append(File.generated(config, ROUNDS, content=rounds))
    smol_rounds, race = _record_smollm2()
    for path, data in ((ROUNDS_SMOLLM2, smol_rounds), (RACE, race)):
        files.append(File.generated(config, path, content=json.dumps(
            data, ensure_ascii=False, separators=(",", ":"))))
    points = _speedup_points(records.load("cpu"))
    files.append(File.generated(config, SPEEDUP, content=json.dumps(points, separators=(",", ":"))))
    return files
