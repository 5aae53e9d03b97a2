"""Chapter 8's 'Try this' exercises and its closing table, computed from the chapter's own results."""

from __future__ import annotations

import math

import pandas as pd

from workbench.lab.ch08.latency import PrefillCost, TokenLatency
from workbench.lab.ch08.runs import CapacityFit, DashboardRun
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.monitoring.capacity import replicas_for, seed_estimate
from workbench.monitoring.profiling import StepProfile

SEED_STEP_MS, SEED_BATCH = 150.0, 64  # the book's serial decode step and the batch it names


def tail_plan(fit: CapacityFit, rate: float, itl_slo_ms: float) -> dict[str, float]:
    """The mean-sized plan put under the tail: its batch and replicas from mean lengths, and what p99 lengths need
    at that batch (from the same fit: a model of the load, not a load test)."""
    mean, tail = fit.plan(rate, itl_slo_ms, "mean"), fit.plan(rate, itl_slo_ms, "p99")
    chosen = mean[mean["chosen"]]
    if not len(chosen):
        return {"batch": math.nan, "mean_replicas": math.inf, "tail_replicas": math.inf, "tail_itl_ms": math.nan}
    batch = int(chosen["batch"].iloc[0])
    at = tail[tail["batch"] == batch].iloc[0]
    return {"batch": batch, "mean_replicas": float(chosen["replicas"].iloc[0]),
            "tail_replicas": float(at["replicas"]), "tail_itl_ms": float(at["itl_ms"]),
            "tail_meets_itl": bool(at["meets_itl"])}


def exercises(plan: pd.DataFrame) -> dict[str, Exercise]:
    """``plan``: the capacity panel's plan (`CapacityPlanLab.plan`)."""
    seed = seed_estimate()
    batched = seed_estimate(decode_ms_per_token=SEED_STEP_MS / SEED_BATCH)
    chosen = plan.loc[plan["chosen"], "rps_per_replica"]
    return {
        "rounding": Exercise(
            "The book's example needs 540.36 GPUs. How many must you buy?", lambda: seed["ceil_result"],
            why="half a GPU short is still short: capacity rounds up (its code rounds to the nearest, 540; its "
                "prose rounds requests/s to 0.022 first and gets 546)", hint="math.ceil", rel_tol=0.0),
        "batched": Exercise(
            f"The book's {SEED_STEP_MS:.0f} ms decode step is bandwidth-bound, so at batch {SEED_BATCH} it takes about "
            f"as long and carries {SEED_BATCH} tokens: {SEED_STEP_MS:.0f} / {SEED_BATCH} = "
            f"{SEED_STEP_MS / SEED_BATCH:.2f} ms per token. Redo its example with that. GPUs?",
            lambda: batched["ceil_result"],
            why=f"decode dominates: 300 x {SEED_STEP_MS / SEED_BATCH:.2f} ms + 30 ms per request. The book's own "
                f"'5-10 ms' at batch {SEED_BATCH} would mean a step of {5 * SEED_BATCH}-{10 * SEED_BATCH} ms, 2-4x "
                "its batch-1 step, which a bandwidth-bound step does not do",
            hint=f"seed_estimate(decode_ms_per_token={SEED_STEP_MS:.0f} / {SEED_BATCH})['ceil_result']", rel_tol=0.0),
        "replicas": Exercise(
            "From the capacity panel's fit: replicas for 20 req/s at the chosen batch's req/s per replica (20% "
            "headroom)?",
            lambda: replicas_for(20.0, float(chosen.iloc[0]) if len(chosen) else 0.0),
            why="ceil(20 x 1.2 / requests per second one replica sustains)", hint="replicas_for(20, rps)", rel_tol=0.0),
    }


