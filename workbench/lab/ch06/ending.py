"""Chapter 6's closing material: where the seed is loose (with numbers), the 'Try this' exercises, the takeaways.

Why it exists: every number the notebook's call-outs and closing table state is computed here from the
package's sizing arithmetic or from the chapter's own measurements (`workbench.lab.ch06.panels`), never typed in.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import kv_bytes, kv_bytes_per_token, weight_bytes
from workbench.lab.ch06.memory import GB, GiB, hierarchy_table, int4_weight_bytes
from workbench.lab.kit.exercises import Exercise
from workbench.models import model_spec

H100_TBPS, A100_TBPS = 3.35, 2.0  # the seed's bandwidth figures (H100 SXM, A100 80GB SXM: 2.04 TB/s)
SEED_SPEC = "llama-3-70b"  # the seed's "80 layers, 8 KV heads, head dim 128" model


def seed_checks(kv_table: pd.DataFrame) -> pd.DataFrame:
    """The seed's loose statements against the package's arithmetic and the KV panel's measurements."""
    spec = model_spec(SEED_SPEC)
    fp16_kv = kv_bytes(spec, 8192, kv_format="float16")
    int8_kv = kv_bytes(spec, 8192, kv_format="int8")
    fp16_w = weight_bytes(spec, torch.float16)
    int4_w = int4_weight_bytes(spec, torch.float16)
    fp8, int8 = kv_table.loc["fp8_e4m3"], kv_table.loc["int8"]
    closer = "int8" if int8.kl_mean < fp8.kl_mean else "fp8"
    rows = [
        ("int8 KV of an 8K sequence is 1.34 GB, the same as fp8",
         f"{int8_kv / GB:.3f} GB with its fp16 scale per token and head, {int8_kv / (fp16_kv / 2) - 1:.1%} over "
         f"half of fp16's {fp16_kv / GB:.3f} GB; fp8 keeps one scale per layer and head: {fp16_kv / 2 / GB:.3f} GB",
         "loose: int8 needs scales"),
        ("fp8 KV has near-fp16 quality; int8 is 'more aggressive'",
         f"measured here (per-token int8 scales, calibrated static fp8 scales): mean KL int8 {int8.kl_mean:.2e}, "
         f"fp8 {fp8.kl_mean:.2e}; top-1 {int8.top1_agreement:.3f} vs {fp8.top1_agreement:.3f}",
         f"{'wrong here' if closer == 'int8' else 'holds here'}: {closer} is closer to full precision"),
        ("70B weights: 140 GB in fp16, 35 GB in int4",
         f"Llama-3-70B: {fp16_w / GB:.1f} GB = {fp16_w / GiB:.1f} GiB in fp16; int4 with a scale and zero per 128 "
         f"values and 16-bit embeddings/head: {int4_w / GB:.1f} GB = {int4_w / GiB:.1f} GiB",
         "loose: GB vs GiB, and int4 checkpoints are not a quarter"),
        ("H100 (3.35 TB/s) moves data 'nearly twice as fast' as A100 (2.0 TB/s)",
         f"{H100_TBPS} / {A100_TBPS} = {H100_TBPS / A100_TBPS:.3f}×", "loose: 1.68×, not ~2×"),
    ]
    return pd.DataFrame(rows, columns=["the seed says", "computed / measured here", "verdict"])


def seed_hierarchy() -> pd.DataFrame:
    """The seed's layered table for its 70B model (`workbench.lab.ch06.memory.hierarchy_table`)."""
    return hierarchy_table(model_spec(SEED_SPEC))


def _exercises() -> dict[str, Exercise]:
    small, big = model_spec("smollm2-135m"), model_spec(SEED_SPEC)
    table = hierarchy_table(big)
    return {
        "int8_kv_bytes": Exercise(
            "Bytes per token of SmolLM2-135M's KV cache in int8, scales included (30 layers, 3 KV heads of 64)?",
            lambda: kv_bytes_per_token(small, "int8"),
            why="2 (K, V) × 30 layers × 3 heads × (64 one-byte values + a 2-byte fp16 scale)", rel_tol=0.0,
            hint="each head of each token stores its 64 values and one fp16 scale"),
        "int4_fp8_sequences": Exercise(
            "8,192-token sequences of Llama-3-70B that fit beside int4 weights with fp8 KV on an '80 GB' GPU "
            "(80 GiB, 90% usable)?",
            lambda: int(table.set_index(["weights", "kv"]).loc[("int4", "fp8_e4m3"), "sequences_80GiB_90pct"]),
            why="(0.9 × 80 GiB − int4 weights with group scales) // (KV bytes of one 8K sequence at 1 byte)",
            rel_tol=0.0, hint="use seed_hierarchy() for the weight and KV sizes, then floor the division"),
        "bandwidth_ratio": Exercise(
            "By what factor does H100's 3.35 TB/s beat A100's 2.0 TB/s on a bandwidth-bound decode step?",
            lambda: H100_TBPS / A100_TBPS, why="decode time ∝ bytes read / bandwidth, so the ratio of bandwidths",
            rel_tol=0.01),
    }


