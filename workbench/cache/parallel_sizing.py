"""The KV cache of one GPU when a model is split across several: tensor parallelism (TP) divides each layer's KV
heads across ranks, pipeline parallelism (PP) divides the layers across stages.

The rules are the ones vLLM applies, so the numbers here are what a user of vLLM gets per GPU:

- TP of degree t over H KV heads: when t <= H, t must divide H and each rank holds H / t heads; when t > H,
  H must divide t and each head is **replicated** on t / H ranks, so every rank still holds one whole head.
  Past H, more GPUs stop shrinking the per-GPU KV cache: the replication cliff. The query heads must divide by t
  too (each rank computes whole attention heads).
- PP of degree p over L layers: each stage gets L // p layers; the remainder goes one each to the stages
  before the last, counting back from the second-to-last (the last stage also runs the final norm and the LM
  head). The stage with the most layers is the one whose cache fills first.

Bytes per token per GPU = 2 (K and V) x layers on the stage x KV heads on the rank x slot bytes of the format.
Weights per GPU are the total divided by t x p, an even-split estimate (embeddings and the LM head are not
split exactly that way); the KV figures are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.sizing import storage_format, weight_bytes
from workbench.config import ModelSpec
from workbench_kernels.kv_quant import slot_bytes


def _check_degree(name: str, degree: int) -> None:
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"{name} degree must be a whole number >= 1, got {degree!r}")


def valid_tp_degrees(spec: ModelSpec, up_to: int = 128) -> list[int]:
    """Tensor-parallel degrees up to ``up_to`` that this model's heads allow."""
    return [t for t in range(1, up_to + 1) if _tp_problem(spec, t) is None]


def _tp_problem(spec: ModelSpec, tp: int) -> str | None:
    if spec.num_heads % tp:
        return f"{spec.num_heads} query heads do not divide into {tp} ranks"
    kv = spec.num_kv_heads
    if tp <= kv and kv % tp:
        return f"{kv} KV heads do not divide into {tp} ranks"
    if tp > kv and tp % kv:
        return f"{tp} ranks are not a whole number of copies of {kv} KV heads"
    return None


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(KV heads each rank holds, how many ranks hold a copy of each head) under TP degree ``tp``."""
    _check_degree("tensor-parallel", tp)
    problem = _tp_problem(spec, tp)
    if problem is not None:
        raise ValueError(f"tensor-parallel degree {tp} does not fit {spec.name}: {problem}; "
                         f"allowed degrees: {valid_tp_degrees(spec, max(64, tp))}")
    kv = spec.num_kv_heads
    return (kv // tp, 1) if tp <= kv else (1, tp // kv)


def layers_per_stage(num_layers: int, pp: int) -> list[int]:
    """Layers on each pipeline stage, first to last (vLLM's default partition)."""
    _check_degree("pipeline-parallel", pp)
    if pp > num_layers:
        raise ValueError(f"pipeline-parallel degree {pp} exceeds the {num_layers} layers: allowed 1..{num_layers}")
    stages = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        stages[-i] += 1
    return stages


@dataclass(frozen=True, slots=True)
class GpuShare:
    """One GPU's share of a model under TP x PP: its KV bytes per token (exact) and how many tokens fit."""

    model: str
    tensor_parallel: int
    pipeline_parallel: int
    kv_heads_per_rank: int
    kv_head_replicas: int
    layers_per_stage: tuple[int, ...]
    kv_bytes_per_token: int  # on the GPU with the most layers
    total_kv_bytes_per_token: int  # the whole model on one GPU, for comparison
    weight_bytes_per_gpu: int  # even-split estimate

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def tokens_that_fit(self, gpu_memory_bytes: int, utilization: float = 0.9) -> int:
        """Tokens of KV one GPU holds after its share of the weights (activations not counted)."""
        if not 0 < utilization <= 1:
            raise ValueError(f"utilization must be in (0, 1], got {utilization}")
        budget = int(gpu_memory_bytes * utilization) - self.weight_bytes_per_gpu
        return max(0, budget // self.kv_bytes_per_token)


def gpu_share(spec: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1, *,
              kv_format: str | torch.dtype = torch.bfloat16, model_dtype: torch.dtype = torch.bfloat16) -> GpuShare:
    heads, replicas = kv_heads_per_rank(spec, tensor_parallel)
    stages = layers_per_stage(spec.num_layers, pipeline_parallel)
    name, dtype = storage_format(kv_format, model_dtype)
    slot = slot_bytes(name, 1, spec.head_dim, dtype)
    if slot * spec.num_kv_heads != slot_bytes(name, spec.num_kv_heads, spec.head_dim, dtype):
        raise ValueError(f"KV format {kv_format!r} does not store heads independently; cannot split it by head")
    return GpuShare(spec.name, tensor_parallel, pipeline_parallel, heads, replicas, tuple(stages),
                    2 * max(stages) * heads * slot, 2 * spec.num_layers * spec.num_kv_heads * slot,
                    weight_bytes(spec, model_dtype) // (tensor_parallel * pipeline_parallel))
