"""The grammar wing on llguidance, with the shipped pair: valid output, the masked law, rollback,
forced tokens, engine isolation and one clear ``ValueError`` for every bad input.

Every output here parses and meets its schema or regex; greedy output under a grammar is the
target's constrained greedy output token for token, whatever drafts it.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from lawcheck import chi_square_pvalue
from tinymodels import tiny_llama

import minispec as ms
from minispec.grammar import ForcedDrafter, GrammarConstraint, constraint_for

pytest.importorskip("llguidance")
pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "mood"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["merry", "sad", "wroth"]}}}
REGEX = r"(thou|the|my|good) [a-z]{2,6}( [a-z]{2,6})?"
PROMPT = "ROMEO. But soft, what light"


@pytest.fixture(scope="module")
def pair():
    target, tokenizer = ms.load("shakespeare-target")
    draft, _ = ms.load("shakespeare-draft")
    return target, draft, tokenizer


def meets_schema(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "mood"} and isinstance(value["name"], str)
            and len(value["name"]) <= 12 and isinstance(value["age"], int)
            and 0 <= value["age"] <= 120 and value["mood"] in ("merry", "sad", "wroth"))


WAYS = {"draft model": lambda d: (d, None), "draft tree (2, 1)": lambda d: (d, (2, 1)),
        "prompt lookup": lambda d: ("prompt_lookup", None),
        "forced": lambda d: (ForcedDrafter(), None)}


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("grammar", ["schema", "regex"])
def test_greedy_output_is_constrained_greedy_and_valid(pair, way, grammar):
    target, draft, tok = pair
    sp = ms.SamplingParams(temperature=0, **({"json_schema": SCHEMA} if grammar == "schema"
                                             else {"regex": REGEX}))
    plain = ms.generate(target, PROMPT, 48, sp, tokenizer=tok)
    drafter, branching = WAYS[way](draft)
    out = ms.speculative_generate(target, drafter, PROMPT, 48, k=4, sampling=sp, tokenizer=tok,
                                  branching=branching)
    assert out.tokens == plain.tokens and out.finish_reason == plain.finish_reason
    assert out.finish_reason in ("grammar", "eos")
    assert meets_schema(out.text) if grammar == "schema" else re.fullmatch(REGEX, out.text)
    assert out.stats.target_forwards < plain.stats.target_forwards     # speculation paid


@pytest.mark.parametrize("branching", [None, (2, 1)])
def test_sampled_output_is_valid_and_rolls_the_grammar_back(pair, branching):
    target, draft, tok = pair
    rejected = 0
    for seed in range(6):
        sp = ms.SamplingParams(temperature=1.0, seed=seed, json_schema=SCHEMA)
        out = ms.speculative_generate(target, draft, PROMPT, 48, k=4, sampling=sp, tokenizer=tok,
                                      branching=branching)
        assert out.finish_reason == "grammar" and meets_schema(out.text)
        rejected += sum(out.stats.drafted_per_round) - out.stats.accepted
    assert rejected > 0          # rejections happened, and the grammar never kept their drafts


def test_first_tokens_have_the_masked_law(pair):
    target, draft, tok = pair
    sp = ms.SamplingParams(temperature=1.0, regex=REGEX)
    ids = tok.encode(PROMPT)
    grammar = constraint_for(sp, tok, target.config.vocab_size, [tok.eos_token_id])
    with torch.inference_mode():
        logits = target(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1]
    law = ms.core.sampling.probs_for_rows(logits[None], [sp], None, [grammar.mask([])])[0]
    counts = torch.zeros_like(law)
    for seed in range(400):
        sampling = ms.SamplingParams(temperature=1.0, seed=seed, regex=REGEX)
        out = ms.speculative_generate(target, draft, ids, 2, k=3, sampling=sampling,
                                      tokenizer=tok)
        counts[out.tokens[0]] += 1
    # p < 1e-4 flags a wrong law at 400 runs; a right one fails 1 run in 10,000
    assert chi_square_pvalue(counts, law) > 1e-4


def test_a_mask_rolls_back_and_a_commit_advances(pair):
    target, _, tok = pair
    sp = ms.SamplingParams(json_schema=SCHEMA)
    grammar = constraint_for(sp, tok, target.config.vocab_size, [tok.eos_token_id])
    first, forced = grammar.mask([]).clone(), grammar.forced(8)
    path = tok.encode('{"name": "Jul', add_special_tokens=False)
    assert not torch.equal(grammar.mask(path), first)
    fresh = constraint_for(sp, tok, target.config.vocab_size, [tok.eos_token_id])
    assert torch.equal(fresh.mask([]), first) and grammar.forced(8) == forced
    with pytest.raises(ValueError, match="forbids"):
        grammar.mask(tok.encode("[", add_special_tokens=False))
    assert torch.equal(grammar.mask([]), first)          # the error rolled back as well
    grammar.commit(path)
    assert torch.equal(grammar.mask([]), fresh.mask(path))
    done = tok.encode('{"name": "Juliet", "age": 13, "mood": "sad"}', add_special_tokens=False)
    fresh.commit(done)
    assert fresh.finished and fresh.mask([]).nonzero().flatten().tolist() == [tok.eos_token_id]


def test_forced_tokens_are_drafted_and_accepted(pair):
    target, _, tok = pair
    sp = ms.SamplingParams(temperature=0, json_schema=SCHEMA)
    out = ms.speculative_generate(target, ForcedDrafter(), PROMPT, 48, k=8, sampling=sp,
                                  tokenizer=tok)
    drafted = sum(out.stats.drafted_per_round)
    assert drafted >= 6                     # '{"name": "', '", "age": ', ... are forced
    assert out.stats.accepted == drafted    # the target's constrained argmax never differed


def nan_row(target, token):
    """``target`` untied, with embedding row ``token`` NaN: a request that reads it fails."""
    from test_isolation import with_nan_row

    return with_nan_row(target, token)


def test_engine_requests_with_and_without_grammars_and_a_failing_one(pair):
    target, draft, tok = pair
    specs = [ms.SamplingParams(temperature=0, json_schema=SCHEMA), None,
             ms.SamplingParams(temperature=1.0, seed=4, regex=REGEX), None]
    prompts = [PROMPT, "JULIET. O Romeo", "HAMLET. To be"]
    alone = [ms.speculative_generate(target, draft, prompts[i], 32, k=3, sampling=specs[i],
                                     tokenizer=tok) for i in range(3)]
    seen = {t for p, r in zip(prompts, alone, strict=True) for t in tok.encode(p) + r.tokens}
    unused = max(set(range(tok.vocab_size)) - seen)       # its NaN row reaches no healthy request
    target, prompts = nan_row(target, unused), prompts + [tok.encode("KING.") + [unused]]
    engine = ms.Engine(target, draft=draft, k=3, max_batch_size=4, tokenizer=tok)
    with pytest.raises(ValueError, match="json_schema"):
        engine.add_request(PROMPT, ms.SamplingParams(json_schema="{not json"))
    results = engine.generate(prompts, sampling=specs, max_new_tokens=32, progress=False)
    assert [r.tokens for r in results[:3]] == [r.tokens for r in alone]
    assert results[3].finish_reason == "error" and "NaN" in results[3].error
    assert meets_schema(results[0].text) and re.fullmatch(REGEX, results[2].text)


BAD = [({"json_schema": "{not json"}, "json_schema: cannot parse"),
       ({"json_schema": {"type": "object", "not": {}}}, "json_schema: Unimplemented keys"),
       ({"json_schema": {"type": "string", "format": "colour"}}, "json_schema: Unknown format"),
       ({"regex": "("}, "(?s)regex: .*unclosed group"),
       ({"regex": "[a&&b]"}, "regex: no text meets")]


@pytest.mark.parametrize("kwargs, message", BAD)
def test_a_bad_grammar_is_refused_before_any_work(pair, kwargs, message):
    target, draft, tok = pair
    forwards = target.forward
    target.forward = lambda *a, **k: pytest.fail("a forward ran")         # before any work
    try:
        with pytest.raises(ValueError, match=message):
            ms.speculative_generate(target, draft, PROMPT, 8, sampling=ms.SamplingParams(
                **kwargs), tokenizer=tok)
    finally:
        target.forward = forwards


def test_a_tokenizer_or_a_draft_that_cannot_serve_a_grammar_is_refused(pair):
    target, _, tok = pair
    sp = ms.SamplingParams(regex=REGEX)
    with pytest.raises(ValueError, match="tokenizer: a grammar"):
        ms.generate(target, tok.encode(PROMPT), 8, sp)
    with pytest.raises(TypeError, match="tokenizer must have a decode"):   # refused first
        ms.generate(target, tok.encode(PROMPT), 8, sp, tokenizer=object())

    class DecodeOnly:
        def decode(self, ids, **kwargs):
            return ""

    with pytest.raises(ValueError, match="tokenizer: llguidance cannot read"):
        ms.generate(target, tok.encode(PROMPT), 8, sp, tokenizer=DecodeOnly())
    other = tiny_llama(vocab=48)                                  # another vocabulary
    with pytest.raises(ValueError, match="vocab_size"):
        ms.speculative_generate(target, other, PROMPT, 8, sampling=sp, tokenizer=tok)


def test_the_constraint_is_the_wings_own(pair):
    target, _, tok = pair
    made = constraint_for(ms.SamplingParams(regex="a+"), tok, target.config.vocab_size, [1])
    assert isinstance(made, GrammarConstraint) and isinstance(made, ms.core.constraint.Constraint)
    assert constraint_for(ms.SamplingParams(), tok, target.config.vocab_size, [1]) is None


def test_the_command_line_takes_a_schema_file_or_a_regex(tmp_path, capsys):
    from minispec.tools.cli import main

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert main(["generate", PROMPT, "--draft", "shakespeare-draft", "--json-schema",
                 str(schema), "--max-new-tokens", "48"]) == 0
    text = capsys.readouterr().out
    assert meets_schema(text[len(PROMPT):].split("\n\n[")[0]) and "[grammar]" in text
    assert main(["generate", PROMPT, "--prompt-lookup", "--regex", "("]) == 2
    assert "regex:" in capsys.readouterr().err
