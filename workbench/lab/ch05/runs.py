"""Chapter 5's measurements as result objects: batching modes under load, the throughput-latency frontier and its
knee, goodput, output-length variance, capacity against ``max_num_seqs``, and padding waste of static batches.

- `modes_run` → `ModesRun`: the three modes on one workload, closed loop, with each run's per-request rows;
- `concurrency_sweep` → `ConcurrencySweep`: closed-loop runs per (mode, concurrency), each row with its TTFT
  percentiles computed from the run's own requests (p90 of ``requests``, never a p99 of a dozen), the knee of
  each mode (the first concurrency after which more users buy less than ``gain`` more throughput) and goodput;
- `variance_effect` → `VarianceEffect`: static vs continuous as output lengths spread out (throughput, steps);
- `capacity_run` → `BatchCapacity`: the largest batch measured as the KV pool shrinks under ``max_num_seqs``;
- `padding_waste`: slots a padded static batch computes against the tokens wanted (arithmetic).

Every function here runs the real engine (through `workbench.bench.drive.drive`) or computes from a workload;
the panels only draw what these return. No widgets here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workbench.bench.drive import MODES, LoadRun, drive
from workbench.bench.synthetic import random_requests
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.caps import Cap, Limit
from workbench.progress import ProgressFn, no_progress
from workbench.workloads import WorkloadRequest


def summary_row(run: LoadRun, **labels) -> dict:
    """One run's throughput and latency percentiles, computed from its requests: p50, p90 and the max (with
    a few dozen requests a "p99" is the slowest request under another name, so the table says max)."""
    s, r = run.summary, run.requests
    row = {**labels, "requests": len(r), "output_tok_s": s["output_throughput"],
           "requests_per_s": s["request_throughput"], "duration_s": s["duration_s"]}
    for column in ("ttft", "tpot", "e2e"):
        values = r[f"{column}_s"].dropna() * 1e3
        row |= {f"{column}_p50_ms": float(values.median()) if len(values) else math.nan,
                f"{column}_p90_ms": float(values.quantile(0.9)) if len(values) else math.nan,
                f"{column}_max_ms": float(values.max()) if len(values) else math.nan}
    return row


# ------------------------------------------------------------------------------------------ three modes
@dataclass(frozen=True)
class ModesRun:
    """The three batching modes on the same requests: one `LoadRun` each and their summary table."""

    runs: dict[str, LoadRun]
    users: int

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame([summary_row(r, mode=m) for m, r in self.runs.items()]).set_index("mode")

    @property
    def continuous_over_static(self) -> float:
        t = self.table
        return float(t.loc["continuous", "output_tok_s"] / t.loc["static", "output_tok_s"])


def modes_run(make_engine: Callable[[str], LLMEngine], workload: list[WorkloadRequest], *, users: int,
              progress: ProgressFn = no_progress) -> ModesRun:
    runs = {}
    for i, mode in enumerate(MODES):
        progress(i, len(MODES), mode)
        runs[mode] = drive(make_engine(mode), workload, concurrency=users)
    progress(len(MODES), len(MODES), "done")
    return ModesRun(runs, users)


# ------------------------------------------------------------------------------------------ the sweep
@dataclass(frozen=True)
class ConcurrencySweep:
    """Closed-loop runs per (mode, concurrency). The knee of a mode is computed, never assumed: the first
    concurrency after which the next level adds less than ``gain`` throughput. A mode whose throughput still
    grows by ``gain`` or more at the last step has no knee inside the sweep (``knee`` returns None)."""

    frame: pd.DataFrame  # mode, concurrency, output_tok_s, ttft_p50/p90/max_ms, ..., ttft_ms_all
    gain: float = 0.10
    caps: dict[str, tuple[Cap, ...]] = field(default_factory=dict)  # per mode, the limits its engine ran under

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(self.frame["mode"]))

    @property
    def concurrencies(self) -> list[int]:
        return sorted(int(c) for c in self.frame["concurrency"].unique())

    @property
    def requests(self) -> int:
        return int(self.frame["requests"].min())

    def curve(self, mode: str) -> pd.DataFrame:
        rows = self.frame[self.frame["mode"] == mode].sort_values("concurrency").reset_index(drop=True)
        return rows.assign(next_gain=rows["output_tok_s"].shift(-1) / rows["output_tok_s"] - 1)

    def knee(self, mode: str) -> pd.Series | None:
        curve = self.curve(mode)
        flat = curve[curve["next_gain"] < self.gain]
        return flat.iloc[0] if len(flat) else None

    def knees(self) -> pd.DataFrame:
        """One row per mode: the knee's concurrency, throughput and TTFT (NaN where the sweep found none), and
        the throughput gain of the sweep's last step."""
        rows = []
        for mode in self.modes:
            k, curve = self.knee(mode), self.curve(mode)
            row = {"mode": mode, "reached": k is not None, "last_gain": float(curve["next_gain"].iloc[-2])
                   if len(curve) > 1 else math.nan}
            for col in ("concurrency", "output_tok_s", "ttft_p50_ms", "ttft_p90_ms", "next_gain"):
                row[col] = float(k[col]) if k is not None else math.nan
            rows.append(row)
        return pd.DataFrame(rows).set_index("mode")

    def mode_caps(self, mode: str) -> tuple[Cap, ...]:
        """The caps a mode's runs were configured with, and the sweep's last level (a cap on any knee too)."""
        return (*self.caps.get(mode, ()), Cap("the sweep's last level (users)", self.concurrencies[-1]))

    def knee_limit(self, mode: str) -> Limit:
        """The mode's knee checked against its caps: a knee at or past a cap is the configuration's."""
        k = self.knee(mode)
        return Limit(f"{mode} batching's knee", math.nan if k is None else float(k["concurrency"]), "users",
                     self.mode_caps(mode))

    def knee_sentence(self) -> str:
        """Every mode's knee, with what sets it (a cap, or the hardware and workload below every cap)."""
        return "; ".join(self.knee_limit(mode).sentence() for mode in self.modes)

    def good_share(self, ttft_slo_ms: float) -> pd.Series:
        """Share of requests within the TTFT SLO, per row, from the per-request TTFTs each run kept."""
        return self.frame["ttft_ms_all"].map(lambda v: float(np.mean(np.asarray(v) <= ttft_slo_ms)))

    def goodput_users(self, ttft_slo_ms: float, share: float = 0.9) -> dict[str, float]:
        """Per mode, the most users at which at least ``share`` of the requests met the SLO (NaN: never)."""
        good = self.frame.assign(good=self.good_share(ttft_slo_ms))
        return {m: float(g[g["good"] >= share]["concurrency"].max()) if (g["good"] >= share).any() else math.nan
                for m, g in good.groupby("mode")}


