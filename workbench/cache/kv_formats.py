"""The formats a KV cache can store keys and values in, and what each costs per element.

Sizing needs only the storage cost of a format: bits per value plus the scales that quantized formats keep
beside the values. That overhead is real memory, so blocks, concurrency and the notebooks' charts count it.

    auto       the model's own dtype (fp32 on the CPU here, bf16 on a GPU); no scales
    fp8_e4m3   8-bit floats; one scale per (layer, KV head), a constant too small to count per token
    int8       8-bit integers, symmetric, one float16 scale per token per KV head
    int4       4-bit integers packed two per byte, groups of 32 values with a float16 scale and zero point
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.config import ModelSpec

_DTYPE_BITS = {torch.float32: 32, torch.float16: 16, torch.bfloat16: 16}


@dataclass(frozen=True, slots=True)
class KVFormat:
    name: str
    bits: int  # bits per stored key or value element
    group_size: int | None = None  # elements sharing one set of scale parameters (None: the whole head vector)
    scale_bytes_per_group: int = 0  # bytes of scale (and zero point) stored per group; 0 = no per-token scales
    description: str = ""

    def bytes_per_head_vector(self, head_dim: int) -> float:
        """Bytes one key (or value) vector of ``head_dim`` elements takes, scales included."""
        groups = 1 if self.group_size is None else -(-head_dim // self.group_size)
        return head_dim * self.bits / 8 + groups * self.scale_bytes_per_group


QUANTIZED_FORMATS = {
    "fp8_e4m3": KVFormat("fp8_e4m3", 8, None, 0, "8-bit float (e4m3), per-head scales"),
    "int8": KVFormat("int8", 8, None, 2, "8-bit integer, one fp16 scale per token per KV head"),
    "int4": KVFormat("int4", 4, 32, 4, "4-bit integer in groups of 32 with fp16 scale and zero point"),
}
KV_FORMAT_NAMES = ("auto", *QUANTIZED_FORMATS)


def resolve_kv_format(kv_format: str | torch.dtype, model_dtype: torch.dtype = torch.float32) -> KVFormat:
    """A ``KVFormat`` from a name (``auto`` = the model dtype) or a torch dtype."""
    if isinstance(kv_format, torch.dtype):
        if kv_format not in _DTYPE_BITS:
            raise ValueError(f"KV dtype {kv_format} is not supported; use one of {list(_DTYPE_BITS)}")
        return KVFormat(str(kv_format).removeprefix("torch."), _DTYPE_BITS[kv_format],
                        description="unquantized")
    if kv_format == "auto":
        return resolve_kv_format(model_dtype)
    if kv_format in ("float32", "float16", "bfloat16"):
        return resolve_kv_format(getattr(torch, kv_format))
    if kv_format not in QUANTIZED_FORMATS:
        raise ValueError(f"unknown kv_cache_dtype {kv_format!r}: choose one of {list(KV_FORMAT_NAMES)} "
                         "(or float32 / float16 / bfloat16)")
    return QUANTIZED_FORMATS[kv_format]


def format_bytes_per_token(spec: ModelSpec, fmt: KVFormat) -> int:
    """K and V of one token across all layers and KV heads, scales included (rounded up to whole bytes)."""
    per_vector = fmt.bytes_per_head_vector(spec.head_dim)
    return int(-(-2 * spec.num_layers * spec.num_kv_heads * per_vector // 1))
