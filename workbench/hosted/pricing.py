"""The providers' prices, minimums and TTLs, read from the dated data file ``datasets/hosted/pricing.json``.

The rules that changed over time (per-model minimums, TTL options, retention) are data there, each section
naming the public page it came from and what could not be confirmed; code asks this module, never a constant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from workbench.paths import DATASETS_DIR

PRICING_PATH = DATASETS_DIR / "hosted" / "pricing.json"
PER_TOKEN = 1e-6  # prices are per million tokens


@cache
def load_pricing() -> dict[str, Any]:
    """The whole data file (cached; treat it as read-only)."""
    return json.loads(PRICING_PATH.read_text())


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's prices in USD per million tokens; ``cached_input`` is what a cache read costs."""

    provider: str
    name: str
    input: float
    output: float
    cached_input: float
    write_5m: float  # a cache write with the short TTL (OpenAI and Gemini: the plain input price)
    write_1h: float
    min_cacheable_tokens: int
    storage_per_mtok_hour: float = 0.0


def providers() -> list[str]:
    return ["anthropic", "openai", "gemini"]


def models(provider: str) -> list[str]:
    _check_provider(provider)
    return list(load_pricing()[provider]["models"])


def model_price(provider: str, name: str) -> ModelPrice:
    """Prices of ``name`` at ``provider``, with the provider's multipliers applied."""
    section = load_pricing()[_check_provider(provider)]
    if name not in section["models"]:
        raise ValueError(f"unknown {provider} model {name!r}; known: {', '.join(section['models'])}")
    row = section["models"][name]
    if provider == "anthropic":
        mult = section["multipliers"]
        return ModelPrice(provider, name, row["input"], row["output"], row["input"] * mult["read"],
                          row["input"] * mult["write_5m"], row["input"] * mult["write_1h"],
                          row["min_cacheable_tokens"])
    minimum = row.get("min_cacheable_tokens", section.get("min_cacheable_tokens", 0))
    return ModelPrice(provider, name, row["input"], row["output"], row["cached_input"], row["input"], row["input"],
                      minimum, row.get("storage_per_mtok_hour", 0.0))


def _check_provider(provider: str) -> str:
    if provider not in providers():
        raise ValueError(f"provider must be one of {providers()}, got {provider!r}")
    return provider