def engine_caps(engine: LLMEngine | str, mode: str) -> tuple[Cap, ...]:
    """The batch caps a local engine runs ``mode`` under (a URL's are unknown here: none)."""
    if isinstance(engine, str):
        return ()
    config = engine.scheduler_config
    caps = [Cap("max_num_seqs", config.max_num_seqs)]
    if mode == "dynamic":
        caps.append(Cap("dynamic_batch_size", config.dynamic_batch_size))
    return tuple(caps)


def concurrency_sweep(make_target: Callable[[str], LLMEngine | str], workload: list[WorkloadRequest],
                      modes: tuple[str, ...], concurrencies: tuple[int, ...], *, gain: float = 0.10,
                      progress: ProgressFn = no_progress) -> ConcurrencySweep:
    """Closed-loop runs of ``workload`` for every (mode, concurrency): one row each (throughput, percentiles),
    and the caps each mode's engine ran under."""
    rows, total, caps = [], len(modes) * len(concurrencies), {}
    for mode in modes:
        for users in concurrencies:
            progress(len(rows), total, f"{mode}, {users} users")
            target = make_target(mode)
            caps[mode] = engine_caps(target, mode)
            run = drive(target, workload, concurrency=users)
            # Per-request TTFTs kept so the SLO can be re-read without re-running.
            rows.append({**summary_row(run, mode=mode, concurrency=users),
                         "ttft_ms_all": (run.requests["ttft_s"] * 1e3).tolist()})
    progress(total, total, "done")
    return ConcurrencySweep(pd.DataFrame(rows), gain, caps)


# ------------------------------------------------------------------------------------------ variance
@dataclass(frozen=True)
class VarianceEffect:
    """Static vs continuous per output-length spread: throughput and engine steps (the clock-free measure)."""

    frame: pd.DataFrame
    users: int
    requests: int

    def _wide(self, column: str) -> pd.DataFrame:
        return self.frame.pivot(index="spread", columns="mode", values=column).reindex(
            ["fixed", "uniform", "log-uniform"])

    @property
    def ratios(self) -> pd.Series:
        """Continuous / static output tokens/s, per spread (a ratio of timings)."""
        wide = self._wide("output_tok_s")
        return wide["continuous"] / wide["static"]

    @property
    def step_ratios(self) -> pd.Series:
        """Static's engine steps over continuous's, per spread (counts)."""
        wide = self._wide("steps")
        return wide["static"] / wide["continuous"]


