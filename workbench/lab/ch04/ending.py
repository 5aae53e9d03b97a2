"""Chapter 4's ending: 'Try this' exercises whose answers the package computes, and the closing table that sets
each of the book's five key takeaways beside what the chapter measured and a verdict.

Every verdict is computed from the chapter's results (`RooflineSteps`, `DecodeSweep`, two `TTFTSweep`s,
`ScheduleSweep`, `StreamRun`) by the thresholds written next to each one, so a rerun on another machine can
reach a different verdict and say so.
"""

from __future__ import annotations

from workbench.lab.ch04.arithmetic import SEED_GPU, ridge_batch, ridge_prompt_length
from workbench.lab.ch04.runs import NO_CHUNKING, STATIC, ScheduleSweep, TTFTSweep
from workbench.lab.ch04.steps import DecodeSweep, RooflineSteps
from workbench.lab.ch04.streaming import SAME_TOTAL, StreamRun
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.lab.kit.feasibility import DEVICES, smallest_feasible
from workbench.roofline import count_step, decode_work

# A decode batch this large is within what serving engines run (vLLM's default max_num_seqs is 256): if decode
# turns compute-bound below it, "decode is bandwidth-bound" needs the batch size said with it.
SERVING_BATCH = 256
STALL_CUT = 2.0  # chunking "prevents" the stall if the decoders' worst gap is at least this many times lower
STATIC_WAIT = 1.2  # static batching makes the newcomer wait if its TTFT is at least this many times longer


def exercises(roofline: RooflineSteps, ttft_alone: TTFTSweep) -> dict[str, Exercise]:
    """The chapter's 'Try this' exercises; answers computed by the package from the measurements (``roofline``:
    the roofline panel's result, ``ttft_alone``: the TTFT panel's with requests sent one at a time)."""
    spec, dtype = roofline.spec, roofline.dtype
    return {
        "floor_70b": Exercise(
            f"Llama-3-70B in bf16 on {SEED_GPU} GPUs (80 GiB, {DEVICES[SEED_GPU].bytes_per_s / 1e12:.2f} TB/s each): "
            "its 141 GB of weights need two of them (tensor parallel 2). The least time of a batch-1 decode step, "
            "in ms?",
            lambda: smallest_feasible("llama-3-70b", SEED_GPU).decode_floor_ms,
            why="each GPU reads its half of the weights once per step, in parallel: 70.6 G parameters × 2 bytes "
                "÷ 2 GPUs ÷ 2.04e12 B/s. On one GPU the model does not fit, so the one-GPU figure (twice this) "
                "describes no deployment",
            hint="smallest_feasible('llama-3-70b', 'A100 80GB') in workbench.lab.kit.feasibility", rel_tol=0.02),
        "decode_intensity": Exercise(
            f"Arithmetic intensity (FLOP per byte) of a batch-1 decode step of this model in {dtype} at context 64?",
            lambda: count_step(spec, decode_work(1, 64), dtype=dtype).intensity,
            why="about 2 FLOPs per weight for each weight read once: 2 / bytes per weight, a little less with KV",
            hint="count_step(model.spec, decode_work(1, 64), dtype=model.dtype)", rel_tol=0.05),
        "ridge_batch": Exercise(
            "From which decode batch size on is a decode step of this model (context 64) compute-bound on this "
            "device, by the measured ridge point?",
            lambda: ridge_batch(spec, roofline.peaks, dtype=dtype),
            why="intensity grows about linearly with the batch (the weights are read once for all sequences) "
                "until it crosses the ridge", hint="compare count_step(...).intensity with roofline.peaks.ridge",
            rel_tol=0.0),
        "ttft_ratio": Exercise(
            "The book's 'Try this': by what factor is the longest prompt's TTFT longer than the shortest's in "
            "the TTFT panel (one request at a time)?",
            lambda: ttft_alone.ttft_ratio,
            why="a short prompt still reads every weight once, so TTFT grows far less than the prompt length",
            hint="the TTFT column of the panel's table, longest over shortest", rel_tol=0.02),
    }


