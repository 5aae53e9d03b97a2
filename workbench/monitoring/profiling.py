"""Profiling engine steps: time per named range of the step and per operator, and a trace file.

    engine.add_request(...)                      # give it work first
    prof = profile_steps(engine, 8, trace_path="step_trace.json")
    prof.ranges        # schedule / draft / prepare / forward / sample / verify / postprocess: ms, share of step
    prof.operators     # torch operators by self time
    # open step_trace.json in https://ui.perfetto.dev or chrome://tracing

The ranges are the ones `workbench.metrics.step_ranges` opens in the engine (only while a profiler runs).
Their time is exclusive: ``postprocess`` excludes the ``sample`` and ``verify`` ranges nested inside it, so
the ranges add up to the step (``coverage`` says how close; the remainder is the step's own Python between
ranges). On CUDA, ranges are CPU wall time: kernels run asynchronously, so ``forward`` is the launch time and
the wait lands in whichever range first synchronizes (``sample``, which reads tokens back); the CUDA column of
``operators`` is the device time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from workbench.engine.llm_engine import LLMEngine
from workbench.metrics.step_ranges import PREFIX, STEP_RANGES


@dataclass(slots=True)
class StepProfile:
    ranges: pd.DataFrame  # one row per step range: calls, ms (exclusive), ms_per_step, share of the step
    operators: pd.DataFrame  # torch operators: calls, self CPU ms, total CPU ms (and CUDA ms on CUDA)
    num_steps: int
    step_ms: float  # wall time of the profiled steps, measured around engine.step()
    trace_path: Path | None

    @property
    def coverage(self) -> float:
        """The ranges' total time over the measured step time (1.0: they account for all of it)."""
        return float(self.ranges["ms"].sum()) / self.step_ms if self.step_ms > 0 else float("nan")


def _range_table(events, num_steps: int, step_ms: float) -> pd.DataFrame:
    totals = {name: [0, 0.0] for name in STEP_RANGES}
    for event in events:
        # On CUDA each range also appears as a device-side annotation of the same name: count the CPU one only.
        if not event.name.startswith(PREFIX) or event.device_type != DeviceType.CPU:
            continue
        nested = sum(child.time_range.elapsed_us() for child in event.cpu_children if child.name.startswith(PREFIX))
        entry = totals[event.name[len(PREFIX):]]
        entry[0] += 1
        entry[1] += (event.time_range.elapsed_us() - nested) / 1000
    table = pd.DataFrame([(name, calls, ms) for name, (calls, ms) in totals.items()], columns=["range", "calls", "ms"])
    table["ms_per_step"] = table["ms"] / max(num_steps, 1)
    table["share"] = table["ms"] / step_ms if step_ms > 0 else float("nan")
    return table


def _operator_table(prof, cuda: bool, top: int) -> pd.DataFrame:
    rows = []
    for avg in prof.key_averages():
        if avg.key.startswith(PREFIX) or avg.key.startswith("ProfilerStep"):
            continue
        row = {"operator": avg.key, "calls": avg.count, "self_cpu_ms": avg.self_cpu_time_total / 1000,
               "cpu_total_ms": avg.cpu_time_total / 1000}
        if cuda:
            row["device_ms"] = getattr(avg, "self_device_time_total", 0.0) / 1000
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    sort_by = "device_ms" if cuda else "self_cpu_ms"
    return table.sort_values(sort_by, ascending=False).head(top).reset_index(drop=True)


def profile_steps(engine: LLMEngine, num_steps: int, *, trace_path: str | Path | None = None,
                  record_shapes: bool = False, top_operators: int = 15) -> StepProfile:
    """Run ``num_steps`` engine steps under ``torch.profiler`` (stops early when the engine runs out of work);
    the engine must already hold requests."""
    if not (isinstance(num_steps, int) and 1 <= num_steps <= 10_000):
        raise ValueError(f"num_steps must be an integer in [1, 10000], got {num_steps!r}")
    if not engine.has_unfinished_requests():
        raise ValueError("the engine has no requests to step: add some before profiling")
    cuda = engine.model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps, step_s = 0, 0.0
    with profile(activities=activities, record_shapes=record_shapes) as prof:
        while steps < num_steps and engine.has_unfinished_requests():
            began = time.perf_counter()
            engine.step()
            if cuda:
                torch.cuda.synchronize()
            step_s += time.perf_counter() - began
            steps += 1
    path = None
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    step_ms = step_s * 1000
    return StepProfile(_range_table(prof.events(), steps, step_ms), _operator_table(prof, cuda, top_operators),
                       steps, step_ms, path)
