"""Before a figure is computed for a named model on a named GPU, check that the deployment can exist.

The book computes a 70 ms decode floor for a 141 GB model on an 80 GB GPU, a speculative timeline for a 70B target
on one A100 with four 8B drafts in 20 ms, and batches of 64-256 for a 70B on an A100; chapters once reused them.
Here a ``Deployment`` (model, device, precision, tensor-parallel degree, batch, context) is checked first: the
weights and the KV cache must fit in each GPU's usable memory, and no time may be below the device's floor (the
bytes each GPU reads over its bandwidth, the FLOPs over its peak). An impossible deployment is labelled ("needs
TP >= 2") and ``smallest_feasible`` gives the figure on the smallest one that fits.

Device figures are the vendors' datasheets (SXM parts, dense bf16 without sparsity); memory is what the GPU
reports (an "80 GB" A100 or H100 has 80 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.parallel_sizing import gpu_share, valid_tp_degrees
from workbench.cache.sizing import cached_tokens, weight_bytes
from workbench.models import model_spec

GiB = 2**30
UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization: the share of the GPU an instance may use


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    memory_bytes: int
    bytes_per_s: float
    bf16_flops: float


DEVICES = {d.name: d for d in (
    Device("A100 80GB", 80 * GiB, 2.039e12, 312e12),
    Device("A100 40GB", 40 * GiB, 1.555e12, 312e12),
    Device("H100 SXM", 80 * GiB, 3.35e12, 989e12),
    Device("H200", 141 * 10**9, 4.8e12, 989e12),
)}


def device(name: str) -> Device:
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}: choose one of {sorted(DEVICES)}")
    return DEVICES[name]


@dataclass(frozen=True, slots=True)
class Feasibility:
    """One deployment checked: per-GPU weights and KV against the usable memory, and the floor of a decode step
    (every GPU reads its share of the weights and of the batch's KV once; its share of the FLOPs at peak)."""

    model: str
    device: Device
    dtype: torch.dtype
    tp: int
    batch: int
    context: int
    weight_bytes_per_gpu: int
    kv_bytes_per_gpu: int
    usable_bytes: int
    smallest_tp: int | None  # the smallest degree at which the same batch and context fit (None: none up to 8)

    @property
    def fits(self) -> bool:
        return self.weight_bytes_per_gpu + self.kv_bytes_per_gpu <= self.usable_bytes

    @property
    def decode_floor_ms(self) -> float:
        """Least time of one decode step of ``batch`` sequences at ``context`` on this deployment."""
        read = (self.weight_bytes_per_gpu + self.kv_bytes_per_gpu) / self.device.bytes_per_s
        params = model_spec(self.model).num_parameters()
        compute = 2 * params * self.batch / self.tp / self.device.bf16_flops
        return max(read, compute) * 1e3

    def below_floor(self, stated_ms: float) -> bool:
        """A stated decode-step time this deployment cannot reach."""
        return stated_ms < self.decode_floor_ms

    @property
    def label(self) -> str:
        where = f"{self.model} ({_dtype_name(self.dtype)}) on {self.tp} x {self.device.name}"
        need = (self.weight_bytes_per_gpu + self.kv_bytes_per_gpu) / GiB
        if self.fits:
            return f"{where}: fits ({need:.0f} of {self.usable_bytes / GiB:.0f} GiB usable per GPU)"
        more = f"needs TP >= {self.smallest_tp}" if self.smallest_tp else "does not fit at any TP up to 8"
        return f"{where}: does not fit, {need:.0f} GiB per GPU against {self.usable_bytes / GiB:.0f} usable: {more}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")


def check(model: str, device_name: str, *, dtype: torch.dtype = torch.bfloat16, tp: int = 1, batch: int = 1,
          context: int = 0, kv_format: str | torch.dtype = torch.bfloat16,
          utilization: float = UTILIZATION) -> Feasibility:
    """Does ``model`` in ``dtype`` fit ``tp`` GPUs of ``device_name`` with ``batch`` sequences of ``context``
    tokens of KV? (Activations are left out: a deployment that fails here fails with them too.)"""
    spec, dev = model_spec(model), device(device_name)
    if tp not in valid_tp_degrees(spec, 64) or batch < 1 or context < 0:
        raise ValueError(f"need a TP degree that divides {model}'s heads (got {tp}), batch >= 1 (got {batch}) and "
                         f"context >= 0 (got {context})")
    usable = int(dev.memory_bytes * utilization)

    def per_gpu(degree: int) -> tuple[int, int]:
        share = gpu_share(spec, degree, kv_format=kv_format, model_dtype=dtype)
        weights = weight_bytes(spec, dtype) // degree
        return weights, batch * cached_tokens(spec, context) * share.kv_bytes_per_token

    weights, kv = per_gpu(tp)
    smallest = next((d for d in valid_tp_degrees(spec, 8) if sum(per_gpu(d)) <= usable), None)
    return Feasibility(model, dev, dtype, tp, batch, context, weights, kv, usable, smallest)


def smallest_feasible(model: str, device_name: str, **kwargs) -> Feasibility:
    """The deployment with the smallest TP degree that fits (the asked-for one, checked, if none does)."""
    first = check(model, device_name, **kwargs)
    if first.fits or first.smallest_tp is None:
        return first
    return check(model, device_name, **{**kwargs, "tp": first.smallest_tp})
