"""The cost calculator: what a workload costs per day and month with and without prompt caching, the exact
break-even number of requests for a cache entry, and what one miss costs.

One formula covers every provider. A prefix of P tokens reused N times within its TTL costs
``P (write + (N - 1) read + storage)`` with caching and ``N P input`` without, so caching pays from
``N* = (write - read + storage) / (input - read)`` requests on. Anthropic: write = 1.25x or 2x input, read =
0.1x; OpenAI and Gemini implicit: write = input (no premium), so N* = 1; Gemini explicit: the cache is created
at the input price, every use reads it, and storage is billed per hour.

Whether a request finds the entry alive depends on the gaps between requests: evenly spaced requests always
hit while the gap is under the TTL (a read refreshes it) and never otherwise; Poisson arrivals hit with
probability ``1 - exp(-rate * TTL)``.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.hosted.pricing import PER_TOKEN, load_pricing, model_price

SECONDS_PER_DAY = 86_400
DAYS_PER_MONTH = 30
ARRIVALS = ("poisson", "even")


def ttl_seconds(provider: str, ttl: str) -> float:
    """The TTL named ``ttl`` for ``provider`` ("5m"/"1h" Anthropic; "in_memory"/"24h" OpenAI; "1h" Gemini)."""
    rules = load_pricing()[provider]
    table = rules.get("ttl_seconds") or rules.get("retention_seconds") or {"1h": rules["explicit_default_ttl_seconds"]}
    if ttl not in table:
        raise ValueError(f"ttl for {provider} must be one of {sorted(table)}, got {ttl!r}")
    return float(table[ttl])


def unit_prices(provider: str, model: str, ttl: str) -> dict[str, float]:
    """USD per token: input, write, read, storage (per token per TTL) for a prefix cached with ``ttl``."""
    price = model_price(provider, model)
    write = price.write_1h if (provider == "anthropic" and ttl == "1h") else price.write_5m
    storage = 0.0
    if provider == "gemini":  # explicit cache: created at the input price, then every use (the first too) reads
        write = price.input + price.cached_input
        storage = price.storage_per_mtok_hour * ttl_seconds(provider, ttl) / 3600
    return {"input": price.input * PER_TOKEN, "write": write * PER_TOKEN, "read": price.cached_input * PER_TOKEN,
            "storage": storage * PER_TOKEN, "output": price.output * PER_TOKEN}


def break_even_requests(provider: str, model: str, ttl: str) -> tuple[float, int]:
    """(exact N*, the first whole number of requests at which caching costs no more than not caching)."""
    p = unit_prices(provider, model, ttl)
    exact = (p["write"] - p["read"] + p["storage"]) / (p["input"] - p["read"])
    return exact, max(1, math.ceil(exact - 1e-12))


def hit_probability(requests_per_day: float, ttl_s: float, arrivals: str = "poisson") -> float:
    """The chance a request finds the prefix still cached (steady state; the day's first write is ignored)."""
    if requests_per_day <= 0:
        raise ValueError(f"requests_per_day must be > 0, got {requests_per_day}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    rate = requests_per_day / SECONDS_PER_DAY
    if arrivals == "even":
        return 1.0 if 1 / rate < ttl_s else 0.0
    return 1.0 - math.exp(-rate * ttl_s)


def daily_costs(provider: str, model: str, *, prefix_tokens: int, requests_per_day: float, ttl: str,
                dynamic_tokens: int = 0, output_tokens: int = 0, arrivals: str = "poisson") -> dict[str, float]:
    """Daily and monthly USD with and without caching, the hit rate and the saving, for one prompt layout:
    ``prefix_tokens`` identical on every request, then ``dynamic_tokens`` that differ."""
    if prefix_tokens < 0 or dynamic_tokens < 0 or output_tokens < 0:
        raise ValueError("token counts must be >= 0, got "
                         f"prefix={prefix_tokens}, dynamic={dynamic_tokens}, output={output_tokens}")
    p = unit_prices(provider, model, ttl)
    tail = dynamic_tokens * p["input"] + output_tokens * p["output"]
    plain = requests_per_day * (prefix_tokens * p["input"] + tail)
    cacheable = prefix_tokens >= model_price(provider, model).min_cacheable_tokens
    hit = hit_probability(requests_per_day, ttl_seconds(provider, ttl), arrivals) if cacheable else 0.0
    if not cacheable:
        cached = plain
    elif provider == "gemini":  # one explicit cache kept all day: storage around the clock, one creation
        cached = requests_per_day * (prefix_tokens * p["read"] + tail) + prefix_tokens * (
            p["input"] + p["storage"] * SECONDS_PER_DAY / ttl_seconds(provider, ttl))
        hit = 1.0
    else:
        per_prefix = hit * p["read"] + (1 - hit) * p["write"]
        cached = requests_per_day * (prefix_tokens * per_prefix + tail)
    return {"uncached_per_day": plain, "cached_per_day": cached, "hit_rate": hit, "cacheable": float(cacheable),
            "saving_per_day": plain - cached, "uncached_per_month": plain * DAYS_PER_MONTH,
            "cached_per_month": cached * DAYS_PER_MONTH, "saving_per_month": (plain - cached) * DAYS_PER_MONTH}


def miss_penalty_usd(provider: str, model: str, prefix_tokens: int, ttl: str) -> float:
    """What one miss costs over a hit: the prefix billed at the write price instead of the read price."""
    p = unit_prices(provider, model, ttl)
    return prefix_tokens * (p["write"] - p["read"])


def provider_table(*, prefix_tokens: int, requests_per_day: float, dynamic_tokens: int = 0,
                   output_tokens: int = 0, arrivals: str = "poisson") -> pd.DataFrame:
    """One row per provider model and TTL: daily/monthly cost with and without caching, break-even, miss cost."""
    rows = []
    choices = {"anthropic": ("5m", "1h"), "openai": ("in_memory", "24h"), "gemini": ("1h",)}
    for provider, ttls in choices.items():
        for model in load_pricing()[provider]["models"]:
            for ttl in ttls:
                costs = daily_costs(provider, model, prefix_tokens=prefix_tokens, requests_per_day=requests_per_day,
                                    ttl=ttl, dynamic_tokens=dynamic_tokens, output_tokens=output_tokens,
                                    arrivals=arrivals)
                exact, whole = break_even_requests(provider, model, ttl)
                rows.append({"provider": provider, "model": model, "ttl": ttl, **costs, "break_even_exact": exact,
                             "break_even_requests": whole,
                             "miss_cost_usd": miss_penalty_usd(provider, model, prefix_tokens, ttl)})
    return pd.DataFrame(rows)


def seed_worked_example() -> dict[str, float]:
    """The course's example recomputed: one write then reads all day, as the seed assumes."""
    example = load_pricing()["seed_example"]
    p = unit_prices("anthropic", example["model"], "5m")
    tokens, n = example["prefix_tokens"], example["requests_per_day"]
    uncached = n * tokens * p["input"]
    cached = tokens * p["write"] + (n - 1) * tokens * p["read"]
    exact, whole = break_even_requests("anthropic", example["model"], "5m")
    return {"uncached_per_day": uncached, "first_write": tokens * p["write"], "cached_per_day": cached,
            "saving_per_month": (uncached - cached) * DAYS_PER_MONTH, "break_even_exact": exact,
            "break_even_requests": whole, "prefix_tokens": tokens, "requests_per_day": n}
