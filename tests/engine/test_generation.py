"""Generation loops: no-cache and contiguous-cache paths agree, sampling is controlled, inputs are checked."""

from __future__ import annotations

import time

import pytest
import torch

from workbench.config import SamplingParams
from workbench.generation import generate, stream_token_ids
from workbench.prompts import encode_prompt

PROMPT = "Explain why the sky is blue."


def test_no_cache_and_cached_greedy_tokens_are_identical(real_model, tokenizer):
    # Two prompts (a third, of the same length and template, added ~15 s on 2 cores and nothing else).
    for prompt in (PROMPT, "Write a limerick about a cat."):
        params = SamplingParams(max_tokens=24)
        cached = generate(real_model, tokenizer, prompt, params, use_cache=True)
        uncached = generate(real_model, tokenizer, prompt, params, use_cache=False)
        assert cached.token_ids == uncached.token_ids
        assert cached.text == uncached.text


def test_cached_path_is_faster(real_model, tokenizer):
    ids = encode_prompt(tokenizer, "Tell me about the history of computing. " * 25)  # ~250 tokens
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    timings = {}
    for use_cache in (True, False):
        start = time.perf_counter()
        result = generate(real_model, tokenizer, ids, params, use_cache=use_cache)
        timings[use_cache] = time.perf_counter() - start
        assert len(result.token_ids) == 12
    # Without a cache every step re-runs ~250+ tokens; with one, a step runs 1 token (12 steps: ~12x the work
    # against ~2x, so the 1.5x margin stays wide).
    assert timings[True] * 1.5 < timings[False], timings


def test_result_reports_timings(real_model, tokenizer):
    result = generate(real_model, tokenizer, PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(result.token_times_s) == 8
    assert 0 < result.ttft_s <= result.total_s
    assert len(result.itl_s) == 7 and all(x > 0 for x in result.itl_s)
    assert result.decode_tokens_per_s > 0
    assert result.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_seed_dependent(real_model, tokenizer):
    def run(seed):
        params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)
        return generate(real_model, tokenizer, PROMPT, params).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_top_k_one_and_tiny_top_p_are_greedy(real_model, tokenizer):
    greedy = generate(real_model, tokenizer, PROMPT, SamplingParams(max_tokens=12)).token_ids
    top1 = SamplingParams(max_tokens=12, temperature=1.5, top_k=1, seed=0)
    assert generate(real_model, tokenizer, PROMPT, top1).token_ids == greedy
    tiny_p = SamplingParams(max_tokens=12, temperature=1.5, top_p=1e-6, seed=0)
    assert generate(real_model, tokenizer, PROMPT, tiny_p).token_ids == greedy


def test_stop_string_truncates_text(real_model, tokenizer):
    full = generate(real_model, tokenizer, PROMPT, SamplingParams(max_tokens=40))
    words = full.text.split()
    assert len(words) > 5
    stop = words[4]
    cut = generate(real_model, tokenizer, PROMPT, SamplingParams(max_tokens=40, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and full.text.startswith(cut.text)


def test_eos_ends_generation_unless_ignored(real_model, tokenizer):
    result = generate(real_model, tokenizer, "Say only the word yes.", SamplingParams(max_tokens=40))
    assert result.finish_reason == "stop" and result.token_ids[-1] == tokenizer.eos_token_id


def test_streaming_on_text_rebuilds_the_text(real_model, tokenizer):
    pieces: list[str] = []
    result = generate(real_model, tokenizer, "Write the word café three times.", SamplingParams(max_tokens=20),
                      on_text=pieces.append)
    assert "".join(pieces) == result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt_is_rejected(real_model, tokenizer, prompt):
    with pytest.raises(ValueError, match="non-empty"):
        generate(real_model, tokenizer, prompt)


def test_prompt_longer_than_context_is_rejected(real_model):
    too_long = [5] * real_model.spec.max_context
    with pytest.raises(ValueError, match="maximum context length is 8192 tokens"):
        next(stream_token_ids(real_model, too_long, SamplingParams()))


def test_generation_runs_to_the_context_end_only_when_max_tokens_is_left_out(tokenizer):
    """Issue 43, one max_tokens policy everywhere: past the context is refused (it was capped here), None is what
    the context leaves."""
    import workbench

    spec = workbench.model_spec("smollm2-135m").replace(num_layers=1, max_position_embeddings=32)
    model = workbench.random_model(spec, device="cpu")
    with pytest.raises(ValueError, match=r"maximum context length is 32 tokens, you requested 40 tokens"):
        next(stream_token_ids(model, [1] * 30, SamplingParams(max_tokens=10, ignore_eos=True)))
    events = list(stream_token_ids(model, [1] * 30, SamplingParams(max_tokens=None, ignore_eos=True)))
    assert len(events) == 2


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"), ({"top_k": -1}, "top_k"), ({"n": 0}, "n must"),
    ({"temperature": float("nan")}, "temperature"), ({"stop": ("",)}, "stop"),
])
def test_bad_sampling_params_name_the_value_and_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_cache_reserves_what_it_was_sized_for(real_model):
    from workbench.cache.contiguous import ContiguousKVCache
    from workbench.cache.sizing import kv_bytes_per_token

    cache = ContiguousKVCache(real_model.spec, max_batch=2, max_len=100)
    assert cache.reserved_bytes == 2 * 100 * kv_bytes_per_token(real_model.spec, torch.float32)
