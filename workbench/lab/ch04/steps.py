"""Chapter 4's engine steps as result objects: prefill and decode steps on the device's roofline
(`roofline_steps` -> `RooflineSteps`, whose ``baseline()`` is the chapter's prefill and decode cost) and decode
steps against batch size and context with their bandwidth floor (`decode_sweep` -> `DecodeSweep`).

The timing is `workbench.roofline`'s: each step measured from the engine's own step record after an uncounted
warm-up run; prefills of fewer than 512 tokens the fastest of two runs, a decode step the median of several.
No widgets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.config import ModelSpec
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.evidence import TIMING_FLOOR
from workbench.lab.kit.notebook import dtype_name
from workbench.progress import ProgressFn, no_progress
from workbench.roofline import (
    DevicePeaks,
    measure_decode_steps,
    measure_peaks,
    measure_prefill_steps,
    place_on_roofline,
)
from workbench.timing import describe_machine

BASELINE_PROMPT = 1024  # the prompt length the chapter's prefill cost is stated at (ch01 states it there too)


@dataclass(frozen=True)
class RooflineSteps:
    """Whole-prompt prefill steps by prompt length and pure decode steps by batch, placed under ``peaks``."""

    points: pd.DataFrame  # `place_on_roofline` rows: kind, batch, context, step_s, intensity, bound, ...
    peaks: DevicePeaks
    spec: ModelSpec
    machine: str
    dtype: str

    def point(self, kind: str, value: int) -> pd.Series:
        """The measured step of ``kind`` ('prefill': by prompt length, 'decode': by batch size)."""
        rows = self.points[self.points["kind"] == kind]
        rows = rows[rows["context" if kind == "prefill" else "batch"] == value]
        if rows.empty:
            measured = self.points[["kind", "batch", "context"]].to_dict("records")
            raise ValueError(f"no {kind} step measured at {value}; measured: {measured}")
        return rows.iloc[0]

    @property
    def prefills(self) -> pd.DataFrame:
        return self.points[self.points["kind"] == "prefill"]

    @property
    def decode_one(self) -> pd.Series:
        """The batch-1 decode step."""
        return self.point("decode", 1)

    @property
    def shortest_prefill(self) -> pd.Series:
        return self.prefills.iloc[0]

    @property
    def longest_prefill(self) -> pd.Series:
        return self.prefills.iloc[-1]

    @property
    def baseline_prompt(self) -> int:
        """The prompt length the prefill cost is read at: 1,024 tokens when measured, else the longest."""
        lengths = list(self.prefills["context"])
        return BASELINE_PROMPT if BASELINE_PROMPT in lengths else int(lengths[-1])

    @property
    def decode_step_ms(self) -> float:
        return float(self.decode_one["step_s"] * 1e3)

    @property
    def prefill_ms_per_token(self) -> float:
        return float(self.point("prefill", self.baseline_prompt)["step_s"] * 1e3 / self.baseline_prompt)

    @property
    def phases_split(self) -> bool:
        """The book's claim as measured: batch-1 decode left of the ridge, the longest prefill right of it."""
        return bool(self.decode_one["intensity"] < self.peaks.ridge < self.longest_prefill["intensity"])

    def baseline(self) -> Baseline:
        one = self.decode_one
        return Baseline(chapter="ch04", machine=self.machine, dtype=self.dtype,
                        source=f"section 2's roofline: engine steps after an uncounted warm-up run; prefill = one "
                               f"whole-prompt step of {self.baseline_prompt:,} tokens / its tokens, decode = the "
                               f"median pure decode step at batch 1, context {int(one['context'])}",
                        decode_step_ms=self.decode_step_ms, prefill_ms_per_token=self.prefill_ms_per_token,
                        prefill_tokens=self.baseline_prompt)


def roofline_steps(model, peaks: DevicePeaks | None, lengths: Sequence[int], batches: Sequence[int], context: int,
                   *, peak_options: dict | None = None, progress: ProgressFn = no_progress) -> RooflineSteps:
    """Measure the peaks (when ``peaks`` is None), then time prefill steps by prompt length and decode steps by batch
    at ``context``."""
    if peaks is None:
        progress(0, 3, "measuring peak FLOP/s and bandwidth")
        peaks = measure_peaks(model.device, model.dtype, **(peak_options or {}))
    progress(1, 3, "timing prefill steps")
    prefill = measure_prefill_steps(model, lengths)
    progress(2, 3, "timing decode steps")
    decode = measure_decode_steps(model, batches, [context])
    points = place_on_roofline(pd.concat([prefill, decode], ignore_index=True), peaks)
    return RooflineSteps(points, peaks, model.spec, describe_machine(model.device), dtype_name(model.dtype))


@dataclass(frozen=True)
class DecodeSweep:
    """Decode steps against batch size (at one context) and against context (batch 1), with bytes / bandwidth."""

    by_batch: pd.DataFrame
    by_context: pd.DataFrame
    peaks: DevicePeaks

    @property
    def itl_growth(self) -> float:
        """The largest batch's step time over batch 1's."""
        return float(self.by_batch["step_s"].iloc[-1] / self.by_batch["step_s"].iloc[0])

    @property
    def largest_batch(self) -> int:
        return int(self.by_batch["batch"].iloc[-1])

    @property
    def throughput_gain(self) -> float:
        """Tokens per second at the largest batch over batch 1's."""
        return self.largest_batch / self.itl_growth

    def batch_noise(self) -> str:
        """Which batch sizes cost the same step within the machine's noise (``TIMING_FLOOR`` around batch 1's,
        or overlapping timed-step ranges), read from the sweep: a curve that dips between them is noise."""
        b, one = self.by_batch, self.by_batch.iloc[0]
        low, high = one["step_s"] * (1 - TIMING_FLOOR), one["step_s"] * (1 + TIMING_FLOOR)
        same = [int(r["batch"]) for _, r in b.iterrows()
                if r.get("step_max_s", r["step_s"]) >= low and r.get("step_min_s", r["step_s"]) <= high]
        apart = [int(r["batch"]) for _, r in b.iterrows() if int(r["batch"]) not in same]
        return (f"batches {', '.join(map(str, same))} cost batch 1's step within the noise (±{TIMING_FLOOR:.0%}, or "
                f"overlapping ranges of their timed steps, {one['step_s'] * 1e3:.1f} ms at batch 1): an up-and-down "
                "between them is the machine's noise, not the model"
                + (f"; the step grows clearly from batch {apart[0]}" if apart else ""))

    @property
    def floor_ratio(self) -> float:
        """Batch 1's measured step over its bandwidth floor."""
        one = self.by_batch.iloc[0]
        return float(one["step_s"] / one["bandwidth_floor_s"])


def decode_sweep(model, peaks: DevicePeaks, batches: Sequence[int], context: int, contexts: Sequence[int], *,
                 steps: int = 4, progress: ProgressFn = no_progress) -> DecodeSweep:
    by_batch = place_on_roofline(measure_decode_steps(model, batches, [context], steps=steps, progress=progress),
                                 peaks)
    by_context = place_on_roofline(measure_decode_steps(model, [1], contexts, steps=steps, progress=progress), peaks)
    for frame in (by_batch, by_context):
        frame["bytes_kv"] = frame["bytes_kv_read"] + frame["bytes_kv_written"]
        frame["bandwidth_floor_s"] = frame["bytes"] / peaks.bytes_per_s
    return DecodeSweep(by_batch, by_context, peaks)
