"""Chapter 4's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch04.csv)."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.lab.ch04.arithmetic import SEED_GPU, streaming_arithmetic
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import DEVICES, smallest_feasible
from workbench.models import model_spec
from workbench.roofline import count_step, decode_work, prefill_work


def _request_1000_200() -> str:
    spec, dev = model_spec("llama-3-8b"), DEVICES["H100 SXM"]
    ridge = dev.bf16_flops / dev.bytes_per_s
    prefill = count_step(spec, prefill_work(1000), dtype=torch.bfloat16)
    decode = count_step(spec, decode_work(1, 1100), dtype=torch.bfloat16)
    step_ms = decode.bytes / dev.bytes_per_s * 1e3
    return (f"Llama-3-8B in bf16 on an H100 (ridge {ridge:.0f} FLOP/B): the 1,000-token prefill at "
            f"{prefill.intensity:.0f} FLOP/B takes at least {prefill.flops / dev.bf16_flops * 1e3:.1f} ms; each of the "
            f"200 decode steps at {decode.intensity:.1f} FLOP/B at least {step_ms:.1f} ms, {200 * step_ms:.0f} ms in "
            "all: decode is most of the time")


def _step_70b() -> str:
    fits = smallest_feasible("llama-3-70b", SEED_GPU)
    return (f"a 70B model in bf16 needs TP {fits.tp} on A100 80GB GPUs, where a step's floor is "
            f"{fits.decode_floor_ms:.1f} ms; 200 tokens at 150 ms = 30 s (its arithmetic holds; its step is "
            f"{150 / fits.decode_floor_ms:.1f}x that floor)")


def _stream() -> str:
    s = streaming_arithmetic()
    return (f"300 tokens at 20 tokens/s take {s['streamed_s']:.0f} s, so the totals cannot be identical: that needs "
            f"{s['rate_for_equal_s']:.0f} tokens/s")


def _chunk_32k() -> str:
    spec, dev = model_spec("llama-3-8b"), DEVICES["H100 SXM"]
    prefill = count_step(spec, prefill_work(32768), dtype=torch.bfloat16)
    chunk = count_step(spec, prefill_work(512, cached=16384), dtype=torch.bfloat16)
    return (f"a 32K-token prefill of Llama-3-8B needs {prefill.flops / 1e15:.2f} PFLOP, at least "
            f"{prefill.flops / dev.bf16_flops:.2f} s at an H100's bf16 peak (the book's '2 seconds' fits a slower "
            f"GPU or a larger model); a 512-token chunk halfway through, at least "
            f"{chunk.flops / dev.bf16_flops * 1e3:.0f} ms: the stall each decode step sees")


def _itl_vs_ttft() -> str:
    return ("partly: section 4 shows TTFT degrading from queueing alone (prompts arriving together) while each "
            "decode step keeps its cost; ITL under decode pressure is not measured in this chapter (chapter 8's "
            "dashboard shows both from one run)")


def _continuous_util() -> str:
    return ("set aside here: section 7 measures one newcomer's TTFT with and without continuous batching, not the "
            "batch's utilization; chapter 5 measures utilization against output-length spread")


CHECKS = {"request_1000_200": _request_1000_200, "step_70b": _step_70b, "stream": _stream,
          "chunk_32k": _chunk_32k, "itl_vs_ttft": _itl_vs_ttft, "continuous_util": _continuous_util}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 4, with what this chapter finds for it."""
    return kit.table("ch04", CHECKS)
