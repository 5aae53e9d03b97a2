"""Real engine steps, timed and placed on the roofline.

Prefill points: one request at a time, its whole prompt in one step (``max_tokens=1``), for each prompt length.
Decode points: ``batch`` requests of ``context`` prompt tokens each, admitted together; once their prefill is
done, every step is a pure decode of the whole batch, and its time is the inter-token latency every sequence
of the batch sees. Prompts are random token ids (the work does not depend on which tokens) and the prefix
cache is off, so nothing is shared between sequences that the byte count says is read separately.

The time is the engine's own step record (scheduling, the forward, sampling): what a user waits for. The FLOPs
and bytes come from `workbench.roofline.counts` for the very batch that ran, so achieved FLOP/s and bytes/s are
counted work over measured time, and the distance to the roof is the engine's overhead and inefficiency.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.intmath import ceil_div
from workbench.models.llama import LlamaModel
from workbench.roofline.counts import count_step, decode_work, prefill_work
from workbench.roofline.peaks import DevicePeaks

Progress = Callable[[int, int, str], None]
BLOCK_SIZE = 16
# From this prompt length on a prefill step takes about a second on the 2-core CPU: one run is enough.
LONG_PREFILL = 512


def random_prompt(rng: random.Random, tokens: int, vocab_size: int) -> list[int]:
    """``tokens`` random ids from the ordinary part of the vocabulary (clear of special tokens at the start)."""
    return [rng.randrange(100, vocab_size) for _ in range(tokens)]


def _engine(model: LlamaModel, *, max_tokens_per_step: int, max_seqs: int, pool_tokens: int) -> LLMEngine:
    """An engine whose steps hold everything asked for at once: no chunking, no sharing, a pool just big enough."""
    blocks = ceil_div(pool_tokens, BLOCK_SIZE) + max_seqs
    return LLMEngine(model, None,
                     cache_config=CacheConfig(block_size=BLOCK_SIZE, num_blocks=blocks, enable_prefix_caching=False),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=max(max_tokens_per_step, max_seqs),
                                                      max_num_seqs=max_seqs, enable_chunked_prefill=False))


def _run(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> pd.DataFrame:
    """Run ``prompts`` together to ``new_tokens`` forced tokens each; the engine's step frame of this run."""
    engine.metrics.reset()
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params, chat=False)
    while engine.has_unfinished_requests():
        engine.step()
    steps = engine.metrics.step_frame()
    if steps["preemptions"].sum():
        raise RuntimeError("a measurement run preempted a sequence: the KV pool was sized too small")
    return steps


def _row(model: LlamaModel, kind: str, batch: int, context: int, new_tokens: int, seconds: float, work) -> dict:
    count = count_step(model.spec, work, dtype=model.dtype)
    return {"kind": kind, "batch": batch, "context": context, "new_tokens": new_tokens, "step_s": seconds,
            **count.as_dict(), "flops_per_s": count.flops / seconds, "bytes_per_s": count.bytes / seconds}


@torch.inference_mode()
def measure_prefill_steps(model: LlamaModel, lengths: Sequence[int], *, repeats: int = 2, seed: int = 0,
                          progress: Progress | None = None) -> pd.DataFrame:
    """Time a whole-prompt prefill step for each prompt length; one row per length.

    Prompts shorter than ``LONG_PREFILL`` tokens are timed ``repeats`` times and the fastest kept; longer ones,
    whose steps last long enough that a stray interruption matters little, once."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be non-empty and >= 1, got {list(lengths)}")
    rng = random.Random(seed)
    engine = _engine(model, max_tokens_per_step=max(lengths) + 1, max_seqs=1, pool_tokens=max(lengths) + 1)
    _run(engine, [random_prompt(rng, min(lengths), model.spec.vocab_size)], 1)  # warm-up
    rows = []
    for i, n in enumerate(lengths):
        if progress is not None:
            progress(i, len(lengths), f"prefill of {n:,} tokens")
        times = [_run(engine, [random_prompt(rng, n, model.spec.vocab_size)], 1)["duration_s"].iloc[0]
                 for _ in range(repeats if n < LONG_PREFILL else 1)]
        rows.append(_row(model, "prefill", 1, n, n, min(times), prefill_work(n)))
    return pd.DataFrame(rows)


@torch.inference_mode()
def measure_decode_steps(model: LlamaModel, batches: Sequence[int], contexts: Sequence[int], *, steps: int = 6,
                         seed: int = 0, progress: Progress | None = None) -> pd.DataFrame:
    """Time pure decode steps of every (batch, context) pair: the median of ``steps`` steps, one row per pair.

    ``context`` is the prompt length; the timed steps run at contexts ``context + 1 ..``, and the row's count uses
    their middle one."""
    if not batches or not contexts or min(batches) < 1 or min(contexts) < 1:
        raise ValueError(f"batches and contexts must be non-empty and >= 1, got {list(batches)}, {list(contexts)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    rng = random.Random(seed)
    biggest = max(batches) * (max(contexts) + steps + 1)
    engine = _engine(model, max_tokens_per_step=biggest, max_seqs=max(batches), pool_tokens=biggest)
    _run(engine, [random_prompt(rng, 8, model.spec.vocab_size)], 3)  # warm-up
    pairs = [(b, c) for c in contexts for b in batches]
    rows = []
    for i, (batch, context) in enumerate(pairs):
        if progress is not None:
            progress(i, len(pairs), f"decode at batch {batch}, context {context:,}")
        frame = _run(engine, [random_prompt(rng, context, model.spec.vocab_size) for _ in range(batch)], steps + 1)
        decode = frame[(frame["num_prefill_tokens"] == 0) & (frame["num_decode_seqs"] == batch)]
        if len(decode) != steps:
            raise RuntimeError(f"expected {steps} pure decode steps at batch {batch}, got {len(decode)}")
        middle = context + (steps + 1) // 2
        rows.append(_row(model, "decode", batch, middle, batch, float(decode["duration_s"].median()),
                         decode_work(batch, middle)))
        # The spread of the timed steps, so that two rows closer than it are not read as a difference.
        rows[-1] |= {"step_min_s": float(decode["duration_s"].min()), "step_max_s": float(decode["duration_s"].max())}
    return pd.DataFrame(rows)


def place_on_roofline(steps: pd.DataFrame, peaks: DevicePeaks) -> pd.DataFrame:
    """Add the roof at each step's intensity, the time floor, which roof binds, and the share of the roof reached."""
    frame = steps.copy()
    frame["roof_flops_per_s"] = [peaks.roof(i) for i in frame["intensity"]]
    frame["floor_s"] = [peaks.floor_seconds(f, b) for f, b in zip(frame["flops"], frame["bytes"], strict=True)]
    frame["bound"] = [peaks.bound(i) for i in frame["intensity"]]
    frame["share_of_roof"] = frame["flops_per_s"] / frame["roof_flops_per_s"]
    return frame
