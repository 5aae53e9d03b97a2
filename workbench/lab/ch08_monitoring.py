"""Chapter 8 lab: monitoring a serving engine the way production does.

The notebook imports this module only: a server it starts in the background and always stops (`serve`), the
panels (`workbench.lab.ch08_panels`: live dashboard with the change alert, step profile, capacity plan), the
seed's planning arithmetic recomputed, the Grafana dashboard's expressions against what the server exports, the
'Try this' exercises and the closing table of takeaways.
"""

from __future__ import annotations

import atexit
import json
import re
import socket
from functools import cache
from pathlib import Path

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.ch08_panels import RULE, CapacityLab, DashboardLab, ProfileLab, dashboard_load
from workbench.lab.kit.exercises import Exercise
from workbench.models import model_spec, random_model
from workbench.monitoring.capacity import plan_from_step_costs, prefill_floor_ms, replicas_for, seed_estimate
from workbench.serve.launch import ServerThread

__all__ = ["RULE", "CapacityLab", "DashboardLab", "ProfileLab", "dashboard_load", "exercises", "grafana_check",
           "prefill_check", "seed_planning", "serve", "serving_model", "takeaways"]

DASHBOARD = Path(__file__).resolve().parents[2] / "datasets" / "grafana" / "kv_workbench_serving.json"
A100_BF16_PEAK = 312e12  # dense bf16 FLOP/s of an A100 (NVIDIA's datasheet)
SERVED_NAME = "tiny-smollm2"


@cache
def serving_model():
    """SmolLM2's shapes and full vocabulary with 2 layers and random weights: a step takes milliseconds on a CPU,
    so a 10 s load with a fault in it fits the notebook's time budget. What the metrics show does not depend on
    the weights (the load ignores end-of-sequence)."""
    spec = model_spec("smollm2-135m").replace(name="smollm2-shapes-2-layers", num_layers=2, intermediate_size=256)
    return random_model(spec, device="cpu", seed=5)


