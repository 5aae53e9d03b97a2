"""What share of a GPU the KV cache gets, computed the way a serving engine sizes it at start-up.

The book says the KV cache "is often 10-30% of total GPU memory". A serving engine does not aim for a share:
it takes the memory it may use (device memory x utilization), subtracts the weights and the activation peak
of its largest step, and turns everything left into KV blocks (`workbench.cache.sizing.block_budget`). The share
therefore follows from the model, the GPU and the tensor-parallel degree, and this module computes it for real
configs on common GPU sizes.

The activation peak is this engine's own: the tensors alive at the peak of one decoder layer's forward (the
MLP, with fused attention), counted per token from the layer's widths by ``activation_bytes``. The chapter's
tests check that count against the tensors a real forward allocates (`workbench.lab.ch01.memory.TensorPeak`).
Under tensor parallelism every GPU is charged a whole step's activations, an upper bound (the hidden-size
tensors are replicated, the head- and MLP-sized ones split).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from workbench.cache.sizing import (
    BlockBudget,
    block_budget,
    cached_tokens,
    dtype_bytes,
    kv_bytes,
    kv_bytes_per_token,
    weight_bytes,
)
from workbench.config import ModelSpec
from workbench.models import model_spec

GiB = 2**30
GPU_MEMORY = {"24 GiB GPU": 24 * GiB, "80 GiB GPU": 80 * GiB, "141 GiB GPU": 141 * GiB}
STEP_TOKENS = 8192  # tokens in the engine's largest step: what the activation peak is sized for
UTILIZATION = 0.9  # share of GPU memory the engine may use (vLLM's gpu_memory_utilization default)
BLOCK_SIZE = 16
SEED_RANGE = (0.10, 0.30)  # the book's "10-30% of total GPU memory"

# (config, GPU, number of GPUs under tensor parallelism): small and large models on common cards.
DEPLOYMENTS = (
    ("smollm2-135m", "24 GiB GPU", 1), ("llama-2-7b", "24 GiB GPU", 1), ("llama-3-8b", "24 GiB GPU", 1),
    ("mistral-7b", "24 GiB GPU", 1), ("qwen2.5-7b", "24 GiB GPU", 1), ("llama-3-8b", "80 GiB GPU", 1),
    ("llama-3-8b", "141 GiB GPU", 1), ("llama-3-70b", "141 GiB GPU", 1), ("llama-3-70b", "80 GiB GPU", 2),
    ("llama-3-70b", "141 GiB GPU", 2), ("llama-3-70b", "80 GiB GPU", 4), ("llama-3-70b", "80 GiB GPU", 8),
    ("llama-2-70b", "80 GiB GPU", 4),
)


def activation_bytes(spec: ModelSpec, num_tokens: int, dtype: torch.dtype | str = torch.bfloat16) -> int:
    """Peak bytes of this engine's forward over ``num_tokens`` tokens, beyond weights and KV cache.

    At the peak (a layer's MLP) these are alive, per token: the layer's input, its attention output added back
    and that normalised (3 x hidden); the rotary cos and sin rows (2 x head_dim); the fused q/k/v projection and
    the rotated q and k (2 x query width + 3 x KV width); the attention output (query width); the fused gate/up
    projection, the activated gate and its product with up (4 x intermediate)."""
    h, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    per_token = 3 * h + 2 * d + (q + 2 * kv) + (q + kv) + q + 4 * i
    return num_tokens * per_token * dtype_bytes(dtype)


def deployment_label(name: str, gpu: str, gpus: int) -> str:
    return f"{name} on {gpus} x {gpu}" if gpus > 1 else f"{name} on {gpu}"


def deployment_budget(name: str, gpu_bytes: int, gpus: int = 1, *, utilization: float = UTILIZATION,
                      step_tokens: int = STEP_TOKENS, kv_format: str | torch.dtype = torch.bfloat16
                      ) -> BlockBudget | None:
    """The KV block budget of ``gpus`` GPUs of ``gpu_bytes`` serving config ``name`` in bf16, or None if the
    weights and activations leave no room (the model does not fit)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    spec = model_spec(name)
    activations = gpus * activation_bytes(spec, step_tokens)
    left = int(gpus * gpu_bytes * utilization) - weight_bytes(spec, torch.bfloat16) - activations
    if left < BLOCK_SIZE * kv_bytes_per_token(spec, kv_format, torch.bfloat16):
        return None
    return block_budget(spec, gpus * gpu_bytes, utilization=utilization, kv_format=kv_format,
                        activation_bytes=activations, model_dtype=torch.bfloat16, block_size=BLOCK_SIZE)


def kv_share_table(deployments=DEPLOYMENTS, *, utilization: float = UTILIZATION, step_tokens: int = STEP_TOKENS,
                   context: int = 8192) -> pd.DataFrame:
    """One row per deployment: how its memory divides (shares of the GPUs' total memory) and how many sequences
    of ``context`` tokens (capped at the model's own limit) its KV budget holds. KV share is NaN where the weights
    do not fit."""
    rows = []
    for name, gpu, gpus in deployments:
        total = gpus * GPU_MEMORY[gpu]
        budget = deployment_budget(name, GPU_MEMORY[gpu], gpus, utilization=utilization, step_tokens=step_tokens)
        spec = model_spec(name)
        weights = weight_bytes(spec, torch.bfloat16)
        length = min(context, spec.max_position_embeddings)
        rows.append({
            "deployment": deployment_label(name, gpu, gpus), "memory_GiB": total / GiB,
            "weights": weights / total,
            "activations": budget.activation_bytes / total if budget else float("nan"),
            "kv_cache": budget.kv_budget_bytes / total if budget else float("nan"),
            "held_back": 1 - utilization, "kv_GiB": budget.kv_budget_bytes / GiB if budget else float("nan"),
            "context": length, "sequences": budget.max_concurrency(cached_tokens(spec, length)) if budget else 0})
    return pd.DataFrame(rows).set_index("deployment")


def share_verdict(table: pd.DataFrame) -> dict[str, float]:
    """Lowest and highest KV share among deployments that fit, and how many fall in the book's 10-30%."""
    shares = table["kv_cache"].dropna()
    inside = shares.between(*SEED_RANGE)
    return {"lowest": float(shares.min()), "highest": float(shares.max()), "inside": int(inside.sum()),
            "fitting": int(len(shares)), "not_fitting": int(table["kv_cache"].isna().sum())}


def capacity_frame(name: str, contexts: list[int], batches: list[int], *,
                   kv_format: str | torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """KV bytes for every (context, batch) pair; contexts beyond the config's limit are left out."""
    spec = model_spec(name)
    rows = [{"context": c, "batch": b, "kv_bytes": kv_bytes(spec, c, b, kv_format)}
            for c in contexts if c <= spec.max_position_embeddings for b in batches]
    return pd.DataFrame(rows)


def share_reading(table: pd.DataFrame) -> str:
    """The KV share of GPU memory by deployment class, read from the table (not typed)."""
    shares = table["kv_cache"].dropna()

    def span(rows: pd.Series) -> str:
        return (f"{rows.min():.0%}" if rows.min() == rows.max() else f"{rows.min():.0%}–{rows.max():.0%}") \
            if len(rows) else "none"

    small = shares[[("24 GiB" in d) and not d.startswith("smollm2") for d in shares.index]]
    one_big = shares[[("80 GiB" in d or "141 GiB" in d) and " x " not in d for d in shares.index]]
    multi = shares[[" x " in d for d in shares.index]]
    return (f"a 7–8B model on a 24 GiB card leaves the cache {span(small)}, on one 80 or 141 GiB card "
            f"{span(one_big)}, and 70B models on several GPUs {span(multi)} depending on how many")


@dataclass
class KVShare:
    """How each deployment's memory divides, at one memory utilization and step size (`kv_share_table`)."""

    utilization: float
    step_tokens: int
    table: pd.DataFrame

    @property
    def verdict(self) -> dict[str, float]:
        return share_verdict(self.table)

    @property
    def inside_share(self) -> float:
        """Share of the deployments that fit whose KV share falls inside the book's 10-30%."""
        v = self.verdict
        return v["inside"] / max(v["fitting"], 1)


def kv_share(utilization: float = UTILIZATION, step_tokens: int = STEP_TOKENS) -> KVShare:
    return KVShare(utilization, step_tokens, kv_share_table(utilization=utilization, step_tokens=step_tokens))


@dataclass
class KVCapacity:
    """KV bytes of every (context, batch) pair for one model, and one deployment's KV budget (None: no room)."""

    model: str
    deployment: str
    kv_format: str
    frame: pd.DataFrame  # context, batch, kv_bytes
    budget: BlockBudget | None

    def max_sequences(self) -> dict[int, int]:
        """Sequences of each context (within the model's limit) that fit in the budget at once."""
        if self.budget is None:
            return {}
        spec = model_spec(self.model)
        return {c: self.budget.max_concurrency(cached_tokens(spec, c)) for c in sorted(set(self.frame["context"]))}


def kv_capacity(name: str, gpu: str, gpus: int, contexts: list[int], batches: list[int], *,
                kv_format: str = "bfloat16") -> KVCapacity:
    return KVCapacity(name, deployment_label(name, gpu, gpus), kv_format,
                      capacity_frame(name, contexts, batches, kv_format=kv_format),
                      deployment_budget(name, GPU_MEMORY[gpu], gpus, kv_format=kv_format))
