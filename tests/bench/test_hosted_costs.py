"""Price arithmetic on hand-checked cases: the seed's worked example, break-even per TTL, daily costs and
the hit probability behind them, and what one miss costs."""

from __future__ import annotations

import math

import pytest

from workbench.hosted import AnthropicCache, Block, SimClock
from workbench.hosted.costs import (
    break_even_requests,
    daily_costs,
    hit_probability,
    miss_penalty_usd,
    provider_table,
    seed_worked_example,
)
from workbench.hosted.openai_cache import OpenAIUsage


def test_seed_worked_example_by_hand():
    ex = seed_worked_example()
    assert ex["uncached_per_day"] == pytest.approx(10_000 * 4_000 * 3.00 / 1e6)  # $120
    assert ex["first_write"] == pytest.approx(4_000 * 3.75 / 1e6)  # $0.015
    assert ex["cached_per_day"] == pytest.approx(0.015 + 9_999 * 4_000 * 0.30 / 1e6)  # $12.0138
    assert ex["saving_per_month"] == pytest.approx(30 * (120 - 12.0138))


def test_break_even_per_ttl():
    exact, whole = break_even_requests("anthropic", "claude-sonnet-4-6", "5m")
    assert exact == pytest.approx((1.25 - 0.1) / (1 - 0.1)) and whole == 2
    exact, whole = break_even_requests("anthropic", "claude-sonnet-4-6", "1h")
    assert exact == pytest.approx((2.0 - 0.1) / 0.9) and whole == 3
    assert break_even_requests("openai", "gpt-4o", "in_memory") == (pytest.approx(1.0), 1)
    exact, _ = break_even_requests("gemini", "gemini-2.5-flash", "1h")
    assert exact == pytest.approx((0.30 + 1.0) / (0.30 - 0.03))


def test_hit_probability():
    assert hit_probability(288, 300, "even") == 0.0  # one request every 300 s: always just too late
    assert hit_probability(289, 300, "even") == 1.0
    assert hit_probability(288, 300) == pytest.approx(1 - math.exp(-1))
    with pytest.raises(ValueError, match="arrivals"):
        hit_probability(10, 300, "bursty")
    with pytest.raises(ValueError, match="requests_per_day"):
        hit_probability(0, 300)


def test_daily_costs_hand_checked():
    # 2,000-token prefix, 100 requests a day evenly spaced (864 s apart, over the 5-minute TTL): every request
    # writes, so caching costs MORE than not caching: 100 x 2,000 x $3.75/M vs x $3/M.
    costs = daily_costs("anthropic", "claude-sonnet-4-5", prefix_tokens=2000, requests_per_day=100, ttl="5m",
                        arrivals="even")
    assert costs["uncached_per_day"] == pytest.approx(0.6) and costs["cached_per_day"] == pytest.approx(0.75)
    hourly = daily_costs("anthropic", "claude-sonnet-4-5", prefix_tokens=2000, requests_per_day=100, ttl="1h",
                         arrivals="even")
    assert hourly["cached_per_day"] == pytest.approx(100 * 2000 * 0.30 / 1e6)
    under = daily_costs("anthropic", "claude-haiku-4-5", prefix_tokens=3000, requests_per_day=1e4, ttl="5m")
    assert under["cacheable"] == 0.0 and under["cached_per_day"] == under["uncached_per_day"]
    openai = daily_costs("openai", "gpt-4o", prefix_tokens=2000, requests_per_day=1e5, ttl="in_memory",
                         dynamic_tokens=100, output_tokens=50, arrivals="even")
    assert openai["cached_per_day"] == pytest.approx(1e5 * (2000 * 1.25 + 100 * 2.5 + 50 * 10.0) / 1e6)


def test_miss_penalty_and_table():
    assert miss_penalty_usd("anthropic", "claude-sonnet-4-5", 4000, "5m") == pytest.approx(4000 * 3.45 / 1e6)
    table = provider_table(prefix_tokens=4000, requests_per_day=10_000)
    assert {"anthropic", "openai", "gemini"} == set(table.provider)
    assert (table.cached_per_day <= table.uncached_per_day + 1e-12).all()


def test_usage_cost_matches_prices():
    clock = SimClock()
    cache = AnthropicCache("claude-sonnet-4-5", clock=clock)
    prompt = [Block(tuple(range(2000)), "5m"), Block(tuple(range(5000, 5100)))]
    write, read = cache.request(prompt), cache.request(prompt)
    assert write.cost_usd("claude-sonnet-4-5", 10) == pytest.approx((2000 * 3.75 + 100 * 3 + 10 * 15) / 1e6)
    assert read.cost_usd("claude-sonnet-4-5") == pytest.approx((2000 * 0.30 + 100 * 3) / 1e6)
    assert OpenAIUsage(1500, 1408).cost_usd("gpt-4o") == pytest.approx((92 * 2.5 + 1408 * 1.25) / 1e6)
