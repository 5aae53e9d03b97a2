"""Chapter 4's engine runs: TTFT by prompt length, a long prompt landing among decoders, and a streamed request.

Each function drives the real engine (`workbench.engine.LLMEngine`, through `workbench.bench.run_workload` where
arrival times matter) and returns pandas frames; `workbench.lab.ch04_timing` turns them into figures. Prompts
are random token ids with forced output lengths (``ignore_eos``) wherever lengths must be exact, and the prefix
cache is off wherever a hit would hide the work being measured.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.bench import run_workload
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import WorkloadRequest, long_prompt_among_decoders

Progress = Callable[[int, int, str], None]
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


def ttft_sweep(model, lengths: Sequence[int], *, arrivals: str = ARRIVALS[0], budget: int = 512, seed: int = 0,
               progress: Progress | None = None) -> pd.DataFrame:
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
            if progress is not None:
                progress(i, len(requests), f"prefill of {len(request.prompt):,} tokens")
            frames.append(run_workload(engine, [request], realtime=False, progress=False, chat=False).requests)
        frame = pd.concat(frames, ignore_index=True)
    else:
        if progress is not None:
            progress(0, 1, f"{len(requests)} prompts arriving together")
        frame = run_workload(engine, requests, realtime=False, progress=False, chat=False).requests
    frame = frame.sort_values("prompt_tokens").reset_index(drop=True)
    return pd.DataFrame({"prompt_tokens": frame["prompt_tokens"], "ttft_s": frame["ttft_s"],
                         "queued_s": frame["queue_time_s"], "computing_s": frame["ttft_s"] - frame["queue_time_s"]})


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
    return ScheduleRun(str(label) if isinstance(label, str) else f"chunks of {label}", requests,
                       tokens.reset_index(drop=True), steps)


def warm_up(model) -> None:
    """One short request, so the first timed run does not pay one-off start-up costs."""
    engine = LLMEngine(model, None, cache_config=_pool(128))
    run_workload(engine, [WorkloadRequest(_ids(random.Random(1), 16), 4, ignore_eos=True)], realtime=False,
                 progress=False, chat=False)


def schedule_sweep(model, labels: Sequence[str | int], *, decoder_tokens: int = DECODER_TOKENS,
                   long_prompt: int = LONG_PROMPT, progress: Progress | None = None) -> dict[str | int, ScheduleRun]:
    """`schedule_run` for each configuration, after one warm-up."""
    warm_up(model)
    runs = {}
    for i, label in enumerate(labels):
        if progress is not None:
            progress(i, len(labels), f"replaying with {label if isinstance(label, str) else f'chunks of {label}'}")
        runs[label] = schedule_run(model, label, decoder_tokens=decoder_tokens, long_prompt=long_prompt)
    return runs


@dataclass(slots=True)
class StreamRun:
    text: str
    arrivals: pd.DataFrame  # one row per streamed delta: seconds since the request, tokens seen so far, text
    ttft_s: float
    streamed_total_s: float
    buffered_total_s: float  # the same request without streaming: nothing to read until it is all done
    same_text: bool


def stream_vs_buffered(engine: LLMEngine, prompt: str, max_tokens: int, *,
                       on_text: Callable[[str], None] | None = None) -> StreamRun:
    """Stream one greedy request (``on_text`` sees the text so far after every delta), then run it unstreamed."""
    params = SamplingParams(max_tokens=max_tokens)
    rows, text = [], ""
    start = time.perf_counter()
    for output in engine.stream(prompt, params):
        now = time.perf_counter() - start
        delta = output.outputs[0]
        text += delta.new_text
        rows.append({"seconds": now, "tokens_seen": len(delta.token_ids), "new_text": delta.new_text})
        if on_text is not None:
            on_text(text)
    streamed_total = time.perf_counter() - start
    start = time.perf_counter()
    buffered = engine.generate([prompt], params, progress=False)[0]
    buffered_total = time.perf_counter() - start
    arrivals = pd.DataFrame(rows, columns=["seconds", "tokens_seen", "new_text"])
    return StreamRun(text, arrivals, float(arrivals["seconds"].iloc[0]), streamed_total, buffered_total,
                     buffered.text == text)
