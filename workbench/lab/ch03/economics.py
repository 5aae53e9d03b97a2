"""Chapter 3's price-table side, without widgets and without the engine: daily cost with and without caching
against requests per day (and the daily rate where the two meet), the book's worked example recomputed, and
requests on a simulated clock against the TTL. Everything here is computed from `datasets/hosted/pricing.json`
through `workbench.hosted`; nothing is timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from workbench.hosted import AnthropicCache, Block, SimClock
from workbench.hosted.costs import break_even_requests, daily_costs, provider_table, seed_worked_example, unit_prices
from workbench.hosted.pricing import model_price
from workbench.lab.ch03.bench import DEFAULT_MODEL

RATES = [10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000]
TTL_CHOICES = {"anthropic": {"default": "5m", "extended": "1h"}, "openai": {"default": "in_memory", "extended": "24h"},
               "gemini": {"default": "1h", "extended": "1h"}}


def break_even_per_day(provider: str, model: str, *, prefix_tokens: int, ttl: str) -> float | None:
    """The Poisson arrival rate (requests per day) at which caching costs exactly what not caching does: below
    it most requests find the entry expired and pay the write premium. 0.0 when caching never costs more (no
    write premium), None when the prefix is under the model's minimum (nothing is ever cached)."""

    def saving(rate: float) -> float:
        return daily_costs(provider, model, prefix_tokens=prefix_tokens, requests_per_day=rate,
                           ttl=ttl)["saving_per_day"] / rate

    if not daily_costs(provider, model, prefix_tokens=prefix_tokens, requests_per_day=1, ttl=ttl)["cacheable"]:
        return None
    low, high = 1e-3, 1e7
    if saving(low) >= 0:
        return 0.0
    for _ in range(200):  # bisection on a log scale: the saving per request only grows with the rate
        mid = math.sqrt(low * high)
        low, high = (mid, high) if saving(mid) < 0 else (low, mid)
    return math.sqrt(low * high)


@dataclass(frozen=True, slots=True)
class Economics:
    """Daily input cost with and without caching for one provider model, TTL and static prefix."""

    provider: str
    model: str
    ttl: str
    prefix_tokens: int
    requests_per_day: int
    curve: pd.DataFrame  # one row per rate of RATES: daily_costs(...) and "rate"
    point: dict  # daily_costs at requests_per_day
    break_even: tuple[float, int]  # (exact N*, whole requests) per TTL window
    break_even_per_day: float | None
    table: pd.DataFrame  # every provider model at this rate and prefix

    @property
    def cheaper_with_caching(self) -> bool:
        return self.point["cached_per_day"] < self.point["uncached_per_day"]

    def with_reasons(self) -> pd.DataFrame:
        """The provider table with a column saying why a row never hits: a prefix under the model's minimum."""
        def why(row: pd.Series) -> str:
            minimum = model_price(row["provider"], row["model"]).min_cacheable_tokens
            return "" if row["cacheable"] else f"{self.prefix_tokens:,} < its {minimum:,}-token minimum: never cached"
        return self.table.assign(**{"why no hits": self.table.apply(why, axis=1)})

    def multipliers(self) -> dict[str, float]:
        """What a hit saves and what a miss adds, as fractions of the input price (from the price table)."""
        p = unit_prices(self.provider, self.model, self.ttl)
        return {"hit_saves": 1 - p["read"] / p["input"], "miss_adds": p["write"] / p["input"] - 1}

    @property
    def comparison(self) -> str:
        """'cheaper' or 'dearer' (or 'the same'): caching against not caching at the chosen rate."""
        cached, plain = self.point["cached_per_day"], self.point["uncached_per_day"]
        return "cheaper" if cached < plain else "dearer" if cached > plain else "the same"


def daily_economics(provider: str = "anthropic", model: str = "claude-sonnet-4-6", *, ttl: str = "5m",
              prefix_tokens: int = 4000, requests_per_day: int = 10_000) -> Economics:
    curve = pd.DataFrame([daily_costs(provider, model, prefix_tokens=prefix_tokens, requests_per_day=r, ttl=ttl)
                          | {"rate": r} for r in RATES])
    point = daily_costs(provider, model, prefix_tokens=prefix_tokens, requests_per_day=requests_per_day, ttl=ttl)
    return Economics(provider, model, ttl, prefix_tokens, requests_per_day, curve, point,
                     break_even_requests(provider, model, ttl),
                     break_even_per_day(provider, model, prefix_tokens=prefix_tokens, ttl=ttl),
                     provider_table(prefix_tokens=prefix_tokens, requests_per_day=requests_per_day))


def seed_example_table() -> pd.DataFrame:
    """The book's worked example: what it says next to what the package computes from the same prices."""
    ex = seed_worked_example()
    # The book's own figures, quoted so the notebook can compare them with the computation.
    seed_says = {"break-even requests": "≈ 1.5", "uncached per day": "$120", "cached per day": "$12",
                 "saving per month": "roughly $3,240"}
    computed = {"break-even requests": f"{ex['break_even_exact']:.3f} (so {ex['break_even_requests']} requests)",
                "uncached per day": f"${ex['uncached_per_day']:,.2f}",
                "cached per day": f"${ex['cached_per_day']:,.4f}",
                "saving per month": f"${ex['saving_per_month']:,.2f}"}
    return pd.DataFrame({"quantity": list(seed_says), "the book says": list(seed_says.values()),
                         "computed here": list(computed.values())})


# ------------------------------------------------------------------------------------------------ TTL
TIMELINE_S = [0, 120, 240, 500, 560, 1500, 1520, 2400, 4000, 4100]


@dataclass(frozen=True, slots=True)
class TTLTimeline:
    """Requests at TIMELINE_S on a simulated clock against one Anthropic TTL: which write, which read."""

    ttl: str
    frame: pd.DataFrame  # time_s, write, read, cost_usd, expires_s
    uncached_usd: float

    @property
    def writes(self) -> int:
        return int((self.frame.read == 0).sum())

    @property
    def reads(self) -> int:
        return len(self.frame) - self.writes

    @property
    def cost_usd(self) -> float:
        return float(self.frame.cost_usd.sum())


def ttl_timeline(tokenizer, static_text: str, ttl: str = "5m") -> TTLTimeline:
    clock = SimClock()
    cache = AnthropicCache(DEFAULT_MODEL, clock=clock)
    ids = tokenizer.encode(static_text, add_special_tokens=False)
    prompt = [Block(tuple(ids), ttl), Block((1, 2, 3))]
    rows = []
    for t in TIMELINE_S:
        clock.advance(t - clock())
        usage = cache.request(prompt, response_delay_s=1.0)
        rows.append({"time_s": t, "write": usage.cache_creation_input_tokens, "read": usage.cache_read_input_tokens,
                     "cost_usd": usage.cost_usd(DEFAULT_MODEL),
                     "expires_s": max(e[2] for e in cache.live_entries())})
    plain = AnthropicCache(DEFAULT_MODEL, min_cacheable_tokens=10**9, clock=SimClock()).request(prompt)
    return TTLTimeline(ttl, pd.DataFrame(rows), plain.cost_usd(DEFAULT_MODEL) * len(TIMELINE_S))
