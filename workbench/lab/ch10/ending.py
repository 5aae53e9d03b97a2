"""Chapter 10's 'Try this' exercises and its closing table, computed from the chapter's own results.

Chapter 10 has no seed chapter: its claims are the ones serving users and engines make about determinism, each
with its source, checked by this chapter's measurements.
"""

from __future__ import annotations

import pandas as pd

from workbench.lab.ch10.runs import ProductCheck, summary
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
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


def closing_table(cached: pd.DataFrame, live: dict[bool, DivergenceReport], cost_ratio: float,
                  check: ProductCheck) -> ClosingTable:
    """The chapter's claims against its measurements: the cached 200-run result, the live runs, the cost."""
    off = cached[~cached["batch_invariant"]].set_index("kv_cache_dtype")
    on = cached[cached["batch_invariant"]].set_index("kv_cache_dtype")
    runs = int(cached["runs"].max())
    fp32_off, fp32_on = off.loc["auto"], on.loc["auto"]
    most = off["distinct_completions"].idxmax()
    live_off, live_on = summary(live[False]), summary(live[True])
    per_format = ", ".join(f"{fmt} KV {int(row.distinct_completions)} distinct and logits differ in "
                           f"{int(row.runs_with_other_logits)}" for fmt, row in on.iterrows())
    return ClosingTable([
        Takeaway(
            "Temperature 0 makes an engine deterministic: the same prompt gives the same answer.",
            f"the default engine, one prompt, {runs} runs among 0-15 other requests: fp32 KV gave "
            f"{int(fp32_off['distinct_completions'])} distinct completion(s) but different logits in "
            f"{int(fp32_off['runs_with_other_logits'])} runs; {most} KV gave "
            f"{int(off.loc[most, 'distinct_completions'])} distinct completions",
            Verdict.judge(int(off["distinct_completions"].max()) == 1 and int(off["runs_with_other_logits"].max()) == 0,
                          caveat=False),
            note="sampling is deterministic, the arithmetic is not: logits depend on the batch, and an answer "
                 "changes wherever two tokens are closer than that difference"),
        Takeaway(
            "The cause is the batch, not concurrency races: the same request rounds differently because the "
            "products it shares have other shapes (Thinking Machines, 'Defeating Nondeterminism in LLM "
            "Inference', 2025).",
            f"decoded alone twice, logits were identical; among traffic they differed from the first decode step "
            f"on; {len(check.layers_that_differ)} of the model's linear layers ({', '.join(check.layers_that_differ)}) "
            "give a row other bits inside a batch",
            Verdict.judge(bool(check.layers_that_differ) and live_off["runs_with_other_logits"] > 0)),
        Takeaway(
            "Batch-invariant kernels make greedy decoding reproducible (Thinking Machines: 1,000 runs, 80 "
            "distinct completions by default, 1 with batch-invariant kernels).",
            f"with the mode on: {per_format} of {runs} runs; live: {live_on['distinct_completions']} distinct, "
            f"logits differ in {live_on['runs_with_other_logits']} of {live_on['runs']}",
            Verdict.judge(int(on["runs_with_other_logits"].max()) == 0 and live_on["runs_with_other_logits"] == 0
                          and int(fp32_on["distinct_completions"]) == 1)),
        Takeaway(
            "Determinism costs throughput.",
            f"the mode ran at {cost_ratio:.2f}x the default's output tokens/s on the same requests",
            Verdict.judge(cost_ratio < 1.0, caveat=True),
            note="how much depends on the batch: fixed tiles pad small batches and split large ones; on a GPU the "
                 "cost is in kernels that may no longer split a reduction by batch size"),
    ])
