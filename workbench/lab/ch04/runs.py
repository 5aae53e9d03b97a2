"""Chapter 4's engine runs as result objects: TTFT by prompt length (`ttft_sweep` -> `TTFTSweep`) and a long prompt
landing among decoders under several schedules (`schedule_sweep` -> `ScheduleSweep`).

Each function drives the real engine (`workbench.engine.LLMEngine`, through `workbench.bench.run_workload` where
arrival times matter); the panels (`workbench.lab.ch04.panels_timing`) draw the results and the closing table
(`workbench.lab.ch04.ending`) judges them. Prompts are random token ids with forced output lengths
(``ignore_eos``) wherever lengths must be exact, and the prefix cache is off wherever a hit would hide the work
being measured. No widgets here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.bench import run_workload
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.progress import ProgressFn, no_progress
from workbench.workloads import WorkloadRequest, long_prompt_among_decoders

ARRIVALS = ("one at a time", "burst, longest first")
# The chunked-prefill scenario of benchmarks/bench_chunked_prefill.py: four decoders, a 1,024-token prompt at
# 0.5 s, a token budget of chunk + 32 per step (the benchmark's 160 for chunks of 128).
LONG_PROMPT, NUM_DECODERS, ARRIVAL_S, BUDGET_ABOVE_CHUNK = 1024, 4, 0.5, 32
NO_CHUNKING, STATIC = "no chunking", "static batching"
# The benchmark's decoders produce 64 tokens; 32 keep them running through the slowest (chunks of 64) prefill, whose
# 16 steps begin after ~10 tokens, for half the run time. `ScheduleRun.summary` reports whether they did.
DECODER_TOKENS = 32


def _pool(tokens: int, block_size: int = 16) -> CacheConfig:
    """A KV pool just big enough (allocating the default 1 GiB per run would cost more than some runs)."""
    return CacheConfig(block_size=block_size, num_blocks=-(-tokens // block_size) + 64, enable_prefix_caching=False)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 30000) for _ in range(n)]


@dataclass(frozen=True)
class TTFTSweep:
    """TTFT per prompt length (one row per request, shortest first), split into queued and computing seconds."""

    frame: pd.DataFrame  # prompt_tokens, ttft_s, queued_s, computing_s
    arrivals: str  # one of ARRIVALS

    @property
    def shortest(self) -> int:
        return int(self.frame["prompt_tokens"].iloc[0])

    @property
    def longest(self) -> int:
        return int(self.frame["prompt_tokens"].iloc[-1])

    @property
    def ttft_short_ms(self) -> float:
        return float(self.frame["ttft_s"].iloc[0] * 1e3)

    @property
    def ttft_long_ms(self) -> float:
        return float(self.frame["ttft_s"].iloc[-1] * 1e3)

    @property
    def length_ratio(self) -> float:
        return self.longest / self.shortest

    @property
    def ttft_ratio(self) -> float:
        """Longest prompt's TTFT over the shortest's."""
        return self.ttft_long_ms / self.ttft_short_ms

    @property
    def shortest_queued_share(self) -> float:
        """The share of the shortest prompt's TTFT it spent queued."""
        first = self.frame.iloc[0]
        return float(first["queued_s"] / first["ttft_s"])

    @property
    def grows_with_prompt(self) -> bool:
        return bool(self.frame["ttft_s"].is_monotonic_increasing)