EXERCISES = _exercises()


def takeaways(kv_table: pd.DataFrame, weights: pd.DataFrame, sweep: pd.DataFrame) -> pd.DataFrame:
    """The seed's five takeaways against this chapter's measurements (live panels and the cached sweep)."""
    fp32_kv, int8_kv, fp8_kv = kv_table.loc["auto"], kv_table.loc["int8"], kv_table.loc["fp8_e4m3"]
    fp32_fp32 = sweep[(sweep.weights == "auto") & (sweep.dtype == "float32") & (sweep.kv_format == "auto")].iloc[0]
    both = sweep[(sweep.weights == "int8") & (sweep.kv_format == "int8")].iloc[0]
    only_w = sweep[(sweep.weights == "int8") & (sweep.kv_format == "auto")].iloc[0]
    only_kv = sweep[(sweep.weights == "auto") & (sweep.dtype == "float32") & (sweep.kv_format == "int8")].iloc[0]
    recall = [c for c in sweep.columns if c.startswith("recall@")]
    int4 = sweep[(sweep.weights == "auto") & (sweep.dtype == "float32") & (sweep.kv_format == "int4")].iloc[0]
    w8 = weights.loc["int8"] if "int8" in weights.index else None
    speed = f"int8 weights decode at {w8.speedup_vs_fp32:.2f}× fp32 on this CPU" if w8 is not None else ""
    more = int8_kv.sequences_at_budget > fp32_kv.sequences_at_budget
    adds = max(only_w.kl_mean, only_kv.kl_mean) <= both.kl_mean <= 1.5 * (only_w.kl_mean + only_kv.kl_mean)
    int8_closer = int8_kv.kl_mean < fp8_kv.kl_mean
    int4_recall = [int4[c] for c in recall]
    base_recall = [fp32_fp32[c] for c in recall]
    recall_kept = bool(recall) and all(a >= b for a, b in zip(int4_recall, base_recall, strict=True))
    rows = [
        ("KV quantization (fp8, int8) shrinks the cache and enlarges batches.",
         f"at the panel's budget: {int(fp32_kv.sequences_at_budget)} sequences with an fp32 cache, "
         f"{int(int8_kv.sequences_at_budget)} with int8 ({int8_kv.vs_fp32:.3f}× the bytes per token)",
         "holds" if more else "wrong"),
        ("Weight and cache quantization are independent: layer them.",
         f"cached sweep: mean KL int8 weights {only_w.kl_mean:.2e}, int8 KV {only_kv.kl_mean:.2e}, both "
         f"{both.kl_mean:.2e}; memory for one 2K sequence {_mib(both):.0f} vs {_mib(fp32_fp32):.0f} MiB",
         "holds (the errors roughly add)" if adds else "holds, but the errors do not simply add"),
        ("fp8 is the practical KV default: minimal loss, 50% saving.",
         f"fp8 saves {1 - fp8_kv.vs_fp32 / 2:.0%} against 16-bit ({1 - fp8_kv.vs_fp32:.0%} against fp32 here); "
         f"KL {fp8_kv.kl_mean:.2e} vs int8's {int8_kv.kl_mean:.2e}",
         "holds with a caveat: int8 with per-token scales was closer here" if int8_closer else "holds"),
        ("Quality impact is task-dependent: benchmark your workload.",
         f"int4 KV: top-1 agreement {int4.top1_agreement:.3f}; recall " +
         ", ".join(f"{c} {a:.2f} (fp32 cache {b:.2f})" for c, a, b in zip(recall, int4_recall, base_recall,
                                                                         strict=True)),
         "holds: token-level quality drops while recall holds" if recall_kept and int4.top1_agreement < 0.95
         else "holds: measure both, they need not move together"),
        ("Hardware matters: native fp8 speeds up H100/H200; on A100 the gain is mostly memory.",
         f"not measurable on this CPU (no fp8 arithmetic); {speed}; the bandwidth gap is "
         f"{H100_TBPS / A100_TBPS:.2f}×", "not tested here"),
    ]
    return pd.DataFrame(rows, columns=["the seed's takeaway", "measured here", "verdict"])


def _mib(row: pd.Series, context: int = 2048) -> float:
    return (row.weight_bytes + row.kv_bytes_per_token * context) / 2**20
