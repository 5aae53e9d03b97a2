"""The SwiGLU activation ``silu(gate) * up`` over the fused gate/up projection, in one launch.

Why it exists: ``F.silu(gate) * up`` is two launches and a temporary per layer; at batch 1 on a GPU each
launch costs more than its arithmetic (see ``rms_norm``'s docstring for the measured step). One program per
row and column tile reads both halves of the projection once and writes the product.

Rounding follows PyTorch: ``silu`` computed in float32 and rounded to the activations' dtype, then the product
computed in float32 and rounded again (the reference is exactly those operations). ``silu_mul`` dispatches by
device: CUDA tensors run the Triton kernel, CPU tensors the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import FLOAT_DTYPES, check_launchable, check_tensor, check_unit_last_stride, tl, triton

BLOCK_COLS = 1024  # columns per program: SmolLM2's 1,536 in two programs per row, Llama-3-8B's 14,336 in 14


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,  # [rows, 2 * width]: gate in the first half of each row, up in the second
    out_ptr,  # [rows, width]
    stride_in,
    stride_out,
    width,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + width + cols, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)  # silu, rounded as F.silu rounds it
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def _check(gate_up: torch.Tensor) -> None:
    check_tensor("gate_up", gate_up, ndim=2, dtypes=FLOAT_DTYPES)
    check_unit_last_stride("gate_up", gate_up)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up's rows hold gate and up side by side, so their width must be even, got "
                         f"{gate_up.shape[1]}")


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    _check(gate_up)
    check_launchable(_silu_mul_kernel, gate_up.device)
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(width, BLOCK_COLS))](
            gate_up_ptr=gate_up, out_ptr=out, stride_in=gate_up.stride(0), stride_out=out.stride(0), width=width,
            BLOCK=BLOCK_COLS, num_warps=4)
    return out


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """The specification: the two PyTorch operations the unfused layer runs."""
    _check(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.is_cuda:
        return silu_mul_triton(gate_up)
    return silu_mul_reference(gate_up)
