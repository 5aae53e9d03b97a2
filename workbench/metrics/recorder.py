"""What the engine measured, per request and per step, as pandas frames.

Every sequence carries its own timeline (arrival, first scheduled, each token's time, finish), stamped by the
engine with one clock; every step appends a ``StepRecord``. From these the recorder derives the latency
metrics the course talks about:

    TTFT   first token time - arrival            (queueing + prefill)
    ITL    gaps between consecutive tokens       (what a streaming reader feels)
    TPOT   (finish - first token) / (tokens - 1) (mean time per output token after the first)
    e2e    finish - arrival
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from workbench.spec.stats import SpecCounters

PERCENTILES = (50, 95, 99)


class FinishedSequence(Protocol):
    """What the recorder reads of a finished sequence (the engine's ``Sequence`` is one); it writes nothing."""

    @property
    def request_id(self) -> str: ...

    @property
    def seq_id(self) -> int: ...

    @property
    def arrival_time(self) -> float: ...

    @property
    def first_scheduled_time(self) -> float | None: ...

    @property
    def token_times(self) -> list[float]: ...  # when each output token became known

    @property
    def finish_time(self) -> float | None: ...

    @property
    def finish_reason(self) -> enum.Enum | None: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def num_cached_prompt_tokens(self) -> int: ...

    @property
    def num_preemptions(self) -> int: ...

    @property
    def spec(self) -> SpecCounters: ...


@dataclass(slots=True)
class StepRecord:
    step: int
    start_time: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache by admissions in this step
    preemptions: int
    num_drafted_tokens: int = 0  # speculative decoding: proposed this step
    num_accepted_tokens: int = 0

    @property
    def batch_size(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs


class MetricsRecorder:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.finished: list[FinishedSequence] = []

    def record_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def record_finished(self, seq: FinishedSequence) -> None:
        self.finished.append(seq)

    def reset(self) -> None:
        self.steps.clear()
        self.finished.clear()

    # ----------------------------------------------------------------------------------------------------
    def request_frame(self) -> pd.DataFrame:
        """One row per finished sequence with its timeline and derived latencies (seconds)."""
        rows = [_request_row(s) for s in self.finished]
        columns = ["request_id", "seq_id", "arrival", "first_scheduled", "first_token", "finish", "finish_reason",
                   "prompt_tokens", "output_tokens", "cached_prompt_tokens", "preemptions", "queue_time_s",
                   "ttft_s", "tpot_s", "e2e_s", "mean_itl_s", "max_itl_s", "drafted_tokens", "accepted_tokens",
                   "acceptance_rate", "alpha"]
        return pd.DataFrame(rows, columns=columns)

    def itl_frame(self) -> pd.DataFrame:
        """Long format: one row per output token after the first, with the gap before it."""
        rows = []
        for s in self.finished:
            for i, (a, b) in enumerate(zip(s.token_times, s.token_times[1:], strict=False), start=1):
                rows.append({"request_id": s.request_id, "seq_id": s.seq_id, "token_index": i, "time": b,
                             "itl_s": b - a})
        return pd.DataFrame(rows, columns=["request_id", "seq_id", "token_index", "time", "itl_s"])

    def step_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([asdict(r) for r in self.steps])
        if not frame.empty:
            frame["batch_size"] = frame["num_prefill_seqs"] + frame["num_decode_seqs"]
            frame["tokens"] = frame["num_prefill_tokens"] + frame["num_decode_tokens"]
        return frame

    def summary(self) -> pd.DataFrame:
        """p50/p95/p99 (and mean) of TTFT, ITL, TPOT, queue time and e2e, in milliseconds."""
        requests, itl = self.request_frame(), self.itl_frame()
        series = {"ttft_ms": requests["ttft_s"], "itl_ms": itl["itl_s"], "tpot_ms": requests["tpot_s"],
                  "queue_ms": requests["queue_time_s"], "e2e_ms": requests["e2e_s"]}
        rows = {}
        for name, values in series.items():
            values = values.dropna().to_numpy(dtype=float) * 1e3
            row = {f"p{p}": float(np.percentile(values, p)) if len(values) else float("nan") for p in PERCENTILES}
            row["mean"] = float(values.mean()) if len(values) else float("nan")
            rows[name] = row
        return pd.DataFrame(rows).T

    def spec_counters(self) -> SpecCounters:
        """Speculative-decoding counters summed over the finished sequences."""
        total = SpecCounters()
        for seq in self.finished:
            total.merge(seq.spec)
        return total

    def throughput(self) -> dict[str, float]:
        """Output tokens per second over the span from the first arrival to the last finish."""
        requests = self.request_frame()
        if requests.empty:
            return {"requests": 0, "output_tokens": 0, "seconds": 0.0, "output_tokens_per_s": float("nan")}
        span = float(requests["finish"].max() - requests["arrival"].min())
        tokens = int(requests["output_tokens"].sum())
        return {"requests": len(requests), "output_tokens": tokens, "seconds": span,
                "output_tokens_per_s": tokens / span if span > 0 else float("nan")}


def _request_row(s: FinishedSequence) -> dict:
    times = s.token_times
    first = times[0] if times else np.nan
    gaps = np.diff(times) if len(times) > 1 else np.array([])
    return {
        "request_id": s.request_id, "seq_id": s.seq_id, "arrival": s.arrival_time,
        "first_scheduled": s.first_scheduled_time, "first_token": first, "finish": s.finish_time,
        "finish_reason": s.finish_reason.value if s.finish_reason else None, "prompt_tokens": s.num_prompt_tokens,
        "output_tokens": s.num_output_tokens, "cached_prompt_tokens": s.num_cached_prompt_tokens,
        "preemptions": s.num_preemptions,
        "queue_time_s": (s.first_scheduled_time - s.arrival_time) if s.first_scheduled_time else np.nan,
        "ttft_s": first - s.arrival_time,
        "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else np.nan,
        "e2e_s": (s.finish_time - s.arrival_time) if s.finish_time else np.nan,
        "mean_itl_s": float(gaps.mean()) if len(gaps) else np.nan,
        "max_itl_s": float(gaps.max()) if len(gaps) else np.nan,
        "drafted_tokens": s.spec.drafted, "accepted_tokens": s.spec.accepted,
        "acceptance_rate": s.spec.acceptance_rate, "alpha": s.spec.alpha,
    }
