"""Chapter 4 lab: prefill vs decode, where the time goes, measured on this machine.

The notebook imports this module only. It gathers the panels (`workbench.lab.ch04_roofline`,
`workbench.lab.ch04_timing`), recomputes the course's numbers from the package (the decode floor of 7B and 70B
models from weight bytes and bandwidth, the streaming arithmetic), holds the chapter's "Try this" exercises,
and builds the closing table that checks each of the course's key takeaways against what the panels measured.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import weight_bytes
from workbench.config import ModelSpec
from workbench.lab.ch04_roofline import DecodeLab, RooflineLab
from workbench.lab.ch04_runs import NO_CHUNKING, STATIC
from workbench.lab.ch04_timing import ChunkedPrefillLab, StreamingLab, TtftLab, ttft_ratios
from workbench.lab.kit.exercises import Exercise
from workbench.models import model_spec
from workbench.roofline import DevicePeaks, count_step, decode_work, measure_peaks, prefill_work

__all__ = ["ChunkedPrefillLab", "DecodeLab", "RooflineLab", "StreamingLab", "TtftLab", "decode_floor_ms",
           "exercises", "measure_peaks", "ridge_batch", "ridge_prompt_length", "seed_decode_claims",
           "streaming_arithmetic", "takeaways"]

# The course's decode claims: (model config, what it says a decode step takes on "a fast GPU", in ms).
SEED_DECODE_CLAIMS = (("llama-2-7b", 20.0, 30.0), ("llama-3-70b", 150.0, 200.0))
# A100 80GB: ~2 TB/s, the figure the course's own playbook (seed 004) uses for its 70 ms floor of a 70B model.
A100_BYTES_PER_S = 2.0e12


def decode_floor_ms(spec: ModelSpec, bytes_per_s: float, *, dtype: torch.dtype = torch.bfloat16) -> float:
    """Least time of a batch-1 decode step: every weight read once at ``bytes_per_s`` (KV and compute left out)."""
    if bytes_per_s <= 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return weight_bytes(spec, dtype) / bytes_per_s * 1e3


def seed_decode_claims(peaks: DevicePeaks) -> pd.DataFrame:
    """The course's 7B and 70B decode step times beside the floors weight bytes allow, and the bandwidth the
    course's times imply (weights / claimed time)."""
    rows = []
    for name, low, high in SEED_DECODE_CLAIMS:
        spec = model_spec(name)
        weights = weight_bytes(spec, torch.bfloat16)
        rows.append({"model (bf16)": name, "weights GB": weights / 1e9, "seed says (ms)": f"{low:.0f}-{high:.0f}",
                     "floor here (ms)": decode_floor_ms(spec, peaks.bytes_per_s),
                     "floor at 2 TB/s (ms)": decode_floor_ms(spec, A100_BYTES_PER_S),
                     "implied TB/s": f"{weights / high * 1e3 / 1e12:.2f}-{weights / low * 1e3 / 1e12:.2f}"})
    return pd.DataFrame(rows).set_index("model (bf16)")


def streaming_arithmetic(tokens: int = 300, tokens_per_s: float = 20.0, buffered_s: float = 3.0) -> dict[str, float]:
    """The course's streaming example: ``tokens`` at ``tokens_per_s`` take tokens / rate seconds; the rate that
    would make that equal to ``buffered_s``."""
    if tokens < 1 or tokens_per_s <= 0 or buffered_s <= 0:
        raise ValueError(f"need tokens >= 1, tokens_per_s > 0, buffered_s > 0; got {tokens}, {tokens_per_s}, "
                         f"{buffered_s}")
    return {"streamed_s": tokens / tokens_per_s, "buffered_s": buffered_s, "rate_for_equal_s": tokens / buffered_s}


def ridge_batch(spec: ModelSpec, peaks: DevicePeaks, *, context: int = 64, dtype: torch.dtype = torch.float32,
                limit: int = 4096) -> int:
    """Smallest decode batch whose arithmetic intensity reaches the ridge point (``limit`` + 1 if none does)."""
    for batch in range(1, limit + 1):
        if count_step(spec, decode_work(batch, context), dtype=dtype).intensity >= peaks.ridge:
            return batch
    return limit + 1


def ridge_prompt_length(spec: ModelSpec, peaks: DevicePeaks, *, dtype: torch.dtype = torch.float32,
                        limit: int = 1 << 16) -> int:
    """Shortest prompt whose whole-prompt prefill reaches the ridge point: shorter prefills are bandwidth-bound
    too (``limit`` + 1 if none up to ``limit`` does)."""
    lo, hi = 1, limit + 1  # intensity grows with the prompt length: bisect for the first length at the ridge
    while lo < hi:
        mid = (lo + hi) // 2
        if count_step(spec, prefill_work(mid), dtype=dtype).intensity >= peaks.ridge:
            hi = mid
        else:
            lo = mid + 1
    return lo


