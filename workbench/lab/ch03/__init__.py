"""Chapter 3, prompt caching in hosted APIs: each provider's documented rules emulated (`workbench.hosted`, prices
in datasets/hosted/pricing.json) on top of the engine's real prefix cache, whose skipped prefill is timed.

    bench.py           HostedBench (one warmed-up engine, a simulated clock), the prompt layouts, the conversation
    runs.py            result objects and the runs that make them: LayoutRun, MultiTurnRun, MinimumRun, HttpUsage
    economics.py       the price-table side: Economics (daily cost, break-even per TTL window and per day), the
                       book's worked example recomputed, TTLTimeline
    panels.py          EconomicsLab, TTLLab
    panels_engine.py   LayoutLab, MultiTurnLab, MinimumLab
    ending.py          the exercises and the closing table
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "HostedBench": "bench", "LAYOUTS": "bench", "MULTI_TURN_VARIANTS": "bench", "DEFAULT_MODEL": "bench",
    "layout_body": "bench",
    "LayoutRun": "runs", "MultiTurnRun": "runs", "MinimumRun": "runs", "HttpUsage": "runs", "hit_rate": "runs",
    "layout_run": "runs", "multi_turn_run": "runs", "minimum_run": "runs", "http_usage_run": "runs",
    "Economics": "economics", "TTLTimeline": "economics", "daily_economics": "economics",
    "break_even_per_day": "economics", "seed_example_table": "economics", "ttl_timeline": "economics",
    "load_pricing": "workbench.hosted.pricing", "model_price": "workbench.hosted.pricing",
    "break_even_requests": "workbench.hosted.costs",
    "EconomicsLab": "panels", "TTLLab": "panels",
    "LayoutLab": "panels_engine", "MultiTurnLab": "panels_engine", "MinimumLab": "panels_engine",
    "exercises": "ending", "closing_table": "ending", "chapter_baseline": "runs", "turn_reading": "runs",
    "seed_claims": "seed",
})
