"""Measuring an engine under load: offline (driving an ``LLMEngine`` directly) or over HTTP (any endpoint).

``run_workload`` (:mod:`workbench.bench.offline`) replays a workload inside the process against an
``LLMEngine``. ``run_benchmark`` (:mod:`workbench.bench.runner`) sends the same kind of workload to any
OpenAI-compatible server (the workbench's own ``workbench serve``, vLLM, SGLang) and measures what a client
sees: TTFT, TPOT, ITL and end-to-end latency per request, throughput and goodput.

Names are imported on first use: the HTTP half needs httpx, which the engine does not, and the command line
reads ``workbench.bench.command`` without loading the engine.
"""

from __future__ import annotations

from typing import Any

_NAMES = {
    "run_workload": "workbench.bench.offline",
    "BenchResult": "workbench.bench.offline",
    "run_benchmark": "workbench.bench.runner",
    "ServingBenchResult": "workbench.bench.runner",
    "LoadShape": "workbench.bench.runner",
    "parse_slo": "workbench.bench.stats",
    "summarize": "workbench.bench.stats",
}

__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.bench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