class BackgroundServer:
    """Our OpenAI-compatible server on 127.0.0.1 (a free port) in a background thread; ``stop()`` is idempotent
    and also runs at interpreter exit, so the port is released even if the notebook fails half-way."""

    def __init__(self, engine: LLMEngine, model_name: str):
        self.thread = ServerThread(engine, model_name=model_name)
        self.host, self.port, self.url = self.thread.host, self.thread.port, self.thread.url
        self.stopped = False
        self.thread.start()
        atexit.register(self.stop)

    @property
    def engine_loop(self):
        return self.thread.engine_loop

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.thread.stop()

    def port_open(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((self.host, self.port)) == 0

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(tokenizer, *, num_blocks: int = 256) -> BackgroundServer:
    engine = LLMEngine(serving_model(), tokenizer, cache_config=CacheConfig(num_blocks=num_blocks),
                       scheduler_config=SchedulerConfig())
    return BackgroundServer(engine, SERVED_NAME)


def seed_planning() -> pd.DataFrame:
    """The seed's worked example (10 req/s, 2,000-token prompts at 70 % hits, 300 output tokens, 50 ms per 1k
    prefill tokens, 150 ms per decode token, 20 % headroom), step by step."""
    s = seed_estimate()
    rows = [("prefill ms per request", s["prefill_ms"]), ("ms per request (single stream)", s["total_ms_per_request"]),
            ("requests/s per GPU", s["rps_per_gpu"]), ("GPUs, exact", s["exact_gpus"]),
            ("its code returns (round to nearest)", s["code_result"]),
            ("its prose prints (rps rounded to 0.022 first)", s["text_result"]),
            ("rounded up, as sizing must", s["ceil_result"])]
    return pd.DataFrame(rows, columns=["step", "value"]).set_index("step")


def prefill_check(tokens: int = 1000) -> dict[str, float]:
    """Llama-3-70B's ``tokens``-token prefill at the A100's bf16 peak against the seed's 50 ms."""
    floor = prefill_floor_ms(model_spec("llama-3-70b"), tokens, A100_BF16_PEAK)
    return {"floor_ms": floor, "seed_ms": 50.0, "seed_over_peak": floor / 50.0}


def grafana_check(url: str) -> pd.DataFrame:
    """Each panel of the Grafana dashboard, the metric names its expressions use, and whether the server at
    ``url`` exports every one of them."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    rows = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        names = sorted({n for t in panel["targets"] for n in re.findall(r"vllm:[A-Za-z0-9_:]+", t["expr"])})
        rows.append({"panel": panel["title"], "metrics": ", ".join(names),
                     "all exported": all(n in exported for n in names)})
    return pd.DataFrame(rows)


def exercises(capacity: CapacityLab) -> dict[str, Exercise]:
    seed = seed_estimate()
    batched = seed_estimate(decode_ms_per_token=7.5)
    return {
        "rounding": Exercise(
            "The seed's example needs 540.36 GPUs. How many must you buy?", lambda: seed["ceil_result"],
            why="half a GPU short is still short: capacity rounds up (its code rounds to the nearest, 540; its "
                "prose rounds requests/s to 0.022 first and gets 546)", hint="math.ceil", rel_tol=0.0),
        "batched": Exercise(
            "Redo the seed's example with 7.5 ms per decode token (its own 'at batch size 64' figure). GPUs?",
            lambda: batched["ceil_result"], why="decode dominates: 300 x 7.5 ms + 30 ms per request",
            hint="seed_estimate(decode_ms_per_token=7.5)['ceil_result']", rel_tol=0.0),
        "replicas": Exercise(
            "From the capacity panel's fit: replicas for 20 req/s at the chosen batch's req/s per replica (20% "
            "headroom)?",
            lambda: replicas_for(20.0, float(capacity.plan.loc[capacity.plan["chosen"], "rps_per_replica"].iloc[0])),
            why="ceil(20 x 1.2 / requests per second one replica sustains)", hint="replicas_for(20, rps)", rel_tol=0.0),
    }


def takeaways(dashboard: DashboardLab, steady: DashboardLab | None, profile: ProfileLab,
              capacity: CapacityLab, grafana: pd.DataFrame) -> pd.DataFrame:
    p = dashboard.panels
    fired = dashboard.alert.fired and dashboard.alert.fired_at >= dashboard.burst_t
    quiet = steady is None or not steady.alert.fired
    mean_plan = capacity.plan
    p99 = plan_from_step_costs(capacity.traffic(), capacity.costs, kv_capacity_tokens=capacity.kv_tokens, stat="p99")
    mean_r = mean_plan.loc[mean_plan["chosen"], "replicas"]
    tail_r = p99.loc[p99["chosen"], "replicas"]
    mean_n = float(mean_r.iloc[0]) if len(mean_r) else float("inf")
    tail = float(tail_r.iloc[0]) if len(tail_r) else float("inf")
    rows = [
        ("TTFT, ITL, KV utilization and prefix hit rate are the primary metrics; watch them from day one.",
         f"all scraped from /metrics every 0.25 s; the burst moved p99 TTFT to {p['ttft_p99_s'].max():.2f} s, "
         f"waiting to {p['waiting'].max():.0f}, KV usage to {p['kv_usage'].max():.0%}",
         "holds" if p["waiting"].max() >= 1 else "not shown"),
        ("Distributed tracing shows per-request behaviour aggregates hide.",
         "not measured (no OpenTelemetry here); the benchmark client's per-request records play that part",
         "not measured"),
        ("Alert on rate of change, not only absolute thresholds.",
         f"p99 TTFT > 2x its own baseline: fired at {dashboard.alert.fired_at or float('nan'):.1f} s on the burst "
         f"(burst at {dashboard.burst_t:.1f} s); " + ("quiet on steady load" if quiet else "also fired on steady load"),
         "holds with a caveat" if fired and quiet else "wrong"),
        ("PyTorch Profiler and Nsight are the tools for step-level investigation.",
         f"named ranges cover {profile.profile.coverage:.0%} of the step; top range "
         f"{profile.profile.ranges.sort_values('ms', ascending=False)['range'].iloc[0]}",
         "holds" if 0.9 <= profile.profile.coverage <= 1.1 else "holds with a caveat"),
        ("Capacity planning should use P95/P99 inputs, not averages.",
         f"replicas from mean lengths {mean_n:g}, from p99 lengths {tail:g}; Grafana panels all over exported "
         f"metrics: {bool(grafana['all exported'].all())}",
         "holds" if tail >= mean_n else "wrong"),
    ]
    return pd.DataFrame(rows, columns=["the seed's takeaway", "measured here", "verdict"])
