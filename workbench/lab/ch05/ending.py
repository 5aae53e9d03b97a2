"""Chapter 5's 'Try this' exercises and its closing table, computed from the chapter's result objects."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.cache.sizing import max_concurrency
from workbench.lab.ch05.claims import block_waste
from workbench.lab.ch05.runs import BatchCapacity, ConcurrencySweep, VarianceEffect, padding_waste
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise

# The exercise's static batch: output lengths of eight requests, one long one among short ones.
EXERCISE_LENGTHS = (12, 9, 31, 7, 120, 15, 10, 22)


def continuous_knee(sweep: ConcurrencySweep) -> int | str:
    """Continuous batching's knee in users, or 'none' when its throughput still grew at the sweep's last step."""
    k = sweep.knee("continuous")
    return "none" if k is None else int(k["concurrency"])


def exercises(sweep: ConcurrencySweep) -> dict[str, Exercise]:
    """The chapter's 'Try this' exercises; answers computed by the package (and the sweep's result)."""
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
            f"The 8 requests of exercise 7.3 (outputs {lengths}) each have a 32-token prompt. With block_size 128, "
            "what share of their reserved KV slots is never written?",
            lambda: float(block_waste([32 + n for n in lengths], (128,))["wasted_share"].iloc[0]),
            why="each sequence rounds up to whole blocks; with 128-token blocks most of each block stays empty",
            hint="block_waste(lengths, (128,))", rel_tol=0.01),
        "knee": Exercise(
            "In the sweep panel, at how many users does continuous batching reach its knee (the first concurrency "
            f"after which the next level adds less than {sweep.gain:.0%} throughput)? ('none' if it never does)",
            lambda: continuous_knee(sweep),
            why="past the knee, more users add queueing (TTFT) but little throughput",
            hint="sweep.result.curve('continuous'), column next_gain", rel_tol=0.0),
    }


def _ttfts(row: pd.Series) -> list[float]:
    return list(row["ttft_ms_all"]) if isinstance(row.get("ttft_ms_all"), list) else [float(row["ttft_p90_ms"])]


def _p90(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.9))


def closing_table(sweep: ConcurrencySweep, variance: VarianceEffect, capacity: BatchCapacity,
                  hits: pd.DataFrame, *, sweep_contention: Contention | None = None) -> ClosingTable:
    """The book's five key takeaways, each with what this notebook measured and a verdict computed from it.

    ``sweep_contention``: the concurrency sweep panel's reading (``panel.contention``). The two rows judged from
    the sweep's timings (throughput and TTFT against users; the frontier) say "the machine was busy" instead of
    concluding when it was busy; the rows from step counts, peak batches and hit rates do not depend on it."""
    cont = sweep.curve("continuous")
    low, high = cont.iloc[0], cont.iloc[-1]
    ratios, steps = variance.ratios, variance.step_ratios
    first, last = capacity.row(0), capacity.row(-1)
    fcfs, aware = float(hits.loc["FCFS", "hit_rate"]), float(hits.loc["cache-aware", "hit_rate"])
    knees, k = sweep.knees(), sweep.knee("continuous")
    caps = {c.name: c.value for c in sweep.mode_caps("continuous")}
    rows = [
        busy_takeaway(Takeaway.judged(
            "Batching raises utilization, but larger batches mean longer waits.",
            f"continuous batching, {int(low['concurrency'])} -> {int(high['concurrency'])} users: "
            f"{low['output_tok_s']:.0f} -> {high['output_tok_s']:.0f} output tok/s, TTFT p90 "
            f"{low['ttft_p90_ms']:.0f} -> {high['ttft_p90_ms']:.0f} ms ({sweep.requests} requests per run)",
            [Evidence.repeats(f"output tok/s, {int(high['concurrency'])} / {int(low['concurrency'])} users",
                              [high["output_tok_s"]], [low["output_tok_s"]], n_label="run of each", settings=caps),
             Evidence.bootstrap(f"TTFT p90, {int(high['concurrency'])} / {int(low['concurrency'])} users",
                                _ttfts(high), _ttfts(low), stat=_p90)],
            wrong_note="throughput did not rise with the batch, or TTFT did not grow with it, here"), sweep_contention),
        Takeaway.judged(
            "Continuous batching removes static batching's structural waste.",
            f"static / continuous engine steps: {steps['fixed']:.2f}x with equal output lengths, "
            f"{steps['log-uniform']:.2f}x with log-uniform ones (throughput {ratios['fixed']:.2f}x, "
            f"{ratios['log-uniform']:.2f}x)",
            # Engine steps are the waste itself, free of a shared machine's clock noise.
            Evidence.exact("engine steps, static / continuous, log-uniform lengths", float(steps["log-uniform"]), 1.0,
                           n=variance.requests, n_label=f"{variance.requests} requests (step counts)"),
            caveat=bool(steps["fixed"] < 1.1),
            caveat_note="the waste is padding to the batch's longest member: it exists only when output lengths "
                        "differ; with equal lengths the two modes take the same steps",
            wrong_note="continuous batching took no fewer steps than static with unequal output lengths"),
        Takeaway.judged(
            "KV cache size bounds the batch: max_num_seqs is capped by the blocks.",
            f"{first['num_blocks']} blocks: peak batch {first['peak_batch']} of max_num_seqs "
            f"{first['max_num_seqs']}; {last['num_blocks']} blocks: {last['peak_batch']}",
            [Evidence.exact("peak batch on the smallest pool / max_num_seqs",
                            first["peak_batch"] / first["max_num_seqs"], 1.0, expect="below", n_label="step counts",
                            settings={"max_num_seqs": first["max_num_seqs"]}),
             Evidence.exact("peak batch, largest / smallest pool", last["peak_batch"] / first["peak_batch"], 1.0,
                            n_label="step counts")],
            wrong_note="the smallest pool did not hold the batch below max_num_seqs"),
        Takeaway.judged(
            "Cache-aware scheduling raises cache hit rates.",
            f"one engine (not a fleet): hit rate {fcfs:.0%} FCFS -> {aware:.0%} cache-aware admission",
            Evidence.exact("hit rate, cache-aware minus FCFS", aware - fcfs, 0.0, n_label="token counts", unit="pts"),
            caveat=True,
            caveat_note="measured on one engine's queue with a workload built for it (two prefix families, a pool "
                        "that holds one); the book's fleet-level routing is chapter 9's",
            wrong_note="cache-aware admission did not raise the hit rate here"),
        busy_takeaway(frontier_takeaway(sweep, knees, k), sweep_contention),
    ]
    return ClosingTable(rows)


def frontier_takeaway(sweep: ConcurrencySweep, knees: pd.DataFrame, k: pd.Series | None) -> Takeaway:
    claim = "Know where you sit on the throughput-latency frontier."
    others = "; ".join(f"{m} {int(r['concurrency'])}" if r["reached"] else f"{m} none"
                       for m, r in knees.iterrows() if m != "continuous")
    limit = sweep.knee_limit("continuous")
    if k is None:
        last = knees.loc["continuous", "last_gain"]
        return Takeaway(claim, f"continuous throughput still grew {last:.0%} at the sweep's last step "
                               f"({sweep.concurrencies[-1]} users); knees of the other modes: {others}",
                        Verdict.NOT_MEASURABLE,
                        note="the sweep stopped before saturation, so there is no knee to sit beside: sweep further",
                        evidence=(Evidence.absent("a knee inside the sweep"),))
    cont = sweep.curve("continuous")
    top = cont.iloc[-1]
    past_gain = top["output_tok_s"] / k["output_tok_s"] - 1
    ttft_growth = top["ttft_p90_ms"] / k["ttft_p90_ms"]
    return Takeaway.judged(
        claim,
        f"continuous knee at {int(k['concurrency'])} users ({k['output_tok_s']:.0f} tok/s, TTFT p90 "
        f"{k['ttft_p90_ms']:.0f} ms); from there to {int(top['concurrency'])} users throughput changed "
        f"{past_gain:+.0%} while TTFT p90 grew {ttft_growth:.1f}x; knees of the other modes (users): {others}; "
        f"{limit.sentence()}",
        Evidence.bootstrap(f"TTFT p90 past the knee, {int(top['concurrency'])} / {int(k['concurrency'])} users",
                           _ttfts(top), _ttfts(k), stat=_p90,
                           settings={c.name: c.value for c in limit.caps}),
        caveat=limit.set_by_cap,
        caveat_note=f"the knee here is the configuration's, not the hardware's: {limit.sentence()}",
        wrong_note="TTFT did not grow past the knee in this sweep")
