"""Batch-invariant mode: a request's logits do not depend on what else is in its batch.

Why they normally do: floating-point addition is not associative, and a fast matrix product picks how it splits
and orders its sums by the shape it is given. Measured on this project's CPU (fp32, oneDNN / MKL): a 1-row
product with K = 1536 rounds differently from the same row inside a 2-row product; a batched ``matmul`` over
more than a few rows differs from the same rows taken a few at a time; and PyTorch's attention gives a decode
row, the same row inside a whole prefill, and inside a chunk three different roundings (~2e-7 apart). So the
same prompt decoded alone and beside other traffic, or with its prompt chunked differently, or read back from
the prefix cache, gets logits ~1e-5 apart, and a greedy choice between two close tokens flips.

The mode fixes the *shape* of every reduction a row takes part in, whatever its neighbours:

- linear layers run in tiles of exactly ``ROW_TILE`` rows (the last tile padded with zeros), so every row goes
  through the same product shape whether the batch has 1 row or 1,000;
- attention computes each query row in tiles of ``ROW_TILE`` rows over blocks of exactly ``KEY_BLOCK`` keys
  with an online softmax: a row sees keys 0..p through the same sequence of block-sized products and the same
  running max and sum whether it is a decode step, part of a whole prefill or of a chunk, or reads its prefix
  from the cache (blocks past a row's position are masked to exactly zero weight and change nothing);
- norms, RoPE and activations already reduce within a row only.

Attention: `workbench.cache.invariant_attention`. Checked by tests/engine/test_batch_invariant.py: bit-identical
logits for one request alone and inside varied batches, with chunked prefill, prefix hits, preemption and every
KV format. It costs throughput (padding, and products split into tiles): chapter 10 measures how much. The same
rules would make the Triton kernels batch-invariant on a GPU (fixed split sizes, no split-K chosen by batch
size); this is the PyTorch path, used on every device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from workbench.intmath import ceil_div

ROW_TILE = 16

_ROW_INVARIANT: ContextVar[bool] = ContextVar("row_invariant_products", default=False)


@contextmanager
def row_invariant_products() -> Iterator[None]:
    """Within this block, `workbench.models.cpu_linear.Linear` computes in fixed row tiles (see module doc)."""
    token = _ROW_INVARIANT.set(True)
    try:
        yield
    finally:
        _ROW_INVARIANT.reset(token)


def products_are_row_invariant() -> bool:
    return _ROW_INVARIANT.get()


def in_row_tiles(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """``fn`` (a row-wise map such as a linear layer) applied to ``x`` [rows, ...] ``tile`` rows at a time, the last
    tile padded with zeros: every call sees the same shape, so a row's result cannot depend on its neighbours."""
    rows = x.shape[0]
    padded = ceil_div(rows, tile) * tile
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, *x.shape[1:])])
    return torch.cat([fn(x[i:i + tile]) for i in range(0, padded, tile)])[:rows]