def _phases(roofline: RooflineSteps) -> Takeaway:
    ridge, one = roofline.peaks.ridge, roofline.decode_one
    longest, shortest = roofline.longest_prefill, roofline.shortest_prefill
    batch = ridge_batch(roofline.spec, roofline.peaks, dtype=roofline.dtype)
    length = ridge_prompt_length(roofline.spec, roofline.peaks, dtype=roofline.dtype)
    caveat = shortest["intensity"] < ridge or batch <= SERVING_BATCH or length > 1
    # Intensities are counts; the ridge is measured (its probes' spread is far below these factors).
    evidence = [Evidence.exact("longest prefill's intensity / the ridge", longest["intensity"] / ridge, 1.0,
                               n_label="counted FLOPs and bytes, measured ridge"),
                Evidence.exact("batch-1 decode's intensity / the ridge", one["intensity"] / ridge, 1.0, expect="below",
                               n_label="counted FLOPs and bytes, measured ridge")]
    return Takeaway.judged(
        "Prefill is compute-bound; decode is memory-bandwidth-bound.",
        f"ridge {ridge:.1f} FLOP/B; batch-1 decode {one['intensity']:.2f} FLOP/B ({one['bound']}-bound); "
        f"{int(longest['context']):,}-token prefill {longest['intensity']:.0f} FLOP/B ({longest['bound']}-bound); "
        f"{int(shortest['context'])}-token prefill {shortest['intensity']:.1f} FLOP/B ({shortest['bound']}-bound)",
        evidence, caveat=caveat,
        caveat_note=f"the boundary is a width, not a phase: on this device a prefill of fewer than {length:,} tokens "
                    f"is bandwidth-bound too, and decode turns compute-bound from batch {batch:,} (context 64); a "
                    "GPU's ridge is far higher, so there the same split holds to far larger batches",
        wrong_note="batch-1 decode and the longest prefill are not on opposite sides of this device's ridge point")


def _decode_spread(decode: DecodeSweep, row: int) -> list[float]:
    one = decode.by_batch.iloc[row]
    return [float(one.get("step_min_s", one["step_s"])), float(one["step_s"]), float(one.get("step_max_s",
                                                                                            one["step_s"]))]


def _latencies(alone: TTFTSweep, burst: TTFTSweep, decode: DecodeSweep) -> Takeaway:
    queued = burst.shortest_queued_share
    ttft = Evidence.repeats(f"TTFT at {alone.longest:,} / at {alone.shortest:,} tokens, one at a time",
                            [alone.ttft_long_ms], [alone.ttft_short_ms], n_label="requests")
    itl = Evidence.repeats(f"decode step at batch {decode.largest_batch} / at batch 1", _decode_spread(decode, -1),
                           _decode_spread(decode, 0), n_label="timed steps (min, median, max)")
    return Takeaway.judged(
        "TTFT is determined by prefill length; ITL by decode speed and batch composition.",
        f"alone, TTFT grew {alone.ttft_ratio:.1f}x for {alone.length_ratio:.0f}x the prompt; in a burst the "
        f"{burst.shortest}-token prompt spent {queued:.0%} of its TTFT queued; a decode step (the ITL) grew "
        f"{decode.itl_growth:.1f}x from batch 1 to {decode.largest_batch}",
        [ttft, itl], caveat=queued > 0.5,
        caveat_note="under load TTFT is queueing plus prefill, and the queue dominated for the short prompt",
        wrong_note="TTFT did not grow with the prompt, or the decode step did not grow with the batch, in this run")


def _chunking(sweep: ScheduleSweep) -> Takeaway:
    chunk = sweep.row(sweep.reference_label)
    caveat = sweep.residual_stall > 2 or sweep.ttft_cost > 0
    return Takeaway.judged(
        "Chunked prefill prevents long prompts from stalling decode for other sequences.",
        f"the decoders' worst gap was {sweep.row(NO_CHUNKING)['max_itl_ms']:,.0f} ms without chunking and "
        f"{chunk['max_itl_ms']:,.0f} ms with {sweep.reference_label} ({sweep.stall_cut:.1f}x lower), still "
        f"{sweep.residual_stall:.1f}x their mean gap; the long prompt's TTFT {sweep.ttft_cost:+.0%}",
        Evidence.repeats("decoders' worst gap, unchunked / chunked", [sweep.stall_cut], null=STALL_CUT,
                         n_label="run of each", unit="x"),
        caveat=caveat,
        caveat_note="it bounds the stall to about one chunk's compute rather than preventing it, and the long "
                    "prompt pays in TTFT",
        wrong_note=f"chunking cut the worst gap by less than {STALL_CUT:.0f}x here")


