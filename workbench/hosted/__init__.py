"""Hosted-API prompt caching, emulated: each provider's documented rules (Anthropic, OpenAI, Gemini) as data
plus small code, on a simulated clock, and the cost arithmetic that follows from their prices.

No hosted API is reachable from the workbench, so the rules decide what a provider *would* bill and report
(``usage`` fields, prices), while the engine's real prefix cache does the skipping (see
``workbench.serve.anthropic_messages``). Prices, minimums and TTLs live in ``datasets/hosted/pricing.json``.
"""

from workbench.hosted.anthropic_cache import AnthropicCache, Block, CacheUsage
from workbench.hosted.clock import SimClock
from workbench.hosted.costs import (
                                    break_even_requests,
                                    daily_costs,
                                    hit_probability,
                                    miss_penalty_usd,
                                    seed_worked_example,
)
from workbench.hosted.openai_cache import OpenAICache, OpenAIUsage
from workbench.hosted.pricing import load_pricing

__all__ = ["AnthropicCache", "Block", "CacheUsage", "OpenAICache", "OpenAIUsage", "SimClock", "break_even_requests",
           "daily_costs", "hit_probability", "load_pricing", "miss_penalty_usd", "seed_worked_example"]
