"""The KV cache across GPUs (chapter 2, section 4's last part): per-GPU KV bytes per token and the tokens one GPU
holds against the tensor-parallel degree, for real configs, from `workbench.cache.parallel_sizing` (vLLM's rules:
KV heads split across ranks, replicated once the degree passes their number). Nothing is allocated: the numbers
are computed from ``datasets/configs`` and are the same on every machine.

The book's three statements about multi-GPU caches are checked here: its 64-heads-on-4-GPUs example, its
pipeline example (80 layers on 4 stages), and "the total KV cache memory is the same regardless of how it is
distributed", which replication contradicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from workbench.cache.parallel_sizing import gpu_share, layers_per_stage, valid_tp_degrees
from workbench.models import model_spec

GiB = 2**30
MODELS = ("llama-3-70b", "llama-3-8b", "smollm2-135m")  # 8, 8 and 3 KV heads
MAX_DEGREE = 16
GPU_BYTES = 80 * GiB


@dataclass(frozen=True)
class TPSweep:
    """One row per (model, TP degree): KV heads per rank, copies of each head, per-GPU and fleet-wide KV bytes
    per token (bf16), and the tokens one GPU of ``gpu_bytes`` holds after its share of the weights."""

    frame: pd.DataFrame
    gpu_bytes: int

    def cliff(self, model: str) -> int:
        """The largest degree at which one more split still shrinks the per-GPU cache (the KV head count)."""
        return model_spec(model).num_kv_heads


def tp_sweep(models: tuple[str, ...] = MODELS, *, max_degree: int = MAX_DEGREE,
             gpu_bytes: int = GPU_BYTES) -> TPSweep:
    rows = []
    for name in models:
        spec = model_spec(name)
        for tp in valid_tp_degrees(spec, max_degree):
            share = gpu_share(spec, tp, kv_format=torch.bfloat16)
            rows.append({"model": name, "tp": tp, "kv_heads_per_rank": share.kv_heads_per_rank,
                         "copies_per_head": share.kv_head_replicas,
                         "kv_bytes_per_token_per_gpu": share.kv_bytes_per_token,
                         "kv_bytes_per_token_all_gpus": share.kv_bytes_per_token * tp,
                         "kv_bytes_per_token_one_gpu": share.total_kv_bytes_per_token,
                         "tokens_per_gpu": share.tokens_that_fit(gpu_bytes)})
    return TPSweep(pd.DataFrame(rows), gpu_bytes)


@dataclass(frozen=True)
class SeedParallelChecks:
    """The book's statements, each recomputed: heads per GPU in its 64-head example on a real 64-head config,
    layers per stage in its pipeline example, and the fleet-wide KV total with and without replication."""

    example_model: str
    query_heads_per_gpu: int
    kv_heads_per_gpu: int
    seed_heads_per_gpu: int
    layers_per_stage: list[int]
    replicated_model: str
    replicated_tp: int
    total_over_one_gpu: float  # the fleet-wide KV bytes per token at replicated_tp over the unsplit model's

    @property
    def heads_claim_holds(self) -> bool:
        """The book's GPU 'stores KV cache for those 16 heads only': true only if it holds 16 KV heads."""
        return self.kv_heads_per_gpu == self.seed_heads_per_gpu

    @property
    def total_claim_holds(self) -> bool:
        return abs(self.total_over_one_gpu - 1.0) < 1e-9


def parallel_seed_checks(sweep: TPSweep) -> SeedParallelChecks:
    spec = model_spec("llama-3-70b")  # 64 query heads, 8 KV heads, 80 layers: the book's numbers
    share = gpu_share(spec, 4)
    widest = sweep.frame[sweep.frame["model"] == spec.name].iloc[-1]
    total = widest["kv_bytes_per_token_all_gpus"] / widest["kv_bytes_per_token_one_gpu"]
    return SeedParallelChecks(spec.name, spec.num_heads // 4, share.kv_heads_per_rank, 16,
                              layers_per_stage(spec.num_layers, 4), spec.name, int(widest["tp"]), float(total))