def _continuous(sweep: ScheduleSweep) -> Takeaway:
    static, off = sweep.row(STATIC), sweep.row(NO_CHUNKING)
    return Takeaway(
        "Continuous batching improves utilization for variable-length workloads.",
        f"the long prompt joined the running batch at once; under static batching it waited for the batch, TTFT "
        f"{sweep.static_wait:.1f}x (while the decoders' worst gap was {static['max_itl_ms']:,.0f} vs "
        f"{off['max_itl_ms']:,.0f} ms unchunked)",
        Verdict.NOT_MEASURABLE,
        note="not measured here: utilization is chapter 5's measurement; this chapter shows the newcomer's wait, "
             "which the workload's short decoders set" + ("; static batching spared the running decoders the stall"
                                                         if static["max_itl_ms"] < off["max_itl_ms"] else ""),
        evidence=(Evidence.repeats("the newcomer's TTFT, static / continuous", [sweep.static_wait],
                                   null=STATIC_WAIT, n_label="run of each", unit="x"),))


def _streaming(run: StreamRun) -> Takeaway:
    streamed = run.rounds[run.rounds["mode"] == "streamed"]
    buffered = run.rounds[run.rounds["mode"] == "buffered"]
    return Takeaway.judged(
        "Stream tokens: perceived latency improves even when total time is unchanged.",
        f"first text after {run.ttft_s * 1e3:,.0f} ms streamed vs {run.buffered_total_s:.2f} s unstreamed; totals "
        f"{run.streamed_total_s:.2f} s streamed vs {run.buffered_total_s:.2f} s buffered ({run.total_ratio:.2f}x, "
        f"fastest of alternating rounds); the uncounted first run (fresh engine, live text box) took "
        f"{run.cold_total_s:.2f} s, {run.first_run_penalty:+.0%} over the fastest streamed round",
        Evidence.repeats("unstreamed wait / streamed first text", buffered["total_s"].tolist(),
                         streamed["ttft_s"].tolist(), null=2.0, n_label="rounds"),
        caveat=not run.same_total,
        caveat_note=f"the totals differ by more than {SAME_TOTAL:.0%} here ({run.total_ratio:.2f}x)",
        wrong_note="the first streamed text came no sooner than half the unstreamed wait")


def timing_baseline(decode: DecodeSweep, alone: TTFTSweep, machine: str, dtype: str) -> Baseline:
    """Sections 3 and 4's figures for the cross-chapter registry: the batch-16 decode step and a miss's TTFT."""
    sixteen = decode.by_batch[decode.by_batch["batch"] == 16]
    return Baseline(chapter="ch04", machine=machine, dtype=dtype,
                    source=f"section 3's decode steps (median of the timed pure decode steps, context "
                           f"{int(decode.by_batch['context'].iloc[0])}) and section 4's TTFT of the "
                           f"{alone.longest:,}-token prompt sent alone (prefix caching off, chunked at 512)",
                    decode_step_b16_ms=float(sixteen["step_s"].iloc[0]) * 1e3 if len(sixteen) else None,
                    ttft_miss_ms=alone.ttft_long_ms, ttft_tokens=alone.longest)


def closing_table(roofline: RooflineSteps, decode: DecodeSweep, ttft_alone: TTFTSweep, ttft_burst: TTFTSweep,
                  chunked: ScheduleSweep, streaming: StreamRun, *, roofline_contention: Contention | None = None,
                  decode_contention: Contention | None = None, alone_contention: Contention | None = None,
                  burst_contention: Contention | None = None, chunked_contention: Contention | None = None,
                  streaming_contention: Contention | None = None) -> ClosingTable:
    """The book's chapter-4 takeaways, what this chapter measured for each, and a computed verdict.

    The ``*_contention`` arguments are the panels' readings (``panel.contention``) of the runs each result came
    from (the TTFT panel's two runs each their own): every row here is judged from timings (the ridge point is
    measured too), so a row whose reading was busy says "the machine was busy" instead of concluding."""
    return ClosingTable([
        busy_takeaway(_phases(roofline), roofline_contention),
        busy_takeaway(_latencies(ttft_alone, ttft_burst, decode), alone_contention, burst_contention,
                      decode_contention),
        busy_takeaway(_chunking(chunked), chunked_contention),
        busy_takeaway(_continuous(chunked), chunked_contention),
        busy_takeaway(_streaming(streaming), streaming_contention)])