def closing_table(dashboard: DashboardRun, steady: DashboardRun, latency: TokenLatency, profile: StepProfile,
                  fit: CapacityFit, prefill: PrefillCost, grafana: pd.DataFrame, *, rate: float,
                  itl_slo_ms: float, dashboard_contention: Contention | None = None,
                  steady_contention: Contention | None = None, profile_contention: Contention | None = None,
                  capacity_contention: Contention | None = None) -> ClosingTable:
    """The book's takeaways against the burst and steady dashboard runs, TPOT against ITL from the burst run, the
    step profile, the capacity fit and the direct prefill check, and the Grafana check.

    The ``*_contention`` arguments are the panels' readings (``panel.contention``) of the runs each result came
    from. The rows judged from timings (the burst's p99 TTFT against the steady load's, the alert that reads them,
    the profile's shares of a step, the plan from fitted step costs) say "the machine was busy" instead of
    concluding when one of their readings was busy; the tracing row is not measured at all."""
    load = (dashboard_contention, steady_contention)
    exported = bool(grafana["all exported"].all())
    top = profile.ranges.sort_values("ms", ascending=False).iloc[0]
    ratio = prefill.fit_over_direct(fit)
    near = prefill.nearest_to_chunk(fit)
    tail = tail_plan(fit, rate, itl_slo_ms)
    metrics = Takeaway.judged(
        "TTFT, ITL, KV utilization and prefix hit rate are the primary metrics; watch them from day one.",
        f"all scraped from /metrics every 0.25 s ({'every' if exported else 'not every'} Grafana panel's metric "
        f"exported); the burst moved p99 TTFT to {dashboard.peak_ttft_p99_s:.2f} s (steady load: "
        f"{steady.peak_ttft_p99_s:.2f} s), waiting to {dashboard.peak_waiting:.0f}, KV usage to "
        f"{dashboard.peak_kv_usage:.0%}; in the same run p99 ITL was {latency.itl_p99:.0f} ms and p99 TPOT "
        f"{latency.tpot_p99:.0f} ms",
        [Evidence.exact("Grafana panels whose every metric is exported", float(exported), 0.5,
                        n=len(grafana), n_label=f"{len(grafana)} panels", unit=""),
         Evidence.repeats("peak p99 TTFT, burst / steady load", [dashboard.peak_ttft_p99_s],
                          [steady.peak_ttft_p99_s], n_label="run of each")],
        caveat=latency.tail_ratio > 1.25 or latency.tail_ratio < 0.8,
        caveat_note=f"ITL and TPOT are not interchangeable: ITL is every gap, TPOT a per-request average, and their "
                    f"tails differ ({latency.tail_ratio:.1f}x at p99 here); say which one an SLO is on",
        wrong_note="the metrics were not all exported, or the burst did not move p99 TTFT above the steady load's")
    alert = Takeaway.judged(
        "Alert on rate of change, not only absolute thresholds.",
        "p99 TTFT > 2x its own baseline: "
        + (f"fired at {dashboard.alert.fired_at:.1f} s" if dashboard.alert.fired else "did not fire")
        + f" on the burst (burst at {dashboard.burst_t:.1f} s); "
        + ("quiet on steady load" if not steady.alert.fired else "also fired on steady load"),
        [Evidence.exact("the rule fired on the burst run", float(dashboard.fired_on_burst), 0.5, n_label="run",
                        unit=""),
         Evidence.exact("the rule fired on the steady run", float(steady.alert.fired), 0.5, expect="below",
                        n_label="run", unit="")],
        caveat=True,
        caveat_note="only with a hold time (a p99 over a short window on a light load is one request) and a baseline "
                    "that ends a window back (else the rising queue drags its own baseline up); and this run does "
                    "not show it beating a fixed threshold, which held as long would also have paged on this burst",
        wrong_note="the rule missed the burst or fired on steady load")
    profiler = Takeaway.judged(
        "PyTorch Profiler and Nsight are the tools for GPU-level investigation when metrics indicate a problem.",
        f"torch.profiler over {profile.num_steps} steps on this CPU (no GPU, so no Nsight): the engine's named ranges "
        f"cover {profile.coverage:.0%} of the step; the top range is {top['range']} ({top['share']:.0%})",
        Evidence.exact("share of the step the named ranges cover", profile.coverage, 0.8, n=profile.num_steps,
                       n_label=f"{profile.num_steps} profiled steps", unit="%"),
        caveat=True,
        caveat_note="shown for the PyTorch Profiler on a CPU step; the GPU side (Nsight, device kernels, copies "
                    "and syncs) is not measurable here"
                    + ("" if 0.9 <= profile.coverage <= 1.1 else "; and the ranges leave part of the step unexplained"),
        wrong_note="the named ranges cover too little of the step to locate its time")
    sizing_claim = "Capacity planning should use P95/P99 inputs, not averages."
    if math.isinf(tail["mean_replicas"]):
        sizing = Takeaway(sizing_claim, f"at {rate:g} req/s no batch size met ITL <= {itl_slo_ms:g} ms with the "
                          f"fitted step costs", Verdict.NOT_MEASURABLE,
                          note=f"no batch size met ITL <= {itl_slo_ms:g} ms with these step costs, so neither plan "
                               "has a replica count; a faster machine or a looser target would",
                          evidence=(Evidence.absent("a plan that meets the ITL target"),))
        return ClosingTable([busy_takeaway(metrics, *load), _tracing(dashboard, latency),
                             busy_takeaway(alert, *load), busy_takeaway(profiler, profile_contention), sizing])
    sizing = Takeaway.judged(
        sizing_claim,
        f"at {rate:g} req/s and ITL <= {itl_slo_ms:g} ms the plan from mean lengths chose batch {tail['batch']:g} "
        f"and {tail['mean_replicas']:g} replicas; at that batch p99 lengths need {tail['tail_replicas']:g} replicas "
        f"(ITL {tail['tail_itl_ms']:.0f} ms); the fit's {fit.costs.prefill_ms_per_token:.2f} ms per prefill token is "
        f"{ratio:.1f}x the {prefill.ms_per_token():.2f} ms measured on one unchunked {prefill.longest:,}-token "
        f"prefill ({prefill.ms_per_token(near):.2f} ms at {near:,} tokens)",
        Evidence.exact("replicas p99 lengths need at the mean plan's batch / the mean plan's",
                       tail["tail_replicas"] / tail["mean_replicas"], 1.0,
                       n_label="the fitted step costs (a model of the load, not a load test)"),
        caveat=not 0.8 <= ratio <= 1.25,
        caveat_note=f"the step-cost inputs matter as much as the statistic: the fit only sees prefill chunks of at "
                    f"most {fit.largest_chunk} tokens mixed with decodes, and gives {ratio:.1f}x the per-token cost of "
                    "one long prompt measured directly; take the prefill cost at the lengths the deployment serves",
        wrong_note="here the tail lengths need no more replicas than the mean: the mean-sized plan would hold")
    return ClosingTable([busy_takeaway(metrics, *load), _tracing(dashboard, latency), busy_takeaway(alert, *load),
                         busy_takeaway(profiler, profile_contention), busy_takeaway(sizing, capacity_contention)])


def _tracing(dashboard: DashboardRun, latency: TokenLatency) -> Takeaway:
    return Takeaway(
        "Distributed tracing shows per-request behaviour aggregates hide.",
        "not measured (no OpenTelemetry collector here); the benchmark client's per-request records "
        f"({dashboard.completed} requests, {len(latency.itl_ms)} token gaps) play that part",
        Verdict.NOT_MEASURABLE,
        note="needs a tracing backend (OpenTelemetry) beside the server; the notebook has none",
        evidence=(Evidence.absent("traces from a tracing backend"),))
