"""RMSNorm with the residual add before it, in one launch: the two norms of every decoder layer.

Why it exists: at batch 1 a small model's decode step is a few hundred tiny kernels, and on a GPU each costs
its launch and its gap, not its bytes (SmolLM2-135M: 30 layers, ~18 launches each, 2.3 ms per step on an H100
with CUDA graphs, of which the weights take 0.1 ms to read). A layer does ``x = x + sublayer(...)`` and then
normalises ``x``: two passes over the row and, in PyTorch, two to six launches. Here one program per row adds,
writes the new residual stream back in place, and normalises.

The arithmetic is PyTorch's ``F.rms_norm`` (float32 inside, the gain multiplied in float32, one rounding at
the end) after a residual add rounded to the activations' dtype, as ``x + y`` rounds it; the reference below is
exactly those two PyTorch operations. ``rms_norm`` dispatches by device: CUDA tensors run the Triton kernel,
CPU tensors the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import FLOAT_DTYPES, check_launchable, check_tensor, check_unit_last_stride, tl, triton


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,  # [rows, hidden] the sublayer's output (or the first layer's input)
    residual_ptr,  # [rows, hidden] the residual stream; becomes x + residual in place when HAS_RESIDUAL
    weight_ptr,  # [hidden] the norm's gain
    out_ptr,  # [rows, hidden] the normalised rows
    stride_x,
    stride_r,
    stride_o,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,  # hidden rounded up to a power of two: one row per program
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as PyTorch rounds x + residual
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight has {weight.shape[0]} entries but x's rows have {x.shape[1]}")
    check_unit_last_stride("x", x)
    if residual is not None:
        check_tensor("residual", residual, ndim=2, dtypes=(x.dtype,), device=x.device)
        if residual.shape != x.shape:
            raise ValueError(f"residual has shape {tuple(residual.shape)}, x {tuple(x.shape)}: they must match")
        check_unit_last_stride("residual", residual)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel: ``rms_norm(x + residual) * weight``, writing ``x + residual`` into ``residual``."""
    _check(x, weight, residual)
    check_launchable(_add_rms_norm_kernel, x.device)
    out = torch.empty_like(x)
    rows, hidden = x.shape
    if rows:
        block = triton.next_power_of_2(hidden)
        _add_rms_norm_kernel[(rows,)](
            x_ptr=x, residual_ptr=residual if residual is not None else x, weight_ptr=weight, out_ptr=out,
            stride_x=x.stride(0), stride_r=residual.stride(0) if residual is not None else 0, stride_o=out.stride(0),
            hidden=hidden, eps=float(eps), HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=4 if block >= 2048 else (2 if block >= 512 else 1))
    return out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None) -> torch.Tensor:
    """The specification: PyTorch's add, then ``F.rms_norm``; ``residual`` (if given) becomes ``x + residual``."""
    _check(x, weight, residual)
    if residual is not None:
        residual.add_(x)
        x = residual
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Normalise the rows of ``x`` (after adding it into ``residual`` in place, when given)."""
    if x.is_cuda:
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_reference(x, weight, eps, residual)
