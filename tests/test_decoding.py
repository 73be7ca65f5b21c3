"""Single-sequence decoding: greedy parity, the law of sampled output, stops, max_seq_len, bad
inputs."""


import pytest
import torch
from lawcheck import chi_square_pvalue
from tinymodels import VOCAB, exact_two_token_law, noisy_copy, tiny_llama

import minispec as ms
from minispec.decoding.loop import generate, speculative_generate
from minispec.drafters.model import ModelDrafter
from minispec.drafters.ngram import NGramDrafter, PromptLookupDrafter


@pytest.fixture(scope="module")
def pair():
    """A target and a draft that is a noisy copy of it (so that many drafts are accepted)."""
    target = tiny_llama(seed=0)
    draft = noisy_copy(target, 0.01, seed=None)
    small = tiny_llama(hidden=16, layers=1, heads=2, kv_heads=1, seed=1)
    return target, draft, small


PROMPTS = [[1], [3, 4, 5], [7, 8, 9, 7, 8, 9, 7], [10, 11] * 6, list(range(20, 40))]
NEW_TOKENS = 32


def drafters(pair):
    target, draft, small = pair
    return {
        "model": lambda: ModelDrafter(draft),
        "small-model": lambda: ModelDrafter(small),
        "ngram": NGramDrafter,
        "prompt-lookup": PromptLookupDrafter,
    }


@pytest.fixture(scope="module")
def greedy_baselines(pair):
    return [generate(pair[0], prompt, max_new_tokens=NEW_TOKENS).tokens for prompt in PROMPTS]


@pytest.mark.parametrize("name", ["model", "small-model", "ngram", "prompt-lookup"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_greedy_generate(pair, greedy_baselines, name, k):
    target = pair[0]
    for prompt, base in zip(PROMPTS, greedy_baselines, strict=True):
        out = speculative_generate(target, drafters(pair)[name](), prompt,
                                   max_new_tokens=NEW_TOKENS, k=k)
        assert out.tokens == base
        assert out.stats.new_tokens == NEW_TOKENS
        assert out.stats.target_forwards == out.stats.rounds <= NEW_TOKENS


def test_speculation_saves_target_forwards(pair):
    target, draft, _ = pair
    out = speculative_generate(target, draft, [3, 4, 5], max_new_tokens=60, k=4, adaptive=False)
    assert out.stats.acceptance_rate > 0.5          # the draft is a close copy of the target
    assert out.stats.tokens_per_target_forward > 1.5
    # Each round yields accepted + 1 tokens; the counters agree with the tokens emitted.
    assert sum(a + 1 for a in out.stats.accepted_per_round) >= out.stats.new_tokens
    assert out.stats.draft_forwards >= out.stats.rounds


@pytest.mark.parametrize("drafter_name", ["model", "ngram"])
def test_sampled_output_has_the_target_law(pair, drafter_name):
    target, draft, small = pair
    target = tiny_llama(vocab=5, seed=3, scale=0.5)
    draft = tiny_llama(vocab=5, hidden=16, layers=1, heads=2, kv_heads=1, seed=4, scale=0.5)
    params = ms.SamplingParams(temperature=0.9, top_k=4)
    prompt = [1, 2, 3, 1, 2]
    law = exact_two_token_law(target, prompt, params)
    n = 1500
    counts = torch.zeros(25)
    for seed in range(n):
        sp = ms.SamplingParams(temperature=0.9, top_k=4, seed=seed)
        drafter = ModelDrafter(draft) if drafter_name == "model" else NGramDrafter()
        out = speculative_generate(target, drafter, prompt, max_new_tokens=2, k=2, sampling=sp)
        assert out.stats.rounds == 1 or out.stats.accepted_per_round[0] == 0
        counts[out.tokens[0] * 5 + out.tokens[1]] += 1
    # Chi-square at a fixed set of seeds: a false alarm has probability 1e-3.
    keep = law * n >= 5                                   # merge rare cells into one
    merged_counts = torch.cat([counts[keep], counts[~keep].sum()[None]])
    merged_law = torch.cat([law[keep], law[~keep].sum()[None]])
    assert chi_square_pvalue(merged_counts, merged_law) > 1e-3


def test_same_seed_same_output(pair):
    target, draft, _ = pair
    params = ms.SamplingParams(temperature=1.0, seed=7)
    a = speculative_generate(target, draft, [1, 2], 30, k=3, sampling=params)
    b = speculative_generate(target, draft, [1, 2], 30, k=3, sampling=params)
    assert a.tokens == b.tokens


def test_repetition_penalty_parity(pair):
    target, draft, _ = pair
    params = ms.SamplingParams(temperature=0, repetition_penalty=1.3)
    base = generate(target, [5, 5, 5, 5], 40, sampling=params)
    for drafter in [ModelDrafter(draft), NGramDrafter(), PromptLookupDrafter()]:
        assert speculative_generate(target, drafter, [5, 5, 5, 5], 40, k=4,
                                    sampling=params).tokens == base.tokens
    assert base.tokens != generate(target, [5, 5, 5, 5], 40).tokens      # the penalty did something


def test_eos_inside_an_accepted_block(pair):
    target, draft, _ = pair
    prompt = [3, 4, 5]
    free = speculative_generate(target, draft, prompt, 60, k=4, adaptive=False)  # full blocks
    # Find a token that first appears as an accepted draft which is not the last of its round.
    emitted_so_far: list[int] = []
    eos = None
    for rnd in free.rounds:
        for i, token in enumerate(rnd.emitted):
            if i < rnd.num_accepted and i < len(rnd.emitted) - 1 and token not in emitted_so_far:
                eos = token
                break
            emitted_so_far.append(token)
        if eos is not None:
            break
    assert eos is not None, "the fixture should produce accepted blocks"
    stopped = speculative_generate(target, draft, prompt, 60, k=4, eos_token_id=eos,
                                   adaptive=False)
    cut = free.tokens.index(eos) + 1
    assert stopped.tokens == free.tokens[:cut]
    assert stopped.finish_reason == "eos"
    stopped = speculative_generate(target, draft, prompt, 60, k=4, stop_token_ids=[eos],
                                   adaptive=False)
    assert (stopped.tokens, stopped.finish_reason) == (free.tokens[:cut], "stop")


class LetterTokenizer:
    """A toy tokenizer: token t is the letter chr(97 + t % 26)."""

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + t % 26) for t in ids)


