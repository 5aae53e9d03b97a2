"""Chapter 3, prompt caching in hosted APIs: what a notebook imports (``from workbench.lab import
ch03_prompt_caching as ch03``). The provider rules and prices are `workbench.hosted`; the engine runs are
`workbench.lab.ch03_runs`; the panels `workbench.lab.ch03_panels`; the closing table and exercises
`workbench.lab.ch03_summary`.
"""

from workbench.hosted.costs import break_even_requests, provider_table, seed_worked_example
from workbench.hosted.pricing import load_pricing, model_price
from workbench.lab.ch03_panels import EconomicsLab, LayoutLab, MinimumLab, MultiTurnLab, TTLLab
from workbench.lab.ch03_runs import MULTI_TURN_VARIANTS, HostedBench, hit_rate, http_usage_run, multi_turn_run
from workbench.lab.ch03_summary import EXERCISES, seed_example_table, takeaways

__all__ = ["EXERCISES", "MULTI_TURN_VARIANTS", "EconomicsLab", "HostedBench", "LayoutLab", "MinimumLab",
           "MultiTurnLab", "TTLLab", "break_even_requests", "hit_rate", "http_usage_run", "load_pricing",
           "model_price", "multi_turn_run", "provider_table", "seed_example_table", "seed_worked_example",
           "takeaways"]
