"""Faster matrix products on the CPU: linear layers with weights pre-packed for oneDNN.

On the 2-core CI machine (AVX-512), ``F.linear`` reads the weights at about 11 GB/s during decode, on one core.
oneDNN with weights reordered once into its blocked layout (what PyTorch's own compiler does for frozen CPU
models, through the same ``torch.ops.mkldnn`` operators) uses both cores and its best kernels. Measured here
(SmolLM2-135M shapes, fp32, microseconds, F.linear -> packed):

    LM head 49152x576:  M=1 10449 -> 4422   M=8 14685 -> 3825   M=32 22438 -> 9653
    gate/up 3072x576:   M=1   142 ->   73   M=8   377 ->  152   M=32   798 ->  527

The packing takes a batch-size hint; 8 was as fast as the best hint at every M from 1 to 300 (hint 1 doubled
the time at M=8). These operators are internal to PyTorch, so packing checks itself against ``F.linear`` on
a random input and quietly falls back to ``F.linear`` wherever it is unavailable or disagrees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.row_invariant import in_row_tiles, products_are_row_invariant

PACK_BATCH_HINT = 8


def _packing_available() -> bool:
    return (hasattr(torch.ops, "mkldnn") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.backends.mkldnn.is_available())


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16) or not _packing_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
        probe = torch.randn(3, weight.shape[1], dtype=weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
        want = F.linear(probe, weight.detach())
        tol = 1e-4 if weight.dtype == torch.float32 else 5e-2
        if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max())):
            return None
        return packed
    except (RuntimeError, NotImplementedError):
        return None


class Linear(nn.Linear):
    """``nn.Linear`` that uses a oneDNN-packed copy of its weight on the CPU once ``pack()`` has run.

    The packed copy is derived data: ``weight`` stays the source of truth (loading, saving, comparing with
    transformers), and anything that changes the weight must call ``pack()`` again (`LlamaModel.prepare`).
    """

    packed: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed = _pack(self.weight)

    def unpack(self) -> None:
        self.packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and products_are_row_invariant():
            return in_row_tiles(self._product, x)
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.device.type == "cpu" and x.dtype == self.packed.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