def test_stop_string_inside_a_block(pair):
    target, draft, _ = pair
    tok = LetterTokenizer()
    free = speculative_generate(target, draft, [3, 4, 5], 40, k=4, tokenizer=tok)
    stop = free.text[10:12]
    first = free.text.find(stop)
    out = speculative_generate(target, draft, [3, 4, 5], 40, k=4, tokenizer=tok, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == free.text[:first]
    assert out.tokens == free.tokens[: first + len(stop)]


def test_max_seq_len_guard(pair):
    target, draft, _ = pair
    limit = 30
    prompt = list(range(1, 25))
    base = generate(target, prompt, 50, max_seq_len=limit)
    out = speculative_generate(target, draft, prompt, 50, k=8, max_seq_len=limit)
    assert len(prompt) + len(out.tokens) == limit
    assert out.tokens == base.tokens
    assert out.finish_reason == base.finish_reason == "max_seq_len"
    assert max(out.stats.drafted_per_round) <= limit - len(prompt) - 1
    assert out.stats.drafted_per_round[-1] == 0  # the last steps fall back to plain decoding
    # A prompt that fills the context exactly fits, but leaves no room for a new token.
    full = speculative_generate(target, draft, list(range(1, 31)), 5, k=4, max_seq_len=limit)
    assert (full.tokens, full.finish_reason) == ([], "max_seq_len")
    # The model's own max_position_embeddings (96) bounds everything.
    out = speculative_generate(target, draft, [i % VOCAB for i in range(1, 90)], 50, k=4)
    assert len(out.tokens) == 96 - 89


def test_bad_inputs(pair):
    target, draft, _ = pair
    with pytest.raises(ValueError, match="k must be"):
        speculative_generate(target, draft, [1], 5, k=0)
    with pytest.raises(ValueError, match="empty"):
        speculative_generate(target, draft, [], 5)
    with pytest.raises(ValueError, match="max_seq_len"):
        speculative_generate(target, draft, list(range(40)), 5, max_seq_len=30)
    with pytest.raises(ValueError, match="vocab_size"):
        speculative_generate(target, tiny_llama(vocab=VOCAB + 1), [1], 5)
    with pytest.raises(ValueError, match="tokenizer"):
        speculative_generate(target, draft, "hello", 5)
    with pytest.raises(ValueError, match="stop strings"):
        speculative_generate(target, draft, [1], 5, stop=["x"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, [1], -1)


def test_zero_new_tokens(pair):
    out = generate(pair[0], [1, 2], 0)
    assert out.tokens == [] and out.stats.target_forwards == 0
