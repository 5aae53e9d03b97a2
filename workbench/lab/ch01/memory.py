"""Chapter 1's memory measurement: what attention needs when its N x N scores are materialised versus what a
fused kernel keeps, for one decoder layer of a loaded model.

Memory is counted per tensor. On CUDA the allocator's own high-water mark is exact. A CPU has no allocator
statistics, and the process's peak resident set (what ``workbench.engine.memory_probe`` reads there) misses
memory that the C allocator keeps after a free and hands out again, so a second reading of the same forward
can come out near zero. ``TensorPeak`` instead follows every tensor an operation creates until it is freed:
exact for what PyTorch allocates, blind only to scratch memory inside a single kernel (which for the fused
CPU attention kernel is a few tiles per thread, independent of N). Plain torch and pandas; no widgets here.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench.progress import ProgressFn, no_progress
from workbench.roofline.layer_cost import loglog_slope


# ----------------------------------------------------------------------------------------------- memory
class TensorPeak(TorchDispatchMode):
    """Inside ``with TensorPeak() as peak:``, the high-water mark of bytes held by tensors created in the block.

    Every operation's outputs are followed by their storage (views share one, so nothing counts twice) until
    the storage is freed. Tensors that existed before the block are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata  # the C++ storage's address: the same for every view of it
        if key in self._sizes:
            return
        self._sizes[key] = storage.nbytes()
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key)


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of tensors allocated while ``fn()`` runs (its result is dropped before returning)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with TensorPeak() as tracker:
        fn()
    return tracker.peak


def materialized_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention the textbook way: the full [heads, N, N] score matrix is built, masked and softmaxed.

    q: [N, H, D]; k, v: [N, Hkv, D]. Returns [N, H, D], the same values as the engine's fused attention."""
    n, group = q.shape[0], q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1)
    kh, vh = (t.transpose(0, 1).repeat_interleave(group, dim=0) for t in (k, v))
    scores = (qh @ kh.transpose(1, 2)) * scale
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return (scores.softmax(dim=-1) @ vh).transpose(0, 1)


class MaterializedAttention:
    """An attention backend for `LlamaModel` that materialises the scores of each sequence (no cache)."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return materialized_attention(q, k, v, self.scale)


@torch.inference_mode()
def layer_activation_peak(model: LlamaModel, n: int, *, materialize: bool, layer: int = 0) -> int:
    """Peak bytes one decoder layer allocates for a prefill of ``n`` tokens (its input excluded), with the
    engine's fused attention or with materialised scores."""
    gen = torch.Generator(device=model.device).manual_seed(n)
    x = torch.randn(n, model.spec.hidden_size, device=model.device, dtype=model.dtype, generator=gen)
    cos, sin = model.rope.cos_sin(torch.arange(n, device=model.device), model.dtype)
    scale = model.attention_scale
    backend = MaterializedAttention(scale) if materialize else NoCacheAttention([n], scale)
    return peak_bytes(lambda: model.layers[layer](x, cos, sin, layer, backend), model.device)


def score_matrix_bytes(model: LlamaModel, n: int) -> int:
    """Bytes of one layer's materialised attention scores: query heads x N x N elements."""
    return model.spec.num_heads * n * n * model.embed_tokens.weight.element_size()


def layer_kv_bytes(model: LlamaModel, n: int) -> int:
    """Bytes of one layer's keys and values for N tokens: what a KV cache keeps per layer."""
    spec = model.spec
    return 2 * spec.num_kv_heads * spec.head_dim * n * model.embed_tokens.weight.element_size()


@dataclass(frozen=True)
class AttentionMemory:
    """Per prompt length (index ``tokens``): one layer's activation peak with fused and with materialised
    attention, the score matrix's size and the layer's KV bytes (bytes)."""

    frame: pd.DataFrame
    counted_by: str  # "CUDA allocator" or "tensor bytes counted by the workbench"

    def _last(self, column: str) -> float:
        return float(self.frame[column].iloc[-1])

    @property
    def tokens(self) -> int:
        return int(self.frame.index[-1])

    @property
    def materialized_bytes(self) -> float:
        return self._last("materialized_bytes")

    @property
    def fused_bytes(self) -> float:
        return self._last("fused_bytes")

    @property
    def ratio(self) -> float:
        """Materialised over fused peak at the longest N."""
        return self.materialized_bytes / self.fused_bytes

    @property
    def scores_over_kv(self) -> float:
        return self._last("score_matrix_bytes") / self._last("layer_kv_bytes")

    def slope(self, column: str) -> float:
        """Log-log slope of ``column`` over the longer half of the lengths."""
        upper = self.frame.iloc[len(self.frame) // 2:]
        return loglog_slope(upper.index, upper[column])


def attention_memory(model: LlamaModel, lengths: Sequence[int], *,
                     progress: ProgressFn = no_progress) -> AttentionMemory:
    """One layer's activation peak with fused and with materialised attention at each prompt length, the score
    matrix's size, and the layer's KV bytes."""
    rows = []
    for i, n in enumerate(lengths):
        progress(i, len(lengths), f"N = {n:,}")
        rows.append({"tokens": n, "fused_bytes": layer_activation_peak(model, n, materialize=False),
                     "materialized_bytes": layer_activation_peak(model, n, materialize=True),
                     "score_matrix_bytes": score_matrix_bytes(model, n), "layer_kv_bytes": layer_kv_bytes(model, n)})
    progress(len(lengths), len(lengths), "done")
    counted = "CUDA allocator" if model.device.type == "cuda" else "tensor bytes counted by the workbench"
    return AttentionMemory(pd.DataFrame(rows).set_index("tokens"), counted)
