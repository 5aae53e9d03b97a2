"""Rotary position embedding of the query and key heads, in place in the fused q/k/v projection, one launch.

Why it exists: rotating q and k the way Hugging Face's Llama does ("rotate half": ``x * cos + cat(-x2, x1) *
sin``) takes five elementwise launches per layer in PyTorch (negate, concatenate, two products, a sum) plus a
copy; at batch 1 on a GPU those launches, not their bytes, are what a small model's decode step costs (see
``rms_norm``). Here one program per token reads its position, looks up the float32 cos/sin rows itself, and
rotates every query and key head of that token where the projection wrote them.

The kernel computes each rotated value in float32 from the float32 tables and rounds once; the unfused
operations (the reference) round the tables, both products and the sum to the activations' dtype, so the two
agree to a rounding step or two (a first version copied every rounding to be bit-exact and still differed on an
H200 by one step in 16-bit, while matching under the interpreter: the compiled code does not keep an
intermediate rounding the way the source states it). ``rotary`` dispatches by device: CUDA runs the Triton
kernel, CPU the reference.
"""

from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, INDEX_DTYPES, check_launchable, check_tensor, check_unit_last_stride, tl, triton


@triton.jit
def _rotary_kernel(
    qkv_ptr,  # [tokens, >= num_heads * HEAD_DIM]: the first num_heads heads (q then k) are rotated in place
    positions_ptr,  # [tokens] int32/int64: each token's absolute position
    cos_ptr,  # [max_positions, HEAD_DIM] float32
    sin_ptr,  # [max_positions, HEAD_DIM] float32
    stride_t,
    stride_table,
    num_heads,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,  # num_heads rounded up to a power of two
    BLOCK_HALF: tl.constexpr,  # HALF rounded up to a power of two
):
    t = tl.program_id(0)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    d_mask = d < HALF
    mask = (h < num_heads) & d_mask
    first = qkv_ptr + t * stride_t + h * HEAD_DIM + d
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    row = pos * stride_table + d
    c1 = tl.load(cos_ptr + row, mask=d_mask, other=0.0)
    c2 = tl.load(cos_ptr + row + HALF, mask=d_mask, other=0.0)
    s1 = tl.load(sin_ptr + row, mask=d_mask, other=0.0)
    s2 = tl.load(sin_ptr + row + HALF, mask=d_mask, other=0.0)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    # "rotate half": first half x1 * cos - x2 * sin, second half x2 * cos + x1 * sin, in float32, rounded once
    tl.store(first, (a * c1 - b * s1).to(x1.dtype), mask=mask)
    tl.store(first + HALF, (b * c2 + a * s2).to(x1.dtype), mask=mask)


def _check(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
           head_dim: int) -> None:
    check_tensor("qkv", qkv, ndim=2, dtypes=FLOAT_DTYPES)
    check_unit_last_stride("qkv", qkv)
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES, device=qkv.device)
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(name, table, ndim=2, dtypes=(torch.float32,), device=qkv.device)
        if table.shape[1] != head_dim or table.stride(1) != 1:
            raise ValueError(f"{name} must be a [positions, head_dim={head_dim}] table with unit last stride, "
                             f"got shape {tuple(table.shape)}")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} tables must match")
    if positions.shape[0] != qkv.shape[0]:
        raise ValueError(f"{positions.shape[0]} positions for {qkv.shape[0]} tokens")
    if head_dim % 2 or num_heads < 1 or num_heads * head_dim > qkv.shape[1]:
        raise ValueError(f"cannot rotate {num_heads} heads of {head_dim} (even) in rows of {qkv.shape[1]}")


def rotary_triton(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                  num_heads: int, head_dim: int) -> None:
    """Rotate the first ``num_heads`` heads of every row of ``qkv`` in place by ``positions``."""
    _check(qkv, positions, cos, sin, num_heads, head_dim)
    check_launchable(_rotary_kernel, qkv.device)
    if qkv.shape[0]:
        half = head_dim // 2
        _rotary_kernel[(qkv.shape[0],)](
            qkv_ptr=qkv, positions_ptr=positions, cos_ptr=cos, sin_ptr=sin, stride_t=qkv.stride(0),
            stride_table=cos.stride(0), num_heads=num_heads, HEAD_DIM=head_dim, HALF=half,
            BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_HALF=triton.next_power_of_2(half), num_warps=4)


def rotary_reference(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                     num_heads: int, head_dim: int) -> None:
    """The specification: the unfused PyTorch rotation (gather the rows, round them, rotate half), in place."""
    _check(qkv, positions, cos, sin, num_heads, head_dim)
    x = qkv[:, : num_heads * head_dim].view(qkv.shape[0], num_heads, head_dim)
    c = cos.index_select(0, positions.long()).unsqueeze(1).to(qkv.dtype)
    s = sin.index_select(0, positions.long()).unsqueeze(1).to(qkv.dtype)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    x.copy_(x * c + rotated * s)


def rotary(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, num_heads: int,
           head_dim: int) -> None:
    if qkv.is_cuda:
        rotary_triton(qkv, positions, cos, sin, num_heads=num_heads, head_dim=head_dim)
    else:
        rotary_reference(qkv, positions, cos, sin, num_heads=num_heads, head_dim=head_dim)
