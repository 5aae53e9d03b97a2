"""Chapter 3's closing table (each of the seed chapter's takeaways → what was measured here → verdict) and its
'Try this' exercises, all computed from the chapter's own runs and the price table."""

from __future__ import annotations

import pandas as pd

from workbench.hosted import OpenAICache, SimClock
from workbench.hosted.costs import break_even_requests, hit_probability, seed_worked_example
from workbench.lab.ch03_runs import MULTI_TURN_VARIANTS, hit_rate
from workbench.lab.kit.exercises import Exercise


def seed_example_table() -> pd.DataFrame:
    """The seed's worked example: what it says next to what the package computes from the same prices."""
    ex = seed_worked_example()
    # The seed's own figures, quoted so the notebook can compare them with the computation.
    seed_says = {"break-even requests": "≈ 1.5", "uncached per day": "$120", "cached per day": "$12",
                 "saving per month": "roughly $3,240"}
    computed = {"break-even requests": f"{ex['break_even_exact']:.3f} (so {ex['break_even_requests']} requests)",
                "uncached per day": f"${ex['uncached_per_day']:,.2f}",
                "cached per day": f"${ex['cached_per_day']:,.4f}",
                "saving per month": f"${ex['saving_per_month']:,.2f}"}
    return pd.DataFrame({"quantity": list(seed_says), "the seed says": list(seed_says.values()),
                         "computed here": list(computed.values())})


def takeaways(layouts: dict[str, pd.DataFrame], multi_turn: pd.DataFrame, http: pd.DataFrame) -> pd.DataFrame:
    """The seed's five takeaways against this chapter's measurements."""
    static, dynamic = layouts["static first"], layouts.get("timestamp first", layouts.get("user id first"))
    later = multi_turn[multi_turn.request > 0]
    moving, fixed = (hit_rate(later[later.variant == name]) for name in MULTI_TURN_VARIANTS)
    five, _ = break_even_requests("anthropic", "claude-sonnet-4-6", "5m")
    hour, _ = break_even_requests("anthropic", "claude-sonnet-4-6", "1h")
    anthropic = http[http.api.str.startswith("anthropic")]
    rows = [
        ("Caching works on exact prefixes: put static content first.",
         f"static first: {hit_rate(static):.0%} of prompt tokens read from cache; dynamic line on top: "
         f"{hit_rate(dynamic):.0%}", "holds"),
        ("Break-even comes within 2-3 requests.",
         f"N* = {five:.2f} requests (5-minute TTL), {hour:.2f} (1-hour); OpenAI has no write premium (N* = 1)",
         "holds (the seed's 'N ≈ 1.5' is loose)"),
        ("Measure hit rates from usage fields.",
         f"through the HTTP server: {hit_rate(anthropic):.0%} read on /v1/messages; the engine's own count "
         "differs in block rounding and the minimum", "holds"),
        ("Cache the system prompt, not the conversation history.",
         f"after turn 1, breakpoint on the last message reads {moving:.0%} of the prompt, on the system prompt "
         f"only {fixed:.0%}: the growing history caches incrementally", "wrong"),
        ("Dynamic values destroy cache hits for everything after them.",
         f"a timestamp on top: {hit_rate(dynamic):.0%} read, every request pays the write", "holds"),
    ]
    return pd.DataFrame(rows, columns=["the seed's takeaway", "measured here", "verdict"])


def _openai_cached(prompt_tokens: int) -> int:
    cache = OpenAICache(clock=SimClock())
    prompt = list(range(prompt_tokens))
    cache.request(prompt)
    return cache.request(prompt).cached_tokens


EXERCISES = {
    "break_even_1h": Exercise(
        "With Anthropic's 1-hour TTL (writes at 2x, reads at 0.1x the input price), how many requests to one "
        "cached prefix does it take before caching costs no more than not caching? (a whole number)",
        answer=lambda: break_even_requests("anthropic", "claude-sonnet-4-6", "1h")[1],
        why="N* = (2 - 0.1) / (1 - 0.1) = 2.11, so the third request is the first at which caching has paid",
        hint="P(write + (N-1) read) <= N P input; solve for N", rel_tol=0.0),
    "openai_cached": Exercise(
        "OpenAI: the same 1,500-token prompt is sent twice within a minute. How many cached_tokens does the "
        "second response report?",
        answer=lambda: _openai_cached(1500),
        why="caching starts at 1,024 tokens and grows in 128-token steps: 1,024 + 3 x 128 = 1,408 <= 1,500",
        hint="1,024 + 128 k, the largest that fits", rel_tol=0.0),
    "hit_probability": Exercise(
        "100 requests a day arrive at random (Poisson) and share a prefix with a 5-minute TTL. What fraction "
        "of them find it cached? (0-1)",
        answer=lambda: hit_probability(100, 300),
        why="a request hits if the previous one came within 300 s: 1 - exp(-100/86,400 x 300) ≈ 0.29, so most "
            "requests pay the write premium and caching costs more than it saves", rel_tol=0.01),
}