def ttft_sweep(model, lengths: Sequence[int], *, arrivals: str = ARRIVALS[0], budget: int = 512, seed: int = 0,
               progress: ProgressFn = no_progress) -> TTFTSweep:
    """TTFT of one request per prompt length, split into time queued (arrival to admission) and computing
    (admission to first token). ``arrivals``: each request alone, or all at once with the longest first."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be non-empty and >= 1, got {list(lengths)}")
    rng = random.Random(seed)
    engine = LLMEngine(model, None, cache_config=_pool(sum(lengths) + 64),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=len(lengths)))
    run_workload(engine, [WorkloadRequest(_ids(rng, 8), 1, ignore_eos=True)], realtime=False, progress=False)
    requests = [WorkloadRequest(_ids(rng, n), 1, ignore_eos=True) for n in sorted(lengths, reverse=True)]
    if arrivals == ARRIVALS[0]:
        frames = []
        for i, request in enumerate(reversed(requests)):
            progress(i, len(requests), f"prefill of {len(request.prompt):,} tokens")
            frames.append(run_workload(engine, [request], realtime=False, progress=False, chat=False).requests)
        frame = pd.concat(frames, ignore_index=True)
    else:
        progress(0, 1, f"{len(requests)} prompts arriving together")
        frame = run_workload(engine, requests, realtime=False, progress=False, chat=False).requests
    frame = frame.sort_values("prompt_tokens").reset_index(drop=True)
    progress(len(requests), len(requests), f"{len(requests)} requests, {arrivals}")
    return TTFTSweep(pd.DataFrame({"prompt_tokens": frame["prompt_tokens"], "ttft_s": frame["ttft_s"],
                                   "queued_s": frame["queue_time_s"],
                                   "computing_s": frame["ttft_s"] - frame["queue_time_s"]}), arrivals)


@dataclass(slots=True)
class ScheduleRun:
    """One replay of the long-prompt-among-decoders workload, times in seconds from the first arrival."""

    label: str
    requests: pd.DataFrame  # one row per request: role, arrival, first_scheduled, first_token, finish, ttft_s, ...
    tokens: pd.DataFrame  # one row per output token: request, role, time
    steps: pd.DataFrame  # one row per engine step: start, duration_s, prefill and decode tokens

    def summary(self) -> dict[str, float]:
        """The decoders' worst and mean gaps, the long prompt's TTFT, and whether every decoder was still running
        when the long prompt's first token came (else the run could not show the stall in full)."""
        decoders = self.requests[self.requests["role"] == "decoder"]
        long_row = self.requests[self.requests["role"] == "long_prompt"].iloc[0]
        return {"max_itl_ms": float(decoders["max_itl_s"].max() * 1e3),
                "mean_itl_ms": float(decoders["mean_itl_s"].mean() * 1e3),
                "long_ttft_ms": float(long_row["ttft_s"] * 1e3), "steps": len(self.steps),
                "decoders_outlasted_prefill": bool(decoders["finish"].min() > long_row["first_token"])}


def scheduler_for(label: str | int) -> SchedulerConfig:
    """The scheduler of one configuration: chunks of ``label`` tokens, no chunking, or static batching."""
    if label == NO_CHUNKING:
        return SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048)
    if label == STATIC:
        return SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048, batching="static")
    if not isinstance(label, int) or label < 1:
        raise ValueError(f"a configuration is a chunk size >= 1, {NO_CHUNKING!r} or {STATIC!r}; got {label!r}")
    return SchedulerConfig(enable_chunked_prefill=True, max_num_batched_tokens=label + BUDGET_ABOVE_CHUNK,
                           max_prefill_chunk=label)


def schedule_run(model, label: str | int, *, decoder_tokens: int = DECODER_TOKENS,
                 long_prompt: int = LONG_PROMPT) -> ScheduleRun:
    """Replay the workload in real time under one configuration (`scheduler_for`)."""
    workload = long_prompt_among_decoders(NUM_DECODERS, long_prompt=long_prompt, decoder_tokens=decoder_tokens,
                                          arrival_s=ARRIVAL_S)
    engine = LLMEngine(model, None, cache_config=_pool(long_prompt + NUM_DECODERS * (32 + decoder_tokens) + 64),
                       scheduler_config=scheduler_for(label))
    result = run_workload(engine, workload, realtime=True, progress=False, chat=False)
    requests = result.requests
    origin = float(requests["arrival"].min())
    for column in ("arrival", "first_scheduled", "first_token", "finish"):
        requests[column] = requests[column] - origin
    names = {rid: (f"decoder {i + 1}" if role == "decoder" else "long prompt")
             for i, (rid, role) in enumerate(zip(requests["request_id"], requests["role"], strict=True))}
    requests.insert(0, "name", requests["request_id"].map(names))
    first = requests[["name", "role", "first_token"]].rename(columns={"first_token": "time"})
    later = result.itl.assign(name=result.itl["request_id"].map(names), time=result.itl["time"] - origin)
    later["role"] = later["request_id"].map(dict(zip(requests["request_id"], requests["role"], strict=True)))
    tokens = pd.concat([first, later[["name", "role", "time"]]], ignore_index=True).sort_values("time")
    steps = result.steps.assign(start=result.steps["start_time"] - origin)
    return ScheduleRun(schedule_label(label), requests,
                       tokens.reset_index(drop=True), steps)


