"""Chapter 11's measurement on a GPU: the host link a second KV tier crosses, and restore against recompute there.

What the chapter draws from it (``datasets/gpu_results/<date>-<device>/ch11.json``, written by
``benchmarks/gpu_chapters.py --chapter ch11``):

- host-to-device and device-to-host copy bandwidth, pinned and pageable, for one block of the 8B shape (2 MiB),
  64 MiB and 1 GiB (CUDA events; the fastest of several copies);
- per model shape (SmolLM2-135M and Llama-3-8B, random weights, bf16): the engine's own host tier timed
  (`KVTier.measure_transfers`: real blocks stored and restored through pinned memory), the engine's prefill per token
  (a line through three whole-prompt prefills), the crossover that follows, and one returning prompt's time to
  first token on an engine with the tier and on one without (its blocks evicted in between).

On the CPU (``--device cpu --tiny``) the same code runs on tiny shapes: the dry run tests/test_gpu_session.py runs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from workbench.cache.sizing import kv_bytes_per_token
from workbench.cache.tier.config import KVOffloadConfig
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.roofline import measure_prefill_steps

COPY_SIZES = {"one 8B block (2 MiB)": 2 << 20, "64 MiB": 64 << 20, "1 GiB": 1 << 30}


def copy_bandwidth(device: torch.device, size: int, *, pinned: bool, to_device: bool, repeats: int = 5) -> float:
    """Bytes per second of one copy of ``size`` bytes between host and ``device``, the fastest of ``repeats``."""
    host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")
    other = torch.empty(size, dtype=torch.uint8, device=device)
    src, dst = (host, other) if to_device else (other, host)
    best = math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=pinned)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            import time

            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return size / best


def _engine(model, blocks: int, tier: KVOffloadConfig | None) -> LLMEngine:
    return LLMEngine(model, None, cache_config=CacheConfig(block_size=16, num_blocks=blocks, kv_cache_dtype="auto"),
                     scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8192), kv_offload=tier)


def returning_ttft(model, prompt_tokens: int, tier: KVOffloadConfig | None) -> tuple[float, int]:
    """TTFT (s) of a prompt coming back after another one evicted its blocks, and the tokens it found cached."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.spec.vocab_size
    first, other = (torch.randint(100, vocab, (prompt_tokens,), generator=gen).tolist() for _ in range(2))
    engine = _engine(model, prompt_tokens // 16 + 4, tier)  # one prompt at a time fits, two do not
    params = SamplingParams(max_tokens=1)
    for prompt in (first, other, first):
        engine.generate([prompt], params, progress=False, chat=False)
    row = engine.metrics.request_frame().iloc[-1]
    return float(row["ttft_s"]), int(row["cached_prompt_tokens"])


def model_case(name: str, model, lengths: list[int], returning: int) -> dict:
    tier = KVOffloadConfig("host", size_gib=1.0, restore="always")
    engine = _engine(model, 64, tier)
    store, restore = engine.kv_offload.measure_transfers(list(range(8)), repeats=3)
    del engine
    prefill = measure_prefill_steps(model, lengths, repeats=2)
    per_token = float(np.polyfit(prefill["context"], prefill["step_s"], 1)[0])
    gain = 16 * per_token - restore.per_block_s
    crossover = math.inf if gain <= 0 else 16 * (math.floor(restore.fixed_s / gain) + 1)
    with_tier, cached = returning_ttft(model, returning, tier)
    without, _ = returning_ttft(model, returning, None)
    return {"model": name, "kv_bytes_per_token": kv_bytes_per_token(model.spec, "auto", model.dtype),
            "restore_fixed_s": restore.fixed_s, "restore_per_block_s": restore.per_block_s,
            "restore_bytes_per_s": restore.bytes_per_s, "store_bytes_per_s": store.bytes_per_s,
            "prefill": [{"context": int(c), "step_s": float(s)} for c, s in zip(prefill["context"], prefill["step_s"],
                                                                               strict=True)],
            "prefill_s_per_token": per_token, "crossover_tokens": crossover,
            "returning_prompt_tokens": returning, "ttft_with_tier_s": with_tier, "ttft_without_tier_s": without,
            "cached_tokens_with_tier": cached}


def ch11(setup) -> dict:
    device = setup.device
    copies = []
    sizes = {"64 KiB": 64 << 10, "1 MiB": 1 << 20} if setup.tiny else COPY_SIZES
    for label, size in sizes.items():
        for pinned in (True, False):
            for to_device in (True, False):
                copies.append({"size": label, "bytes": size, "pinned": pinned,
                               "direction": "host_to_device" if to_device else "device_to_host",
                               "bytes_per_s": copy_bandwidth(device, size, pinned=pinned, to_device=to_device)})
    best = {d: max(c["bytes_per_s"] for c in copies if c["direction"] == d and c["pinned"])
            for d in ("host_to_device", "device_to_host")}
    models = []
    for name in ("smollm2-135m", "llama-3-8b"):
        model = setup.model(name)
        models.append(model_case(name, model, setup.sizes([128, 512, 2048], [16, 32, 64]),
                                 setup.sizes([2048], [64])[0]))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"host_to_device_bytes_per_s": best["host_to_device"], "device_to_host_bytes_per_s": best["device_to_host"],
            "copies": copies, "models": models}