def variance_effect(make_engine: Callable[[str], LLMEngine], n: int, output_tokens: tuple[int, int], *,
                    users: int, seed: int = 0, vocab_size: int = 49152,
                    progress: ProgressFn = no_progress) -> VarianceEffect:
    """Static vs continuous throughput as output lengths spread out while their range stays the same."""
    rows = []
    spreads = ("fixed", "uniform", "log-uniform")
    for i, spread in enumerate(spreads):
        workload = random_requests(n, output_tokens=output_tokens, seed=seed, spread=spread, vocab_size=vocab_size)
        lengths = np.array([r.max_tokens for r in workload])
        for mode in ("static", "continuous"):
            progress(2 * i + (mode == "continuous"), 2 * len(spreads), f"{spread}, {mode}")
            run = drive(make_engine(mode), workload, concurrency=users)
            rows.append({**summary_row(run, spread=spread, mode=mode, output_cv=float(lengths.std() / lengths.mean())),
                         "steps": len(run.steps)})
    progress(1, 1, "done")
    return VarianceEffect(pd.DataFrame(rows), users, n)


# ------------------------------------------------------------------------------------------ capacity
@dataclass(frozen=True)
class BatchCapacity:
    """Per pool size: ``max_num_seqs``, blocks per sequence, the bound, and the largest batch measured."""

    frame: pd.DataFrame

    def row(self, i: int) -> dict[str, int]:
        return {k: int(v) for k, v in self.frame.iloc[i].items() if k in (
            "num_blocks", "max_num_seqs", "blocks_per_seq", "bound", "peak_batch", "preemptions")}

    @property
    def bounded(self) -> bool:
        """The smallest pool keeps the batch under ``max_num_seqs`` and a larger pool lifts it (admission checks
        only the prompt's blocks, so a batch may briefly exceed the full-length bound and then preempt)."""
        t = self.frame
        return bool(t.iloc[0]["peak_batch"] < t.iloc[0]["max_num_seqs"] and t["peak_batch"].is_monotonic_increasing
                    and t.iloc[-1]["peak_batch"] > t.iloc[0]["peak_batch"])


def capacity_run(make_engine: Callable[[int], LLMEngine], workload: list[WorkloadRequest],
                 pool_sizes: tuple[int, ...], *, progress: ProgressFn = no_progress) -> BatchCapacity:
    """How many sequences actually run together as the KV pool shrinks under a fixed ``max_num_seqs``."""
    rows = []
    for i, num_blocks in enumerate(pool_sizes):
        progress(i, len(pool_sizes), f"{num_blocks} blocks")
        engine = make_engine(num_blocks)
        run = drive(engine, workload, concurrency=len(workload))
        size, max_seqs = engine.cache_config.block_size, engine.scheduler_config.max_num_seqs
        blocks_per_seq = max(-(-(len(r.prompt) + r.max_tokens) // size) for r in workload)
        rows.append({"num_blocks": num_blocks, "max_num_seqs": max_seqs, "blocks_per_seq": blocks_per_seq,
                     "bound": min(num_blocks // blocks_per_seq, max_seqs),
                     "peak_batch": int(run.steps["batch_size"].max()),
                     "mean_decode_batch": float(run.steps["num_decode_seqs"].mean()),
                     "preemptions": int(run.requests["preemptions"].sum()),
                     "output_tok_s": run.summary["output_throughput"]})
    progress(1, 1, "done")
    return BatchCapacity(pd.DataFrame(rows))


def padding_waste(lengths: list[int], batch_size: int) -> dict[str, float]:
    """Token slots a padded static batch computes vs the tokens that matter (packing computes only those).

    Batches are taken in order; each is padded to its longest member, as a dense [batch, max_len] tensor is."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    useful = int(sum(lengths))
    padded = sum(len(lengths[i:i + batch_size]) * max(lengths[i:i + batch_size])
                 for i in range(0, len(lengths), batch_size))
    return {"useful_tokens": useful, "padded_slots": padded, "waste_share": 1 - useful / padded if padded else 0.0}
