"""Chapter 5 lab: batching strategies, the throughput-latency frontier, and who gets served first.

The notebook imports this module only. It gathers the panels (`workbench.lab.ch05_panels`), the load drivers
(`workbench.bench.drive`), the checks of the course's loose claims (`workbench.lab.ch05_claims`), the
chapter's "Try this" exercises and the closing table that checks each key takeaway against the panels.
"""

from __future__ import annotations

import pandas as pd

from workbench.bench.drive import batching_engine, drive
from workbench.cache.sizing import max_concurrency
from workbench.lab.ch05_claims import (
    alternating_families,
    block_waste,
    cache_aware_hit_rates,
    dynamic_wait_effect,
    utilization_split,
)
from workbench.lab.ch05_panels import CapacityLab, ModesLab, PriorityLab, SweepLab, VarianceLab
from workbench.lab.ch05_runs import padding_waste, random_requests
from workbench.lab.kit.exercises import Exercise

__all__ = ["CapacityLab", "ModesLab", "PriorityLab", "SweepLab", "VarianceLab", "alternating_families",
           "batching_engine", "block_waste", "cache_aware_hit_rates", "drive", "dynamic_wait_effect", "exercises",
           "padding_waste", "random_requests", "takeaways", "utilization_split"]

# The exercise's static batch: output lengths of eight requests, one long one among short ones.
EXERCISE_LENGTHS = (12, 9, 31, 7, 120, 15, 10, 22)


def exercises(sweep: SweepLab) -> dict[str, Exercise]:
    """The chapter's 'Try this' exercises; answers computed by the package (and the sweep panel)."""
    lengths = list(EXERCISE_LENGTHS)
    return {
        "padding": Exercise(
            f"A static batch of 8 requests generates {lengths} tokens, padded to the longest: what share of the "
            "decode slots is padding?", lambda: padding_waste(lengths, 8)["waste_share"],
            why="8 slots x 120 steps are computed, of which only sum(lengths) = 226 tokens are wanted",
            hint="1 - sum(lengths) / (8 * max(lengths))", rel_tol=0.01),
        "capacity": Exercise(
            "A pool of 60 KV blocks of 16 tokens; every sequence needs 40 prompt + 24 output tokens. At most how "
            "many sequences run at once, whatever max_num_seqs says?", lambda: max_concurrency(60, 16, 64),
            why="64 tokens take 4 blocks, and 60 // 4 = 15", hint="blocks per sequence, then integer division",
            rel_tol=0.0),
        "block_waste": Exercise(
            "The 8 requests above each have a 32-token prompt. With block_size 128, what share of their reserved "
            "KV slots is never written?",
            lambda: float(block_waste([32 + n for n in lengths], (128,))["wasted_share"].iloc[0]),
            why="each sequence rounds up to whole blocks; with 128-token blocks most of each block stays empty",
            hint="block_waste(lengths, (128,))", rel_tol=0.01),
        "knee": Exercise(
            "In the sweep panel, at how many users does continuous batching reach its knee (90% of its best "
            "throughput)?", lambda: int(sweep.knees().loc["continuous", "concurrency"]),
            why="past the knee, more users add queueing (TTFT) but little throughput",
            hint="sweep.sweep, rows of mode 'continuous'", rel_tol=0.0),
    }


def _verdict(holds: bool, caveat: bool = False) -> str:
    return "wrong" if not holds else ("holds with a caveat" if caveat else "holds")


def takeaways(sweep: SweepLab, variance: VarianceLab, capacity: CapacityLab, hits: pd.DataFrame) -> pd.DataFrame:
    """The course's five key takeaways, each with what this notebook measured and a verdict computed from it."""
    cont = sweep.sweep[sweep.sweep["mode"] == "continuous"].sort_values("concurrency")
    low, high = cont.iloc[0], cont.iloc[-1]
    ratios, steps = variance.ratios(), variance.step_ratios()
    cap = capacity.table
    # Admission checks only the prompt's blocks, so a batch may briefly exceed the full-length bound and then
    # preempt: the claim holds if a small pool keeps the batch under max_num_seqs and a larger pool lifts it.
    bounded = bool(cap.iloc[0]["peak_batch"] < cap.iloc[0]["max_num_seqs"]
                   and cap["peak_batch"].is_monotonic_increasing)
    first, last = cap.iloc[0].map(int), cap.iloc[-1].map(int)  # counts (the frame's rows come back as floats)
    fcfs, aware = hits.loc["FCFS", "hit_rate"], hits.loc["cache-aware", "hit_rate"]
    k = sweep.knees().loc["continuous"]
    rows = [
        ("Batching raises utilization, but larger batches mean longer waits.",
         f"{int(low['concurrency'])} -> {int(high['concurrency'])} users: {low['output_tok_s']:.0f} -> "
         f"{high['output_tok_s']:.0f} tok/s, TTFT p99 {low['ttft_p99_ms']:.0f} -> {high['ttft_p99_ms']:.0f} ms",
         _verdict(high["output_tok_s"] > low["output_tok_s"] and high["ttft_p99_ms"] > low["ttft_p99_ms"])),
        ("Continuous batching removes static batching's structural waste.",
         # The verdict reads engine steps (the waste itself, free of a shared machine's clock noise).
         f"static / continuous engine steps: {steps['fixed']:.2f}x with equal output lengths, "
         f"{steps['log-uniform']:.2f}x with log-uniform ones (throughput {ratios['fixed']:.2f}x, "
         f"{ratios['log-uniform']:.2f}x)",
         _verdict(steps["log-uniform"] > 1.1, caveat=steps["fixed"] < 1.1)),
        ("KV cache size bounds the batch: max_num_seqs is capped by the blocks.",
         f"{first['num_blocks']} blocks: peak batch {first['peak_batch']} of max_num_seqs "
         f"{first['max_num_seqs']}; {last['num_blocks']} blocks: {last['peak_batch']}",
         _verdict(bounded)),
        ("Cache-aware scheduling raises cache hit rates.",
         f"one engine (not a fleet): hit rate {fcfs:.0%} FCFS -> {aware:.0%} cache-aware admission",
         _verdict(aware > fcfs, caveat=True)),
        ("Know where you sit on the throughput-latency frontier.",
         f"continuous knee at {int(k['concurrency'])} users, {k['output_tok_s']:.0f} tok/s, "
         f"TTFT p99 {k['ttft_p99_ms']:.0f} ms",
         _verdict(bool(k["concurrency"] < high["concurrency"] or high["ttft_p99_ms"] > low["ttft_p99_ms"]))),
    ]
    return pd.DataFrame(rows, columns=["the course says", "measured here", "verdict"])
