"""Chapter 10's 'Try this' exercises and its closing table, computed from the chapter's own results.

Chapter 10 has no seed chapter: its claims are the ones serving users and engines make about determinism, each
with its source, checked by this chapter's measurements.
"""

from __future__ import annotations

import pandas as pd

from workbench.lab.ch10.runs import ProductCheck, summary
from workbench.lab.kit.closing import ClosingTable, Takeaway
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.quality.determinism import DivergenceReport


def exercises(check: ProductCheck, cached: pd.DataFrame) -> dict[str, Exercise]:
    int4_off = cached[(cached["kv_cache_dtype"] == "int4") & ~cached["batch_invariant"]].iloc[0]
    return {
        "layer": Exercise(
            "Which linear layer of this model gives a row other bits when it shares the product with other rows? "
            "(its name, e.g. 'o_proj')",
            lambda: (check.layers_that_differ or ["none"])[0],
            why="read from the products panel: its reduction (K) is the longest of the model's layers, and the "
                "library picks another summation order for a 1-row product than for a many-row one",
            hint="the panel's table lists 'identical' per layer"),
        "int4": Exercise(
            f"Over the cached {int(int4_off['runs'])} runs with int4 KV and the mode off, how many distinct "
            "completions did the one prompt get?",
            lambda: int(int4_off["distinct_completions"]),
            why="a last-bit difference in a key moves it across an int4 step, which changes the logits by far "
                "more than the rounding itself, so greedy choices flip", rel_tol=0.0),
    }


def _share(count: int, runs: int) -> float:
    return count / runs if runs else 0.0


def control_reading(report: DivergenceReport) -> str:
    """What the runs alone and the runs among traffic showed, read from the live report (not typed)."""
    runs = report.runs
    alone, busy = runs[runs["others"] == 0], runs[runs["others"] > 0]
    cached = alone[alone["cached_prompt_tokens"] > 0]
    steps = busy["first_logit_difference"].dropna()
    return (f"decoded alone {len(alone)} times ({len(cached)} of them reading the prompt's prefix from the cache), "
            f"the logits differed from the reference in {int(alone['first_logit_difference'].notna().sum())}; among "
            f"traffic they differed in {len(steps)} of {len(busy)} runs, first at decode step "
            + (f"{int(steps.min())}" if len(steps) else "-")
            + (f" (step {int(steps.mode().iloc[0])} in most)" if len(steps) else ""))


def closing_table(cached: pd.DataFrame, live: dict[bool, DivergenceReport], cost_ratio: float,
                  check: ProductCheck, *, cost_contention: Contention | None = None) -> ClosingTable:
    """The chapter's claims against its measurements: the cached 200-run result, the live runs, the cost.

    ``cost_contention``: the cost panel's reading (``panel.contention``); the cost row, the one judged from a
    timing, says "the machine was busy" instead of concluding when it was busy. The other rows compare bits."""
    off = cached[~cached["batch_invariant"]].set_index("kv_cache_dtype")
    on = cached[cached["batch_invariant"]].set_index("kv_cache_dtype")
    runs = int(cached["runs"].max())
    fp32_off, fp32_on = off.loc["auto"], on.loc["auto"]
    most = off["distinct_completions"].idxmax()
    live_on = summary(live[True])
    per_format = ", ".join(f"{fmt} KV {int(row.distinct_completions)} distinct and logits differ in "
                           f"{int(row.runs_with_other_logits)}" for fmt, row in on.iterrows())
    half = 0.5 / runs  # less than one run in the share: "none"
    report = live[False]
    alone = report.runs[report.runs["others"] == 0]
    busy = report.runs[report.runs["others"] > 0]
    return ClosingTable([
        Takeaway.judged(
            "Temperature 0 makes an engine deterministic: the same prompt gives the same answer.",
            f"the default engine, one prompt, {runs} runs among 0-15 other requests: fp32 KV gave "
            f"{_completions(int(fp32_off['distinct_completions']))} but different logits in "
            f"{int(fp32_off['runs_with_other_logits'])} runs; {most} KV gave "
            f"{int(off.loc[most, 'distinct_completions'])} distinct completions",
            Evidence.exact("share of runs whose logits differ from the prompt alone (fp32 KV, default)",
                           _share(int(fp32_off["runs_with_other_logits"]), runs), half, expect="below", n=runs,
                           n_label=f"{runs} runs (bit comparisons)", unit="%"),
            wrong_note="sampling is deterministic, the arithmetic is not: logits depend on the batch, and an answer "
                       "changes wherever two tokens are closer than that difference"),
        Takeaway.judged(
            "The cause is the batch, not concurrency races: the same request rounds differently because the "
            "products it shares have other shapes (Thinking Machines, 'Defeating Nondeterminism in LLM "
            "Inference', 2025).",
            f"{control_reading(report)}; {len(check.layers_that_differ)} of the model's linear layers "
            f"({', '.join(check.layers_that_differ) or 'none'}) "
            f"{'gives' if len(check.layers_that_differ) == 1 else 'give'} a row other bits inside a batch",
            [Evidence.exact("linear layers whose row changes bits inside a batch", len(check.layers_that_differ), 0.5,
                            n_label="layer comparisons", unit=""),
             Evidence.exact("share of runs among traffic with other logits", _share(
                 int(busy["first_logit_difference"].notna().sum()), len(busy)), 0.5 / max(len(busy), 1),
                            n=len(busy), n_label=f"{len(busy)} live runs", unit="%"),
             Evidence.exact("share of runs alone (one with a cache hit) with other logits", _share(
                 int(alone["first_logit_difference"].notna().sum()), len(alone)), 0.5 / max(len(alone), 1),
                            expect="below", n=len(alone), n_label=f"{len(alone)} live runs", unit="%")],
            wrong_note="logits also changed without traffic, or not with it: this run does not single out the batch"),
        Takeaway.judged(
            "Batch-invariant kernels make greedy decoding reproducible (Thinking Machines: 1,000 runs, 80 "
            "distinct completions by default, 1 with batch-invariant kernels).",
            f"with the mode on: {per_format} of {runs} runs; live: {live_on['distinct_completions']} distinct, "
            f"logits differ in {live_on['runs_with_other_logits']} of {live_on['runs']}",
            [Evidence.exact("share of runs with other logits, mode on (every format)",
                            _share(int(on["runs_with_other_logits"].max()), runs), half, expect="below", n=runs,
                            n_label=f"{runs} runs per format (bit comparisons)", unit="%"),
             Evidence.exact("distinct completions, mode on, fp32 KV", int(fp32_on["distinct_completions"]), 1.5,
                            expect="below", n=runs, n_label=f"{runs} runs", unit="")],
            wrong_note="the mode still let the logits or the answer change"),
        busy_takeaway(Takeaway.judged(
            "Determinism costs throughput.",
            f"the mode ran at {cost_ratio:.2f}x the default's output tokens/s on the same requests",
            Evidence.repeats("output tokens/s, mode on / off", [cost_ratio], null=1.0, expect="below",
                             n_label="median of 2 alternating passes", unit="x"),
            caveat=True,
            caveat_note="how much depends on the batch and the kernels, and this run does not split the cost between "
                        "padding small batches to 16-row tiles and the unfused 64-key attention blocks; Thinking "
                        "Machines' own numbers fell from 2.1x to 1.6x the default's time with a better attention "
                        "kernel, so much of it is kernel maturity",
            wrong_note="the mode was not slower here"), cost_contention),
    ], claim_header="the claim (and who makes it)")


def _completions(count: int) -> str:
    return f"{count} distinct completion{'' if count == 1 else 's'}"