def exercises(roofline: RooflineLab, ttft_alone: pd.DataFrame) -> dict[str, Exercise]:
    """The chapter's 'Try this' exercises; answers computed by the package from the panels' measurements
    (``ttft_alone``: the TTFT panel's frame with requests sent one at a time)."""
    spec, dtype = roofline.model.spec, roofline.model.dtype
    return {
        "floor_70b": Exercise(
            "Llama-3-70B in bf16 on a GPU that streams 2.0 TB/s: the least time of a batch-1 decode step, in ms?",
            lambda: decode_floor_ms(model_spec("llama-3-70b"), A100_BYTES_PER_S),
            why="every weight is read once per step: 70.6 G parameters × 2 bytes / 2.0e12 B/s",
            hint="weight_bytes(model_spec('llama-3-70b'), torch.bfloat16) / bandwidth", rel_tol=0.02),
        "decode_intensity": Exercise(
            f"Arithmetic intensity (FLOP per byte) of a batch-1 decode step of this model in "
            f"{str(dtype).removeprefix('torch.')} at context 64?",
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
            "The course's 'Try this': by what factor is the longest prompt's TTFT longer than the shortest's in "
            "the TTFT panel (one request at a time)?",
            lambda: ttft_ratios(ttft_alone)["ttft_ratio"],
            why="a short prompt still reads every weight once, so TTFT grows far less than the prompt length",
            hint="the TTFT column of the panel's table, longest over shortest", rel_tol=0.02),
    }


def _verdict(holds: bool, caveat: bool) -> str:
    return "wrong" if not holds else ("holds with a caveat" if caveat else "holds")


def takeaways(roofline: RooflineLab, decode: DecodeLab, ttft_alone: pd.DataFrame, ttft_burst: pd.DataFrame,
              chunked: ChunkedPrefillLab, streaming: StreamingLab) -> pd.DataFrame:
    """The course's five key takeaways, each with what this notebook measured and a verdict computed from it."""
    pts, ridge = roofline.points, roofline.peaks.ridge
    alone = ttft_ratios(ttft_alone)
    decode1 = pts[(pts["kind"] == "decode") & (pts["batch"] == 1)].iloc[0]
    prefills = pts[pts["kind"] == "prefill"]
    longest, shortest = prefills.iloc[-1], prefills.iloc[0]
    batch = decode.by_batch
    itl_growth = batch["step_s"].iloc[-1] / batch["step_s"].iloc[0]
    queued_share = ttft_ratios(ttft_burst)["shortest_queued_share"]
    table = chunked.summary()
    chunk = table.loc[chunked.reference_label()]
    stall_cut = table.loc[NO_CHUNKING, "max_itl_ms"] / chunk["max_itl_ms"]
    residual = chunk["max_itl_ms"] / chunk["mean_itl_ms"]  # the stall chunking leaves, in typical gaps
    static_wait = table.loc[STATIC, "long_ttft_ms"] / table.loc[NO_CHUNKING, "long_ttft_ms"]
    run = streaming.run
    rows = [
        ("Prefill is compute-bound; decode is memory-bandwidth-bound.",
         f"ridge {ridge:.1f} FLOP/B; batch-1 decode {decode1['intensity']:.2f} FLOP/B ({decode1['bound']}); "
         f"{int(longest['context']):,}-token prefill {longest['intensity']:.0f} FLOP/B ({longest['bound']}); "
         f"{int(shortest['context'])}-token prefill {shortest['intensity']:.1f} FLOP/B ({shortest['bound']})",
         _verdict(decode1["intensity"] < ridge < longest["intensity"], shortest["intensity"] < ridge)),
        ("TTFT is determined by prefill length; ITL by decode speed and batch composition.",
         f"TTFT {alone['ttft_ratio']:.1f}x for {alone['length_ratio']:.0f}x the prompt; in a burst "
         f"the shortest prompt spent {queued_share:.0%} of its TTFT queued; ITL {itl_growth:.1f}x from batch 1 to "
         f"{int(batch['batch'].iloc[-1])}",
         _verdict(ttft_alone["ttft_s"].is_monotonic_increasing and itl_growth > 1, queued_share > 0.5)),
        ("Chunked prefill prevents long prompts from stalling decode for other sequences.",
         f"decoders' max ITL {stall_cut:.1f}x lower with {chunk.name}, still {residual:.1f}x their mean gap; the "
         f"long prompt's TTFT {chunk['long_ttft_ms'] / table.loc[NO_CHUNKING, 'long_ttft_ms'] - 1:+.0%}",
         _verdict(stall_cut > 2, residual > 2 or chunk["long_ttft_ms"] > table.loc[NO_CHUNKING, "long_ttft_ms"])),
        ("Continuous batching improves utilization for variable-length workloads.",
         f"the long prompt joined the running batch at once; under static batching it waited, TTFT {static_wait:.1f}x "
         f"(while the decoders' max ITL was {table.loc[STATIC, 'max_itl_ms']:.0f} vs "
         f"{table.loc[NO_CHUNKING, 'max_itl_ms']:.0f} ms unchunked); throughput: chapter 5",
         _verdict(static_wait > 1.2, table.loc[STATIC, "max_itl_ms"] < table.loc[NO_CHUNKING, "max_itl_ms"])),
        ("Stream tokens: perceived latency improves even when total time is unchanged.",
         f"first text after {run.ttft_s * 1e3:.0f} ms streamed vs {run.buffered_total_s:.2f} s unstreamed "
         f"(totals {run.streamed_total_s:.2f} s vs {run.buffered_total_s:.2f} s)",
         _verdict(run.ttft_s < run.buffered_total_s / 2, run.streamed_total_s > 1.2 * run.buffered_total_s)),
    ]
    return pd.DataFrame(rows, columns=["the course says", "measured here", "verdict"])
