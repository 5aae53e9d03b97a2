"""Int8 weight-only matrix product: the weight format, its PyTorch specification, and the Triton kernel for CUDA.

Why it exists: the engine's ``--weights int8`` stores every linear layer as int8 with one float32 scale per output
channel (`workbench.models.int8_linear`). On a GPU the product must read those int8 bytes and never a dequantized
copy, or the bandwidth saving is lost; the kernel converts each weight tile in registers, multiplies it with the
activations in their own dtype and applies the channel scales to the accumulator.

    s[n] = max(amax_k |w[n, k]|, 1e-12) / 127     float32
    q[n, k] = clamp(round(w[n, k] / s[n]), -127, 127)   int8 (round half to even)
    y[m, n] = sum_k x[m, k] * (q[n, k] * s[n]) + bias[n]

``int8_matmul`` dispatches by device: CUDA tensors run the Triton kernel, CPU tensors the reference (the CPU
engine has a faster product of its own, fbgemm's; see `workbench.models.int8_linear`).
"""

from __future__ import annotations

import torch

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

INT8_MAX = 127
SCALE_FLOOR = 1e-12  # an all-zero row still gets a finite, nonzero scale


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)``: int8 [N, K] and float32 scales [N] of a float weight [N, K]."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(SCALE_FLOOR) / INT8_MAX
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def int8_matmul_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """The specification: dequantize the weight into x's dtype, then an ordinary ``F.linear``."""
    weight = (q.float() * scale[:, None]).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


@triton.jit
def _int8_matmul_kernel(
    x_ptr,  # [M, K] activations, float32/float16/bfloat16, unit stride along K
    q_ptr,  # [N, K] int8 weights, unit stride along K
    scale_ptr,  # [N] float32, one per output channel
    bias_ptr,  # [N] in x's dtype; never read when HAS_BIAS is False
    out_ptr,  # [M, N] in x's dtype, unit stride along N
    M, N, K,
    stride_xm, stride_qn, stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 activations, else "tf32" (ignored for 16-bit inputs)
    DOT_IN_FP32: tl.constexpr,  # widen the tiles first (float32 inputs; bfloat16 under the interpreter)
):
    """One program computes a [BLOCK_M, BLOCK_N] tile of the output."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(q_ptr + cols[None, :].to(tl.int64) * stride_qn + k[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0)  # [BLOCK_K, BLOCK_N]
        # |q| <= 127 is exact in every float dtype, so the conversion loses nothing.
        if DOT_IN_FP32:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision=PRECISION)
        else:
            acc += tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
    acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check_args(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("q", q, ndim=2, dtypes=(torch.int8,), device=x.device)
    check_tensor("scale", scale, ndim=1, dtypes=(torch.float32,), device=x.device)
    if q.shape[1] != x.shape[1] or scale.shape[0] != q.shape[0]:
        raise ValueError(f"shapes disagree: x {tuple(x.shape)} must be [M, K], q {tuple(q.shape)} [N, K] and scale "
                         f"{tuple(scale.shape)} [N]")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=(x.dtype,), device=x.device)
        if bias.shape[0] != q.shape[0]:
            raise ValueError(f"bias has {bias.shape[0]} entries, q has {q.shape[0]} output channels")
    for name, t in (("x", x), ("q", q)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must have stride 1 along K, got strides {t.stride()}; call .contiguous()")


def int8_matmul_triton(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                       *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (q * scale).T + bias`` for 2-D x [M, K]; returns [M, N] in x's dtype."""
    _check_args(x, q, scale, bias)
    check_launchable(_int8_matmul_kernel, x.device)
    (m, k), n = x.shape, q.shape[0]
    out = output_tensor(out, (m, n), x.dtype, x.device)
    block_m = 16 if m <= 16 else 64  # tl.dot needs >= 16; decode batches are small
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_matmul_kernel[grid](
        x_ptr=x, q_ptr=q, scale_ptr=scale, bias_ptr=bias if bias is not None else scale, out_ptr=out,
        M=m, N=n, K=k, stride_xm=x.stride(0), stride_qn=q.stride(0), stride_om=out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION=dot_precision(x.dtype), DOT_IN_FP32=_dot_in_fp32(x.dtype))
    return out


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    # The interpreter computes with numpy, which has no bfloat16 arithmetic (a bf16 tl.dot came out wrong by 2e9
    # here): under it, bf16 tiles are widened. On GPUs 16-bit dots run on tensor cores.
    return dtype == torch.float32 or (dtype == torch.bfloat16 and is_interpreted(_int8_matmul_kernel))


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dispatch on device for x [..., K]: CUDA runs the Triton kernel, anything else the reference."""
    if x.device.type != "cuda":
        return int8_matmul_reference(x, q, scale, bias)
    flat = x.reshape(-1, x.shape[-1])
    return int8_matmul_triton(flat.contiguous(), q, scale, bias).reshape(*x.shape[:-1], q.shape[0])
