"""Chapter 6's arithmetic: weight bytes per format and the book's layered table, recomputed from configs.

Why it exists: the book's quantization hierarchy (70B weights at 140 GB in fp16 or 35 GB in int4, KV of 2.68 or
1.34 GB per 8K sequence, "~16" or "~33" sequences on an 80 GB GPU) is arithmetic on a config, so the package
recomputes it, in both GB (10^9 bytes, the book's unit) and GiB (2^30, what a GPU's "80 GB" really holds), with
the scales a quantized format needs counted.

The engine's formats come from `workbench.cache.sizing` (weights ``auto``/``int8``/``int8_all``/``q4_1``/``q8_0``,
the last two GGUF blocks of 32 weights with fp16 scales, as the real model's file ships them; KV ``auto``,
``fp8_e4m3``, ``int8``, ``int4``). int4 *weights* are not an engine format; their bytes here are arithmetic, for
the book's rows: 4 bits per linear weight plus an fp16 scale and zero per group of 128 (as GPTQ/AWQ store them),
embeddings and LM head left in 16 bits, as those checkpoints leave them.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import dtype_bytes, kv_bytes, weight_bytes
from workbench.config import ModelSpec

GB = 10**9
GiB = 2**30
INT4_GROUP = 128


def linear_weights(spec: ModelSpec) -> int:
    """Weights of the decoder's linear layers (q/k/v, o, gate/up/down), all layers: what int8/int4 formats shrink."""
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return spec.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)


def int4_weight_bytes(spec: ModelSpec, dtype: torch.dtype = torch.bfloat16, group: int = INT4_GROUP) -> int:
    """Arithmetic, not an engine format: linear weights at 4 bits + an fp16 scale and zero per group of
    ``group``; every other parameter (embeddings, LM head, norms) in ``dtype``."""
    linear = linear_weights(spec)
    return (spec.num_parameters() - linear) * dtype_bytes(dtype) + linear // 2 + 4 * (linear // group)


def weight_formats(spec: ModelSpec, dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """Bytes of ``spec``'s weights per format, with bits per parameter and the ratio to ``dtype``."""
    name = str(dtype).removeprefix("torch.")
    rows = {f"{name} (model dtype)": weight_bytes(spec, dtype),
            "int8 (engine: decoder linears)": weight_bytes(spec, dtype, "int8"),
            "int8_all (engine: + LM head)": weight_bytes(spec, dtype, "int8_all"),
            "q4_1 (engine: GGUF Q4_1 blocks, Q8_0 head)": weight_bytes(spec, dtype, "q4_1"),
            "q8_0 (engine: GGUF Q8_0 blocks)": weight_bytes(spec, dtype, "q8_0"),
            "int4, groups of 128 (arithmetic)": int4_weight_bytes(spec, dtype)}
    if dtype != torch.float32:
        rows = {"float32": weight_bytes(spec, torch.float32), **rows}
    frame = pd.DataFrame({"bytes": rows})
    frame["GB"] = frame["bytes"] / GB
    frame["GiB"] = frame["bytes"] / GiB
    frame["bits_per_parameter"] = 8 * frame["bytes"] / spec.num_parameters()
    frame["vs_model_dtype"] = frame["bytes"] / weight_bytes(spec, dtype)
    frame.index.name = "weights"
    return frame


SEED_ROWS = (  # (weights, KV) of the book's layered table, with the sequences it claims on one 80 GB GPU
    ("fp16", "float16", None), ("int4", "float16", 16), ("int4", "fp8_e4m3", 33), ("int4", "int8", 33))


def _weights_of(spec: ModelSpec, name: str, *, seed_units: bool) -> int:
    if seed_units:  # the book: every parameter at 16 or 4 bits, no scales
        return spec.num_parameters() * (2 if name == "fp16" else 1) // (1 if name == "fp16" else 2)
    return weight_bytes(spec, torch.float16) if name == "fp16" else int4_weight_bytes(spec, torch.float16)


def hierarchy_table(spec: ModelSpec, *, context: int = 8192, device_gb: int = 80) -> pd.DataFrame:
    """The book's layered table recomputed for ``spec``: its arithmetic (GB, no scales, the whole device for
    weights + KV) beside what the package counts (scales included; the device's GiB, 90% usable)."""
    rows = []
    for weights, kv, claimed in SEED_ROWS:
        seed_w = _weights_of(spec, weights, seed_units=True)
        seed_kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * context * (2 if kv == "float16" else 1)
        real_w = _weights_of(spec, weights, seed_units=False)
        real_kv = kv_bytes(spec, context, kv_format=kv)
        seed_fit = max((device_gb * GB - seed_w) // seed_kv, 0)
        real_fit = max((int(0.9 * device_gb * GiB) - real_w) // real_kv, 0)
        rows.append({"weights": weights, "kv": kv, "seed_claims": claimed if claimed is not None else "2+ GPUs",
                     "weights_GB_seed_arithmetic": seed_w / GB, "kv_per_seq_GB_seed_arithmetic": seed_kv / GB,
                     "sequences_seed_arithmetic": int(seed_fit), "weights_GiB_with_scales": real_w / GiB,
                     "kv_per_seq_GiB_with_scales": real_kv / GiB, "sequences_80GiB_90pct": int(real_fit)})
    return pd.DataFrame(rows)
