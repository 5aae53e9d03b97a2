"""Chapter 3's seed claims recomputed from the price tables (`workbench.lab.kit.seed_claims`; the list is
datasets/seed_claims/ch03.csv)."""

from __future__ import annotations

import pandas as pd

from workbench.hosted.costs import break_even_requests
from workbench.hosted.pricing import load_pricing, model_price, models
from workbench.lab.kit import seed_claims as kit

SONNET = "claude-sonnet-4-6"


def _ttl() -> str:
    rules = load_pricing()["anthropic"]
    return (f"TTL {rules['ttl_seconds']['5m']} s, refreshed on every read: {rules['ttl_refreshed_on_read']} "
            f"(a 1-hour TTL at {rules['multipliers']['write_1h']}x the input price is the other choice)")


def _read_share() -> str:
    p = model_price("anthropic", SONNET)
    return f"{SONNET}: a read costs {p.cached_input / p.input:.0%} of the input price (holds)"


def _openai_share() -> str:
    shares = sorted({round(model_price("openai", m).cached_input / model_price("openai", m).input, 3)
                     for m in models("openai")})
    return (f"cached input over input across the price table's OpenAI models: {', '.join(f'{s:.0%}' for s in shares)}"
            ": 50% for the gpt-4o generation only, model-specific since")


def _openai_min() -> str:
    mins = sorted({model_price("openai", m).min_cacheable_tokens for m in models("openai")})
    return f"OpenAI's minimum cacheable prompt in the price table: {', '.join(f'{m:,}' for m in mins)} tokens (holds)"


def _gemini_ttl() -> str:
    g = load_pricing()["gemini"]
    return (f"explicit caches default to a {g['explicit_default_ttl_seconds'] // 3600}-hour TTL; implicit caching "
            "has been on by default since 2025-05 with no minimum lifetime set by the user: 'minimum 1 hour, maximum "
            "1 month' describes only the explicit caches, and is not confirmed here")


def _prices() -> str:
    p = model_price("anthropic", SONNET)
    return f"{SONNET}: input ${p.input:.2f}, write ${p.write_5m:.2f}, read ${p.cached_input:.2f} per M tokens (holds)"


def _break_even() -> str:
    exact, whole = break_even_requests("anthropic", SONNET, "5m")
    return f"N* = (1.25 - 0.1) / (1 - 0.1) = {exact:.2f}, so the 2nd request already pays ('≈ 1.5' is loose)"


def _after(n: int) -> str:
    p = model_price("anthropic", SONNET)
    cached = p.write_5m + (n - 1) * p.cached_input
    return f"{n} requests: {cached / (n * p.input):.1%} of the uncached price"


def _daily() -> str:
    p = model_price("anthropic", SONNET)
    plain = 10_000 * 4000 * p.input / 1e6
    first = 4000 * p.write_5m / 1e6
    cached = first + 9_999 * 4000 * p.cached_input / 1e6
    return (f"${plain:.2f}/day uncached, ${first:.3f} first write + ${cached - first:.2f}"
            f" = ${cached:.2f}/day cached, ${(plain - cached) * 30:,.0f} a 30-day month saved (holds, if every "
            "request after the first finds the entry alive)")


def _ceiling() -> str:
    return (f"2,000 static of 2,250 tokens: a warm request reads at most {2000 / 2250:.0%}, not 100% (the dynamic "
            "200 and the 50-token query are never cached)")


def _date_never() -> str:
    p = model_price("anthropic", SONNET)
    write = 4000 * (p.write_5m - p.cached_input) / 1e6
    return ("a timestamp that changes with every request never caches (section 4: the dynamic-first layout read "
            "nothing past the template's first block); a date changes once a day, so a date-first prompt caches "
            f"from the day's second request on, at one extra write a day (${write:.4f} for a 4,000-token "
            f"{SONNET} prompt): 'never' holds for a timestamp, not for a date")


def _cost_feature() -> str:
    return ("measured in 4.3 for the engine: a hit skips the cached prefill, so its TTFT is a fraction of the miss's "
            "(the table there), which makes caching a performance feature too wherever prefill sets the latency; "
            "whether a hosted provider passes that on is not measurable here, the bill is (section 3)")


CHECKS = {"cost_feature": _cost_feature, "date_never": _date_never,
          "ttl": _ttl, "read_share": _read_share, "openai_share": _openai_share,
          "openai_min": _openai_min,
          "gemini_ttl": _gemini_ttl, "prices": _prices, "break_even": _break_even, "after_2": lambda: _after(2),
          "after_100": lambda: _after(100), "daily": _daily, "ceiling": _ceiling}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 3, with what this chapter finds for it."""
    return kit.table("ch03", CHECKS)
