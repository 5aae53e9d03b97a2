"""Measuring the activation peak of a forward pass, so the KV budget is what memory really leaves.

Serving engines size the KV cache at start-up by running the largest batch they will ever run once and
reading the memory high-water mark: whatever that forward needed beyond the weights is not available for KV
blocks. On CUDA the allocator keeps that statistic. On Linux CPUs the kernel keeps the process's peak resident
set (VmHWM), which can be reset through ``/proc/self/clear_refs``; elsewhere the peak is not measurable and
the probe says so by returning None.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel


def _rss_field(name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_cpu_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5" resets the peak RSS to the current RSS
        return True
    except OSError:
        return False


@torch.inference_mode()
def measure_activation_peak(model: LlamaModel, num_tokens: int) -> int | None:
    """Peak bytes a forward over ``num_tokens`` prompt tokens needs beyond what is already allocated."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    ids = torch.randint(0, model.spec.vocab_size, (num_tokens,), device=model.device)
    positions = torch.arange(num_tokens, device=model.device)

    def forward() -> None:
        hidden = model(ids, positions, NoCacheAttention([num_tokens], model.attention_scale))
        model.compute_logits(hidden[-1:])

    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
        before = torch.cuda.memory_allocated(model.device)
        torch.cuda.reset_peak_memory_stats(model.device)
        forward()
        torch.cuda.synchronize(model.device)
        return torch.cuda.max_memory_allocated(model.device) - before
    if model.device.type == "cpu" and _reset_cpu_peak():
        before = _rss_field("VmRSS")
        forward()
        peak = _rss_field("VmHWM")
        if before is not None and peak is not None:
            return max(peak - before, 0)
    return None
