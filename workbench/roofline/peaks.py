"""This device's ceilings, measured: peak matrix throughput at the model's dtype and peak memory bandwidth.

A roofline needs two numbers, and spec sheets give neither for the machine a learner actually has (a shared
cloud CPU, a laptop GPU with its own clocks). So both are measured here, with the same operators the engine
uses:

- FLOP/s: the fastest of square matrix products (``torch.matmul``) of a few sizes, and on the CPU also the
  engine's oneDNN-packed linear layer (`workbench.models.cpu_linear`), at the dtype asked for.
- bytes/s: the fastest of three streaming kernels over a buffer far larger than the last-level cache: a
  reduction (reads it once), a copy (reads and writes it) and a matrix-vector product (reads a weight matrix
  once: exactly a batch-1 decode step's pattern). Each is a lower bound on what the memory can deliver, so the
  best of them is the ceiling.

Every timing is the fastest of several runs: the run least disturbed by whatever else the machine is doing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from workbench.models.cpu_linear import Linear
from workbench.timing import best_seconds

MiB = 2**20
# Buffers for the bandwidth probe: several times the last-level cache (32 MiB L3 on the CI CPU, 50 MiB L2 on an
# H100), so that what is measured is DRAM / HBM and not a cache.
CPU_BUFFER_BYTES = 256 * MiB
CUDA_BUFFER_BYTES = 2048 * MiB
CPU_MATMUL_SIZES = (512, 1024, 2048)
CUDA_MATMUL_SIZES = (4096, 8192)


@dataclass(frozen=True, slots=True)
class DevicePeaks:
    """Measured ceilings of one device at one dtype, and the roofline they draw."""

    device: str
    dtype: str
    flops_per_s: float
    bytes_per_s: float
    flops_by_probe: dict[str, float] = field(default_factory=dict)
    bandwidth_by_probe: dict[str, float] = field(default_factory=dict)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two roofs meet: below it a step is bandwidth-bound, above it compute-bound."""
        return self.flops_per_s / self.bytes_per_s

    def roof(self, intensity: float) -> float:
        """The most FLOP/s a step of this arithmetic intensity can reach here."""
        return min(self.flops_per_s, self.bytes_per_s * intensity)

    def floor_seconds(self, flops: float, num_bytes: float) -> float:
        """The least time a step of this many FLOPs and bytes can take here (whichever roof binds)."""
        return max(flops / self.flops_per_s, num_bytes / self.bytes_per_s)

    def bound(self, intensity: float) -> str:
        return "compute" if intensity >= self.ridge else "bandwidth"


def _matmul_probes(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...]) -> dict[str, float]:
    results = {}
    gen = torch.Generator(device=device).manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        results[f"matmul {n}"] = 2.0 * n**3 / best_seconds(lambda a=a, b=b: a @ b, device)
        if device.type == "cpu":
            layer = _packed_linear(b)
            results[f"packed linear {n}"] = 2.0 * n**3 / best_seconds(lambda a=a, layer=layer: layer(a), device)
    return results


def _packed_linear(weight: torch.Tensor) -> Linear:
    """The engine's own CPU linear layer around ``weight`` (packed for oneDNN where that is available)."""
    layer = Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    layer.weight.data = weight
    layer.requires_grad_(False).pack()
    return layer


def _bandwidth_probes(device: torch.device, dtype: torch.dtype, buffer_bytes: int) -> dict[str, float]:
    n = buffer_bytes // dtype_size(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    src = torch.randn(n, device=device, dtype=dtype, generator=gen)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    results = {"read (sum)": nbytes / best_seconds(src.sum, device),
               "copy (read + write)": 2 * nbytes / best_seconds(lambda: dst.copy_(src), device)}
    cols = 4096
    weight = src[: (n // cols) * cols].view(-1, cols)
    vector = torch.randn(1, cols, device=device, dtype=dtype, generator=gen)
    if device.type == "cpu":
        layer = _packed_linear(weight)
        gemv: Callable[[], object] = lambda: layer(vector)  # noqa: E731
    else:
        gemv = lambda: F.linear(vector, weight)  # noqa: E731
    results["matrix-vector (read)"] = weight.numel() * weight.element_size() / best_seconds(gemv, device)
    return results


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


@torch.inference_mode()
def measure_peaks(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
                  buffer_bytes: int | None = None, matmul_sizes: tuple[int, ...] | None = None) -> DevicePeaks:
    """Measure this device's peak matrix FLOP/s at ``dtype`` and its memory bandwidth (a few seconds)."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a CPU or CUDA device, got {device}")
    cuda = device.type == "cuda"
    buffer_bytes = buffer_bytes or (CUDA_BUFFER_BYTES if cuda else CPU_BUFFER_BYTES)
    if buffer_bytes < 16 * MiB:
        raise ValueError(f"buffer_bytes must be at least 16 MiB to get past the caches, got {buffer_bytes:,}")
    flops = _matmul_probes(device, dtype, matmul_sizes or (CUDA_MATMUL_SIZES if cuda else CPU_MATMUL_SIZES))
    bandwidth = _bandwidth_probes(device, dtype, buffer_bytes)
    if cuda:
        torch.cuda.empty_cache()
    return DevicePeaks(device=str(device), dtype=str(dtype).removeprefix("torch."), flops_per_s=max(flops.values()),
                       bytes_per_s=max(bandwidth.values()), flops_by_probe=flops, bandwidth_by_probe=bandwidth)