def warm_up(model) -> None:
    """One short request, so the first timed run does not pay one-off start-up costs."""
    engine = LLMEngine(model, None, cache_config=_pool(128))
    run_workload(engine, [WorkloadRequest(_ids(random.Random(1), 16), 4, ignore_eos=True)], realtime=False,
                 progress=False, chat=False)


def schedule_label(key: str | int) -> str:
    return key if isinstance(key, str) else f"chunks of {key}"


@dataclass(frozen=True)
class ScheduleSweep:
    """`schedule_run` under no chunking, each chunk size and static batching, with the summary the chapter reads."""

    runs: dict[str | int, ScheduleRun]
    chunks: tuple[int, ...]
    long_prompt: int

    def summary(self) -> pd.DataFrame:
        """One row per configuration: the decoders' max and mean ITL, the long prompt's TTFT, steps."""
        rows = [{"schedule": schedule_label(key), **run.summary()} for key, run in self.runs.items()]
        return pd.DataFrame(rows).set_index("schedule")

    @property
    def reference_label(self) -> str:
        """The chunked configuration the chapter quotes: chunks of 128 (the benchmark's), else the first."""
        return schedule_label(128 if 128 in self.chunks else self.chunks[0])

    def row(self, label: str) -> pd.Series:
        return self.summary().loc[label]

    @property
    def stall_cut(self) -> float:
        """How many times lower the decoders' worst gap is with the reference chunks than without chunking."""
        return self.row(NO_CHUNKING)["max_itl_ms"] / self.row(self.reference_label)["max_itl_ms"]

    @property
    def residual_stall(self) -> float:
        """The worst gap chunking leaves, in the decoders' mean gaps."""
        chunk = self.row(self.reference_label)
        return chunk["max_itl_ms"] / chunk["mean_itl_ms"]

    @property
    def ttft_cost(self) -> float:
        """The long prompt's TTFT with the reference chunks over without chunking, minus 1."""
        return self.row(self.reference_label)["long_ttft_ms"] / self.row(NO_CHUNKING)["long_ttft_ms"] - 1

    @property
    def static_wait(self) -> float:
        """The long prompt's TTFT under static batching over without chunking."""
        return self.row(STATIC)["long_ttft_ms"] / self.row(NO_CHUNKING)["long_ttft_ms"]

    @property
    def decoders_outlasted(self) -> bool:
        """Whether every decoder outlived the long prompt's prefill in every run but static batching."""
        return bool(self.summary().drop(index=STATIC)["decoders_outlasted_prefill"].all())


def schedule_sweep(model, chunks: Sequence[int], *, decoder_tokens: int = DECODER_TOKENS,
                   long_prompt: int = LONG_PROMPT, progress: ProgressFn = no_progress) -> ScheduleSweep:
    """`schedule_run` with no chunking, each chunk size and static batching, after one warm-up."""
    warm_up(model)
    labels = [NO_CHUNKING, *chunks, STATIC]
    runs = {}
    for i, label in enumerate(labels):
        progress(i, len(labels), f"replaying with {schedule_label(label)}")
        runs[label] = schedule_run(model, label, decoder_tokens=decoder_tokens, long_prompt=long_prompt)
    progress(len(labels), len(labels), f"{len(labels)} replays")
    return ScheduleSweep(runs, tuple(chunks), long_prompt)
