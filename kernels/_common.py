"""Plumbing shared by the kernel files: the optional Triton import and the launchers' argument checks.

Why it exists: Triton is a Linux x86-64-only dependency, yet every kernel module must import (and run its PyTorch
reference) everywhere, so the import lives here once with a stand-in; and the three launchers must reject bad
arguments with the same clear, value-naming ``ValueError``s before a bad pointer reaches a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU engine only needs the references
    HAS_TRITON = False

    class _TritonStandIn:
        """Lets ``@triton.jit`` definitions and ``tl.constexpr`` annotations evaluate; launching is refused."""

        constexpr = "constexpr"

        @staticmethod
        def jit(fn=None, **_options):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(n - 1, 0).bit_length()

    triton = tl = _TritonStandIn()

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# tl.dot needs every dimension >= 16 on NVIDIA GPUs, so the query-row, key-tile and head-dim blocks are padded up.
MIN_DOT_DIM = 16
LOG2_E = 1.4426950408889634  # the kernels use exp2, so the softmax scale is folded with log2(e)


def next_pow2_at_least(n: int, floor: int = MIN_DOT_DIM) -> int:
    return max(floor, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    # On GPUs fp32 dots default to TF32 (10-bit mantissa); the float32 path promises float32 accuracy.
    return "ieee" if dtype == torch.float32 else "tf32"


def launch_knobs(num_warps: int | None, num_stages: int | None) -> dict[str, int]:
    """Triton launch options the caller chose (None keeps Triton's default); checked here, not deep in Triton."""
    knobs = {}
    for name, value in (("num_warps", num_warps), ("num_stages", num_stages)):
        if value is None:
            continue
        if not isinstance(value, int) or value < 1 or (name == "num_warps" and value & (value - 1)):
            raise ValueError(f"{name} must be a positive integer (num_warps a power of two), got {value!r}")
        knobs[name] = value
    return knobs


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was created under ``TRITON_INTERPRET=1`` and so runs on CPU tensors."""
    return HAS_TRITON and not isinstance(kernel, triton.runtime.jit.JITFunction)


def check_launchable(kernel, device: torch.device) -> None:
    if not HAS_TRITON:
        raise ValueError("Triton is not installed; use the *_reference function (CPU tensors dispatch there)")
    if device.type != "cuda" and not is_interpreted(kernel):
        raise ValueError(f"Triton kernels need CUDA tensors, got device {device}; CPU tensors run under the "
                         "interpreter only when TRITON_INTERPRET=1 is set before workbench_kernels is imported")


def check_tensor(name: str, t: torch.Tensor, *, ndim: int, dtypes: Iterable[torch.dtype],
                 device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; allowed: {', '.join(str(d) for d in dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the query/key is on {device}; put all arguments on one device")


def check_dim(name: str, t: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if t.shape[dim] != expected:
        raise ValueError(f"{name}.shape[{dim}] is {t.shape[dim]} but must equal {what} ({expected}); "
                         f"{name} has shape {tuple(t.shape)}")


def check_unit_last_stride(name: str, t: torch.Tensor) -> None:
    # Rows are loaded as contiguous vectors; other strides are passed to the kernels, so views are fine.
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {t.stride()}; "
                         "call .contiguous() first")


def check_paged_cache(key_cache: torch.Tensor, value_cache: torch.Tensor, *, num_kv_heads: int | None,
                      head_dim: int, dtype: torch.dtype, device: torch.device, kv_format: str = "auto") -> None:
    """Both caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, alike: in the activations' dtype for
    ``kv_format`` 'auto', else in the format's storage dtype and width (``kv_quant.cache_shapes``)."""
    from .kv_quant import cache_shapes  # late: kv_quant needs nothing from here, this keeps the import graph flat

    layout = cache_shapes(kv_format, 1, 1, 1, head_dim, dtype)
    width, storage = layout["data_shape"][-1], layout["data_dtype"]
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_tensor(name, cache, ndim=4, dtypes=(*FLOAT_DTYPES, torch.float8_e4m3fn, torch.int8, torch.uint8),
                     device=device)
        check_unit_last_stride(name, cache)
        check_dim(name, cache, 3, width, "head_dim" if width == head_dim else "head_dim // 2 (int4: two per byte)")
        if num_kv_heads is not None:
            check_dim(name, cache, 2, num_kv_heads, "num_kv_heads")
        if cache.dtype != storage and kv_format == "auto":
            raise ValueError(f"{name} has dtype {cache.dtype} but the activations are {dtype}; with kv_format "
                             "'auto' the cache must hold the activations' dtype (quantized caches need kv_format "
                             "'fp8_e4m3', 'int8' or 'int4')")
        if cache.dtype != storage:
            raise ValueError(f"{name} has dtype {cache.dtype} but kv_format {kv_format!r} stores {storage}")
    if key_cache.shape != value_cache.shape or key_cache.stride() != value_cache.stride():
        raise ValueError(f"key_cache {tuple(key_cache.shape)} strides {key_cache.stride()} and value_cache "
                         f"{tuple(value_cache.shape)} strides {value_cache.stride()} must match")


def check_gqa(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    return num_heads // num_kv_heads


def check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def check_block_tables(block_tables: torch.Tensor, num_seqs: int, device: torch.device) -> None:
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES, device=device)
    check_dim("block_tables", block_tables, 0, num_seqs, "the number of sequences")
    check_unit_last_stride("block_tables", block_tables)


def output_tensor(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """``out`` after checking it (callers may pass a preallocated or poisoned buffer), else a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor("out", out, ndim=len(shape), dtypes=(dtype,), device=device)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    check_unit_last_stride("out", out)
    return out
