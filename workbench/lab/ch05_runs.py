"""Chapter 5's measurements: batching modes under load, the throughput-latency frontier, its knee, goodput,
output-length variance, capacity against ``max_num_seqs``, and padding waste of static batches.

Every function here runs the real engine (through `workbench.bench.drive.drive`) or computes from a
workload; the panels in `workbench.lab.ch05_panels` only draw what these return.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pandas as pd

from workbench.bench.drive import LoadRun, drive
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import WorkloadRequest

ProgressFn = Callable[[int, int, str], None]


def _quiet(_done: int, _total: int, _text: str = "") -> None:
    return None


def random_requests(n: int, *, prompt_tokens: int = 32, output_tokens: tuple[int, int] = (4, 32),
                    seed: int = 0, spread: str = "log-uniform", vocab_size: int = 49152) -> list[WorkloadRequest]:
    """Random-token prompts of a fixed length and forced output lengths in ``output_tokens``: ``log-uniform``
    (many short, a few long), ``uniform`` or ``fixed`` (every request the rounded mean). Token ids stay below
    ``vocab_size`` and away from the first 100 (special tokens in SmolLM2's vocabulary)."""
    if n < 1:
        raise ValueError(f"the number of requests must be >= 1, got {n}")
    lo, hi = output_tokens
    if not 1 <= lo <= hi:
        raise ValueError(f"output_tokens must be (lo, hi) with 1 <= lo <= hi, got {output_tokens}")
    rng = random.Random(seed)
    draws = {"log-uniform": lambda: lo * (hi / lo) ** rng.random(), "uniform": lambda: rng.uniform(lo, hi),
             "fixed": lambda: (lo + hi) / 2}
    if spread not in draws:
        raise ValueError(f"spread must be one of {sorted(draws)}, got {spread!r}")
    low, high = min(100, vocab_size // 2), min(30000, vocab_size)
    return [WorkloadRequest([rng.randrange(low, high) for _ in range(prompt_tokens)], int(round(draws[spread]())),
                            ignore_eos=True, tags={"shape": spread}) for _ in range(n)]


def summary_row(run: LoadRun, **labels) -> dict:
    s = run.summary
    return {**labels, "output_tok_s": s["output_throughput"], "requests_per_s": s["request_throughput"],
            "ttft_p50_ms": s["ttft_median_ms"], "ttft_p99_ms": s["ttft_p99_ms"], "tpot_p50_ms": s["tpot_median_ms"],
            "tpot_p99_ms": s["tpot_p99_ms"], "e2e_p50_ms": s["e2e_median_ms"], "e2e_p99_ms": s["e2e_p99_ms"],
            "goodput_req_s": s.get("goodput", math.nan), "good_share": s.get("good_requests", math.nan)
            / max(s["completed"], 1), "duration_s": s["duration_s"]}


def concurrency_sweep(make_target: Callable[[str], LLMEngine | str], workload: list[WorkloadRequest],
                      modes: tuple[str, ...], concurrencies: tuple[int, ...], *, slo: dict[str, float] | None = None,
                      progress: ProgressFn = _quiet) -> pd.DataFrame:
    """Closed-loop runs of ``workload`` for every (mode, concurrency): one row each (throughput, p50/p99)."""
    rows, total = [], len(modes) * len(concurrencies)
    for mode in modes:
        for users in concurrencies:
            progress(len(rows), total, f"{mode}, {users} users")
            run = drive(make_target(mode), workload, concurrency=users, slo=slo)
            # Per-request TTFTs kept so a panel can re-read goodput under another SLO without re-running.
            rows.append({**summary_row(run, mode=mode, concurrency=users),
                         "ttft_ms_all": (run.requests["ttft_s"] * 1e3).tolist()})
    progress(total, total, "done")
    return pd.DataFrame(rows)


def knee(sweep: pd.DataFrame, *, x: str = "concurrency", share: float = 0.9) -> pd.Series:
    """The knee of one mode's curve: the lowest load reaching ``share`` of the best throughput measured.
    Past it, more load buys little throughput and only adds latency (queueing)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    ordered = sweep.sort_values(x)
    best = ordered["output_tok_s"].max()
    return ordered[ordered["output_tok_s"] >= share * best].iloc[0]


def goodput_load(sweep: pd.DataFrame, *, x: str = "concurrency", share: float = 0.9) -> float:
    """The largest load at which at least ``share`` of the requests met the SLO (NaN if none did)."""
    ok = sweep[sweep["good_share"] >= share]
    return float(ok[x].max()) if len(ok) else math.nan


def variance_effect(make_engine: Callable[[str], LLMEngine], n: int, output_tokens: tuple[int, int], *,
                    users: int, seed: int = 0, vocab_size: int = 49152, progress: ProgressFn = _quiet) -> pd.DataFrame:
    """Static vs continuous throughput as output lengths spread out while their range stays the same."""
    rows = []
    spreads = ("fixed", "uniform", "log-uniform")
    for i, spread in enumerate(spreads):
        workload = random_requests(n, output_tokens=output_tokens, seed=seed, spread=spread, vocab_size=vocab_size)
        lengths = np.array([r.max_tokens for r in workload])
        for mode in ("static", "continuous"):
            progress(2 * i + (mode == "continuous"), 2 * len(spreads), f"{spread}, {mode}")
            run = drive(make_engine(mode), workload, concurrency=users)
            # Steps (forward passes) are counted beside the clock: they do not depend on a shared machine's noise.
            rows.append({**summary_row(run, spread=spread, mode=mode, output_cv=float(lengths.std() / lengths.mean())),
                         "steps": len(run.steps)})
    progress(1, 1, "done")
    return pd.DataFrame(rows)


def capacity_run(make_engine: Callable[[int], LLMEngine], workload: list[WorkloadRequest],
                 pool_sizes: tuple[int, ...], *, progress: ProgressFn = _quiet) -> pd.DataFrame:
    """How many sequences actually run together as the KV pool shrinks under a fixed ``max_num_seqs``."""
    rows = []
    for i, num_blocks in enumerate(pool_sizes):
        progress(i, len(pool_sizes), f"{num_blocks} blocks")
        engine = make_engine(num_blocks)
        run = drive(engine, workload, concurrency=len(workload))
        size = engine.cache_config.block_size
        blocks_per_seq = max(-(-(len(r.prompt) + r.max_tokens) // size) for r in workload)
        rows.append({"num_blocks": num_blocks, "max_num_seqs": engine.scheduler_config.max_num_seqs,
                     "blocks_per_seq": blocks_per_seq, "bound": min(num_blocks // blocks_per_seq,
                                                                      engine.scheduler_config.max_num_seqs),
                     "peak_batch": int(run.steps["batch_size"].max()),
                     "mean_decode_batch": float(run.steps["num_decode_seqs"].mean()),
                     "preemptions": int(run.requests["preemptions"].sum()),
                     "output_tok_s": run.summary["output_throughput"]})
    progress(1, 1, "done")
    return pd.DataFrame(rows)


def padding_waste(lengths: list[int], batch_size: int) -> dict[str, float]:
    """Token slots a padded static batch computes vs the tokens that matter (packing computes only those).

    Batches are taken in order; each is padded to its longest member, as a dense [batch, max_len] tensor is."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    useful = int(sum(lengths))
    padded = sum(len(lengths[i:i + batch_size]) * max(lengths[i:i + batch_size])
                 for i in range(0, len(lengths), batch_size))
    return {"useful_tokens": useful, "padded_slots": padded, "waste_share": 1 - useful / padded if padded else 0.0}
