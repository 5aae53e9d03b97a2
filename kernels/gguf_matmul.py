"""GGUF block weights (Q4_1, Q8_0) multiplied as they are stored: the format, its PyTorch specification, and the
Triton kernel for CUDA.

Why it exists: the real model ships as a GGUF file whose decoder weights are Q4_1 blocks and whose embedding (the
tied LM head) is Q8_0 (`workbench.models.gguf_linear`). Kept as blocks, a batch-1 decode step reads 5 bits per
weight instead of 32; the product must therefore read the blocks and convert them where it multiplies.

A row of ``K`` weights is ``K / 32`` blocks, stored byte for byte as ggml lays them out (``blocks`` [N, K/32 *
BYTES] uint8; little-endian fp16):

    Q4_1  20 bytes: fp16 d, fp16 m, 16 bytes qs     w[j] = d * (qs[j] & 15) + m,  w[j + 16] = d * (qs[j] >> 4) + m
    Q8_0  34 bytes: fp16 d, 32 int8 q               w[j] = d * q[j]

In float32 ``d * q`` is exact (11 + 8 significant bits), so each weight is one rounding of the exact value
(Q4_1) or exact (Q8_0): the numbers a dequantized float32 checkpoint holds, whichever way it computed them.

``gguf_matmul`` dispatches by device: CUDA tensors run the Triton kernel, which loads each tile's bytes, converts
them in registers and multiplies in the activations' dtype (float32 ``ieee``); CPU tensors run the reference
(the engine's CPU products are in `workbench.models.gguf_cpu`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import (
    FLOAT_DTYPES,
    check_launchable,
    check_tensor,
    dot_precision,
    is_interpreted,
    output_tensor,
    tl,
    triton,
)

BLOCK = 32  # weights per block, both formats
# name -> (ggml type id, bytes per block, bytes before the codes)
FORMATS = {"q4_1": (3, 20, 4), "q8_0": (8, 34, 2)}


def check_format(fmt: str) -> tuple[int, int, int]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown GGUF block format {fmt!r}: choose one of {sorted(FORMATS)}")
    return FORMATS[fmt]


def row_bytes(fmt: str, in_features: int) -> int:
    if in_features % BLOCK:
        raise ValueError(f"in_features must be a multiple of {BLOCK} for GGUF blocks, got {in_features}")
    return in_features // BLOCK * check_format(fmt)[1]


def block_fields(blocks: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(d, m, codes)`` of blocks [N, K/32 * BYTES]: d and m [N, K/32] float32 (m None for Q8_0) and the codes
    [N, K] (uint8 0..15 for Q4_1 in weight order, int8 for Q8_0)."""
    _, size, header = check_format(fmt)
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, size)
    d = b[..., 0:2].contiguous().view(torch.float16)[..., 0].float()
    if fmt == "q8_0":
        return d, None, b[..., header:].contiguous().view(torch.int8).reshape(n, -1)
    m = b[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
    qs = b[..., header:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # weights 0..15 from the low nibbles, 16..31 from the high
    return d, m, codes.reshape(n, -1)


def dequantize_blocks(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 weights [N, K] of ``blocks`` (see the module docstring)."""
    check_tensor("blocks", blocks, ndim=2, dtypes=(torch.uint8,))
    size = check_format(fmt)[1]
    if blocks.shape[1] % size:
        raise ValueError(f"blocks have {blocks.shape[1]} bytes per row, not a whole number of {size}-byte {fmt} "
                         "blocks")
    d, m, codes = block_fields(blocks, fmt)
    n = blocks.shape[0]
    w = codes.reshape(n, -1, BLOCK).float() * d[..., None]
    if m is not None:
        w = w + m[..., None]
    return w.reshape(n, -1)


def gguf_matmul_reference(x: torch.Tensor, blocks: torch.Tensor, fmt: str,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """The specification: dequantize the blocks into x's dtype, then an ordinary ``F.linear``."""
    return F.linear(x, dequantize_blocks(blocks, fmt).to(x.dtype), bias)


@triton.jit
def _gguf_matmul_kernel(
    x_ptr,  # [M, K] activations, float32/float16/bfloat16, unit stride along K
    blocks_ptr,  # [N, K/32 * BYTES] uint8, ggml's blocks, rows contiguous
    bias_ptr,  # [N] in x's dtype; never read when HAS_BIAS is False
    out_ptr,  # [M, N] in x's dtype, unit stride along N
    M, N, K,
    stride_xm, stride_om,
    BYTES: tl.constexpr,  # bytes per block: 20 (Q4_1) or 34 (Q8_0)
    IS_Q4_1: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a multiple of 32: whole GGUF blocks per step
    PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """One program computes a [BLOCK_M, BLOCK_N] tile of the output, converting [BLOCK_K, BLOCK_N] weight tiles
    from their bytes in registers."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    row_start = cols.to(tl.int64) * (K // 32 * BYTES)  # [BLOCK_N] byte offset of each weight row
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        block = row_start[None, :] + ((k // 32) * BYTES)[:, None]  # [BLOCK_K, BLOCK_N] each weight's block
        ok = col_ok[None, :] & k_ok[:, None]
        d_lo = tl.load(blocks_ptr + block, mask=ok, other=0).to(tl.uint16)
        d_hi = tl.load(blocks_ptr + block + 1, mask=ok, other=0).to(tl.uint16)
        d = (d_lo | (d_hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        if IS_Q4_1:
            m_lo = tl.load(blocks_ptr + block + 2, mask=ok, other=0).to(tl.uint16)
            m_hi = tl.load(blocks_ptr + block + 3, mask=ok, other=0).to(tl.uint16)
            m = (m_lo | (m_hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
            byte = tl.load(blocks_ptr + block + 4 + (k % 16)[:, None], mask=ok, other=0)
            code = (byte >> (((k % 32) // 16) * 4)[:, None].to(tl.uint8)) & 15
            w = code.to(tl.float32) * d + m
        else:
            code = tl.load(blocks_ptr + block + 2 + (k % 32)[:, None], mask=ok, other=0).to(tl.int8, bitcast=True)
            w = code.to(tl.float32) * d
        if DOT_IN_FP32:
            acc += tl.dot(x.to(tl.float32), w, input_precision=PRECISION)
        else:
            acc += tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check_args(x: torch.Tensor, blocks: torch.Tensor, fmt: str, bias: torch.Tensor | None) -> int:
    """Checks the arguments; returns N."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("blocks", blocks, ndim=2, dtypes=(torch.uint8,), device=x.device)
    if blocks.shape[1] != row_bytes(fmt, x.shape[1]):
        raise ValueError(f"blocks have {blocks.shape[1]} bytes per row but x's {x.shape[1]} inputs need "
                         f"{row_bytes(fmt, x.shape[1])} in {fmt}")
    if not blocks.is_contiguous():
        raise ValueError(f"blocks must be contiguous, got strides {blocks.stride()}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have stride 1 along K, got strides {x.stride()}; call .contiguous()")
    n = blocks.shape[0]
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=(x.dtype,), device=x.device)
        if bias.shape[0] != n:
            raise ValueError(f"bias has {bias.shape[0]} entries, the blocks {n} output rows")
    return n


def gguf_matmul_triton(x: torch.Tensor, blocks: torch.Tensor, fmt: str, bias: torch.Tensor | None = None, *,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize_blocks(blocks).T + bias`` for 2-D x [M, K]; returns [M, N] in x's dtype."""
    n = _check_args(x, blocks, fmt, bias)
    check_launchable(_gguf_matmul_kernel, x.device)
    m, k = x.shape
    out = output_tensor(out, (m, n), x.dtype, x.device)
    block_m = 16 if m <= 16 else 64  # tl.dot needs >= 16; decode batches are small
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    interpreted = is_interpreted(_gguf_matmul_kernel)
    _gguf_matmul_kernel[grid](
        x_ptr=x, blocks_ptr=blocks, bias_ptr=bias if bias is not None else x, out_ptr=out,
        M=m, N=n, K=k, stride_xm=x.stride(0), stride_om=out.stride(0),
        BYTES=check_format(fmt)[1], IS_Q4_1=fmt == "q4_1", HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(x.dtype),
        # The interpreter computes with numpy, which has no bfloat16 arithmetic: there bf16 tiles are widened.
        DOT_IN_FP32=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and interpreted))
    return out


def gguf_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dispatch on device for x [..., K]: CUDA runs the Triton kernel, anything else the reference."""
    if x.device.type != "cuda":
        return gguf_matmul_reference(x, blocks, fmt, bias)
    flat = x.reshape(-1, x.shape[-1])
    return gguf_matmul_triton(flat.contiguous(), blocks, fmt, bias).reshape(*x.shape[:-1], blocks.shape[0])
