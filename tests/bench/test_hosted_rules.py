"""Each provider model against its documented rules, on the simulated clock: breakpoint limits and order,
minimum length, the lookback, TTL refresh and expiry, readability only after the writer started, usage
fields summing to the prompt, and OpenAI's 1,024 + 128k increments and prompt_cache_key."""

from __future__ import annotations

import pytest

from workbench.hosted import AnthropicCache, Block, OpenAICache, SimClock
from workbench.hosted.pricing import load_pricing, model_price

MODEL = "claude-sonnet-4-5"  # minimum 1,024 tokens


def blocks(*sizes_and_marks, start: int = 0) -> list[Block]:
    """Blocks of distinct tokens: (size, ttl-or-None) pairs."""
    out, token = [], start
    for size, mark in sizes_and_marks:
        out.append(Block(tuple(range(token, token + size)), mark))
        token += size
    return out


def test_five_breakpoints_are_an_error_four_are_not():
    cache = AnthropicCache(MODEL, clock=SimClock())
    with pytest.raises(ValueError, match="maximum of 4 blocks with cache_control.*Found 5"):
        cache.request(blocks(*[(300, "5m")] * 5))
    assert cache.request(blocks(*[(300, "5m")] * 4)).prompt_tokens == 1200


def test_one_hour_breakpoints_must_come_first():
    cache = AnthropicCache(MODEL, clock=SimClock())
    with pytest.raises(ValueError, match="1h"):
        cache.request(blocks((1100, "5m"), (100, "1h")))
    usage = cache.request(blocks((1100, "1h"), (100, "5m")))
    assert (usage.creation_1h, usage.creation_5m) == (1100, 100)


def test_below_minimum_nothing_is_cached_and_no_error():
    cache = AnthropicCache(MODEL, clock=SimClock())
    prompt = blocks((1000, "5m"), (50, None))
    for _ in range(2):
        usage = cache.request(prompt)
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens, usage.input_tokens) == (0, 0, 1050)
    assert model_price("anthropic", MODEL).min_cacheable_tokens == 1024


def test_write_then_read_and_usage_sums_to_prompt():
    cache = AnthropicCache(MODEL, clock=SimClock())
    prompt = blocks((2000, "5m"), (60, None))
    first, second = cache.request(prompt), cache.request(prompt)
    assert first.to_dict()["cache_creation_input_tokens"] == 2000 and first.input_tokens == 60
    assert second.cache_read_input_tokens == 2000 and second.cache_creation_input_tokens == 0
    assert first.prompt_tokens == second.prompt_tokens == 2060


def test_ttl_refreshes_on_read_and_expires_when_idle():
    clock = SimClock()
    cache = AnthropicCache(MODEL, clock=clock)
    prompt = blocks((1500, "5m"))
    cache.request(prompt)
    for _ in range(3):  # 4 minutes apart: each read pushes the expiry another 5 minutes out
        clock.advance(240)
        assert cache.request(prompt).cache_read_input_tokens == 1500
    clock.advance(300)  # exactly the TTL idle: gone
    assert cache.request(prompt).cache_creation_input_tokens == 1500


def test_one_hour_ttl_outlives_five_minutes():
    clock = SimClock()
    cache = AnthropicCache(MODEL, clock=clock)
    cache.request(blocks((1500, "1h")))
    clock.advance(1800)
    assert cache.request(blocks((1500, "1h"))).cache_read_input_tokens == 1500
    short = blocks((1500, "5m"), start=10_000)
    cache.request(short)
    clock.advance(1800)
    assert cache.request(short).cache_read_input_tokens == 0


def test_simultaneous_requests_all_miss_until_the_writer_started():
    clock = SimClock()
    cache = AnthropicCache(MODEL, clock=clock)
    prompt = blocks((1500, "5m"))
    writers = [cache.begin(prompt) for _ in range(3)]
    assert [u.cache_creation_input_tokens for u in writers] == [1500] * 3
    cache.mark_started(writers[0], clock() + 0.5)
    assert cache.begin(prompt).cache_read_input_tokens == 0  # its response has not started yet
    clock.advance(0.5)
    assert cache.begin(prompt).cache_read_input_tokens == 1500


def test_moving_breakpoint_caches_the_growing_history_incrementally():
    cache = AnthropicCache(MODEL, clock=SimClock())
    system = (1200, None)
    turn1 = blocks(system, (100, None), (100, "5m"))
    first = cache.request(turn1)
    assert first.cache_creation_input_tokens == 1400
    turn2 = blocks(system, (100, None), (100, None), (100, None), (100, "5m"))
    second = cache.request(turn2)
    assert (second.cache_read_input_tokens, second.cache_creation_input_tokens) == (1400, 200)


def test_lookback_finds_entries_at_most_twenty_blocks_back():
    lookback = load_pricing()["anthropic"]["lookback_blocks"]
    cache = AnthropicCache(MODEL, clock=SimClock())
    base = [(1100, "5m")]
    cache.request(blocks(*base))
    near = blocks((1100, None), *[(5, None)] * (lookback - 2), (5, "5m"))
    assert cache.request(near).cache_read_input_tokens == 1100
    cache2 = AnthropicCache(MODEL, clock=SimClock())
    cache2.request(blocks(*base))
    far = blocks((1100, None), *[(5, None)] * lookback, (5, "5m"))
    assert cache2.request(far).cache_read_input_tokens == 0


def test_openai_caches_from_1024_in_128_token_steps():
    cache = OpenAICache(clock=SimClock())
    assert cache.request(list(range(1023))).cached_tokens == 0
    assert cache.request(list(range(1023))).cached_tokens == 0
    prompt = list(range(1500))
    assert cache.request(prompt).cached_tokens == 0
    assert cache.request(prompt).cached_tokens == 1024 + 3 * 128  # 1408 <= 1500 < 1536
    changed = prompt[:1300] + [99_999] * 200
    assert cache.request(changed).cached_tokens == 1280


def test_openai_prompt_cache_key_and_retention():
    clock = SimClock()
    cache = OpenAICache(clock=clock)
    prompt = list(range(1200))
    cache.request(prompt, prompt_cache_key="a")
    assert cache.request(prompt, prompt_cache_key="b").cached_tokens == 0
    assert cache.request(prompt, prompt_cache_key="a").cached_tokens == 1152
    clock.advance(load_pricing()["openai"]["retention_seconds"]["in_memory"])
    assert cache.request(prompt, prompt_cache_key="a").cached_tokens == 0
    long_lived = OpenAICache(retention="24h", clock=clock)
    long_lived.request(prompt)
    clock.advance(6 * 3600)
    assert long_lived.request(prompt).cached_tokens == 1152
    with pytest.raises(ValueError, match="retention"):
        OpenAICache(retention="1w")
