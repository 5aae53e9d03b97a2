"""Chapter 8's 'Try this' exercises and its closing table, computed from the chapter's own results."""

from __future__ import annotations

import math

import pandas as pd

from workbench.lab.ch08.latency import PrefillCost, TokenLatency
from workbench.lab.ch08.runs import CapacityFit, DashboardRun
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.exercises import Exercise
from workbench.monitoring.capacity import replicas_for, seed_estimate
from workbench.monitoring.profiling import StepProfile


def exercises(plan: pd.DataFrame) -> dict[str, Exercise]:
    """``plan``: the capacity panel's plan (`CapacityPlanLab.plan`)."""
    seed = seed_estimate()
    batched = seed_estimate(decode_ms_per_token=7.5)
    chosen = plan.loc[plan["chosen"], "rps_per_replica"]
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
            lambda: replicas_for(20.0, float(chosen.iloc[0]) if len(chosen) else 0.0),
            why="ceil(20 x 1.2 / requests per second one replica sustains)", hint="replicas_for(20, rps)", rel_tol=0.0),
    }


def closing_table(dashboard: DashboardRun, steady: DashboardRun, latency: TokenLatency, profile: StepProfile,
                  fit: CapacityFit, prefill: PrefillCost, grafana: pd.DataFrame, *, rate: float,
                  itl_slo_ms: float) -> ClosingTable:
    """The seed's takeaways against the burst and steady dashboard runs, TPOT against ITL from the burst run, the
    step profile, the capacity fit and the direct prefill check, and the Grafana check."""
    exported = bool(grafana["all exported"].all())
    mean_n, tail_n = fit.replicas(rate, itl_slo_ms, "mean"), fit.replicas(rate, itl_slo_ms, "p99")
    top = profile.ranges.sort_values("ms", ascending=False).iloc[0]
    ratio = prefill.fit_over_direct(fit)
    near = prefill.nearest_to_chunk(fit)
    return ClosingTable([
        Takeaway(
            "TTFT, ITL, KV utilization and prefix hit rate are the primary metrics; watch them from day one.",
            f"all scraped from /metrics every 0.25 s ({'every' if exported else 'not every'} Grafana panel's metric "
            f"exported); the burst moved p99 TTFT to {dashboard.peak_ttft_p99_s:.2f} s (steady load: "
            f"{steady.peak_ttft_p99_s:.2f} s), waiting to {dashboard.peak_waiting:.0f}, KV usage to "
            f"{dashboard.peak_kv_usage:.0%}; in the same run p99 ITL was {latency.itl_p99:.0f} ms and p99 TPOT "
            f"{latency.tpot_p99:.0f} ms",
            Verdict.judge(exported and dashboard.peak_waiting >= 1
                          and dashboard.peak_ttft_p99_s > steady.peak_ttft_p99_s,
                          caveat=latency.tail_ratio > 1.25),
            note=f"ITL and TPOT are not interchangeable: ITL is every gap, TPOT a per-request average, and the "
                 f"ITL tail was {latency.tail_ratio:.1f}x TPOT's; say which one an SLO is on"),
        Takeaway(
            "Distributed tracing shows per-request behaviour aggregates hide.",
            "not measured (no OpenTelemetry collector here); the benchmark client's per-request records "
            f"({dashboard.completed} requests, {len(latency.itl_ms)} token gaps) play that part",
            Verdict.NOT_MEASURABLE,
            note="needs a tracing backend (OpenTelemetry) beside the server; the notebook has none"),
        Takeaway(
            "Alert on rate of change, not only absolute thresholds.",
            "p99 TTFT > 2x its own baseline: "
            + (f"fired at {dashboard.alert.fired_at:.1f} s" if dashboard.alert.fired else "did not fire")
            + f" on the burst (burst at {dashboard.burst_t:.1f} s); "
            + ("quiet on steady load" if not steady.alert.fired else "also fired on steady load"),
            Verdict.judge(dashboard.fired_on_burst and not steady.alert.fired, caveat=True),
            note="only with a hold time (a p99 over a short window on a light load is one request) and a baseline "
                 "that ends a window back (else the rising queue drags its own baseline up)"),
        Takeaway(
            "PyTorch Profiler and Nsight are the tools for step-level investigation.",
            f"torch.profiler over {profile.num_steps} steps: the engine's named ranges cover {profile.coverage:.0%} "
            f"of the step; the top range is {top['range']} ({top['share']:.0%})",
            Verdict.judge(profile.coverage >= 0.8, caveat=not 0.9 <= profile.coverage <= 1.1),
            note="Nsight is not run here (CPU); the same named ranges are NVTX ranges on CUDA"),
        Takeaway(
            "Capacity planning should use P95/P99 inputs, not averages.",
            f"at {rate:g} req/s and ITL <= {itl_slo_ms:g} ms: {mean_n:g} replicas from mean lengths, {tail_n:g} "
            f"from p99 lengths; the fit's {fit.costs.prefill_ms_per_token:.2f} ms per prefill token is "
            f"{ratio:.1f}x the {prefill.ms_per_token():.2f} ms measured on one unchunked {prefill.longest:,}-token "
            f"prefill ({prefill.ms_per_token(near):.2f} ms at {near:,} tokens)",
            Verdict.NOT_MEASURABLE if math.isinf(mean_n) else
            Verdict.judge(tail_n >= mean_n, caveat=not 0.8 <= ratio <= 1.25),
            note=(f"no batch size met ITL <= {itl_slo_ms:g} ms with these step costs, so neither plan has a replica "
                  "count; a faster machine or a looser target would" if math.isinf(mean_n) else
                  f"the step-cost inputs matter as much as the statistic: the fit only sees prefill chunks of at "
                  f"most {fit.largest_chunk} tokens mixed with decodes, and gives {ratio:.1f}x the per-token cost "
                  f"of one long prompt measured directly; take the prefill cost at the lengths the deployment "
                  "serves")),
    ])
