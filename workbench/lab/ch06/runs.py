"""Chapter 6's measurements as result objects: what the panels draw, the prose reads and the closing table judges.

- `kv_formats` → `KVFormats`: each KV format's bytes per token (scales counted) and its quality against the fp32
  cache on a slice of the held-out text; blocks and sequences at a budget are re-divided without re-measuring;
- `weight_format_row` → rows of `WeightFormats`: batch-1 decode speed and quality of a weight format beside fp32,
  with llama.cpp's decode on the same GGUF file (`llama_cpp_decode`);
- `activation_rounding` → `ActivationRounding`: one layer's real inputs through int8 weights four ways;
- `format_sweep` → `FormatSweep`: the benchmark's cached weight × KV sweep (measured engine-side,
  `workbench.quality.format_sweep`), with memory per configuration and what a quantized KV costs in speed.

No widgets here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from workbench.cache.calibration import calibration_ids
from workbench.cache.sizing import kv_bytes_per_token, max_concurrency, weight_bytes
from workbench.lab.ch06.activations import VARIANTS, capture_inputs, rounding_errors, spread
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.notebook import GiB, MiB
from workbench.models.int8_linear import model_weight_bytes, quantize_model_weights
from workbench.models.registry import shipped_source
from workbench.progress import ProgressFn, no_progress
from workbench.quality.format_sweep import (
    BLOCK_SIZE,
    SWEEP_PATH,
    decode_tokens_per_s,
    heldout_ids,
    load_sweep,
)
from workbench.quality.teacher_forcing import compare_logits, logits_through_cache
from workbench.timing import describe_machine
from workbench_kernels.kv_quant import KV_FORMATS, cache_shapes

WEIGHT_NAMES = {"fp32": "fp32", "int8": "int8 linears", "int8_all": "int8 linears + LM head", "bf16": "bfloat16",
                "q4_1": "GGUF Q4_1 as shipped", "q8_0": "GGUF Q8_0"}


def kv_breakdown(spec, kv_format: str, model_dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """Bytes per token across all layers, K and V: the values themselves and the per-slot scales beside them."""
    total = kv_bytes_per_token(spec, kv_format, model_dtype)
    shapes = cache_shapes(kv_format, 1, 1, spec.num_kv_heads, spec.head_dim, model_dtype)
    per_slot = torch.empty(shapes["data_shape"], dtype=shapes["data_dtype"]).nbytes
    data = 2 * spec.num_layers * per_slot
    return {"bytes_per_token": total, "data_bytes": data, "scale_bytes": total - data}


def saving(bytes_per_token: float, reference_bytes: float) -> float:
    """The share of ``reference_bytes`` a format saves: 1 - bytes / reference (fp8 against 16 bits: 0.5)."""
    return 1.0 - bytes_per_token / reference_bytes


def heldout_slice(tokenizer, tokens: int) -> list[int]:
    return heldout_ids(tokenizer, tokens)


def quality_against(reference: torch.Tensor, logits: torch.Tensor, ids: list[int]) -> dict[str, float]:
    targets = torch.tensor(ids[1:], device=logits.device)
    return compare_logits(reference[:-1].to(logits.device).float(), logits[:-1].float(), targets)


# ------------------------------------------------------------------------------------------------ KV formats
@dataclass(frozen=True)
class KVFormats:
    """Per KV format (index): bytes_per_token, data_bytes, scale_bytes and quality against the fp32 cache on
    ``tokens`` held-out tokens; ``bytes_16bit`` is what a 16-bit cache of the same model stores per token."""

    frame: pd.DataFrame
    tokens: int
    bytes_16bit: int

    def table(self, budget_gib: float = 1.0, context: int = 2048) -> pd.DataFrame:
        """The measured frame plus blocks and sequences of ``context`` tokens in ``budget_gib`` of KV."""
        frame = self.frame.copy()
        budget = int(budget_gib * GiB)
        frame["blocks_at_budget"] = budget // (frame["bytes_per_token"] * BLOCK_SIZE)
        frame["sequences_at_budget"] = [max_concurrency(int(b), BLOCK_SIZE, context)
                                        for b in frame["blocks_at_budget"]]
        frame["vs_fp32"] = frame["bytes_per_token"] / frame.loc["auto", "bytes_per_token"]
        return frame

    def saving_vs_16bit(self, kv_format: str) -> float:
        return saving(float(self.frame.loc[kv_format, "bytes_per_token"]), self.bytes_16bit)

    def saving_vs_fp32(self, kv_format: str) -> float:
        return saving(float(self.frame.loc[kv_format, "bytes_per_token"]),
                      float(self.frame.loc["auto", "bytes_per_token"]))

    @property
    def int8_closer_than_fp8(self) -> bool:
        return bool(self.frame.loc["int8", "kl_mean"] < self.frame.loc["fp8_e4m3", "kl_mean"])


def kv_formats(model, tokenizer, tokens: int, *, progress: ProgressFn = no_progress) -> KVFormats:
    """Teacher-force ``tokens`` held-out tokens through every KV format and compare with the fp32 cache."""
    ids = heldout_slice(tokenizer, tokens)
    reference = logits_through_cache(model, ids, "auto")
    rows = []
    for i, fmt in enumerate(KV_FORMATS):
        progress(i, len(KV_FORMATS), f"teacher-forcing {len(ids)} tokens through a {fmt} cache")
        calibration = calibration_ids(model, tokenizer) if fmt == "fp8_e4m3" else None
        logits = reference if fmt == "auto" else logits_through_cache(model, ids, fmt, calibration_ids=calibration)
        rows.append({"kv_format": fmt, **kv_breakdown(model.spec, fmt, model.dtype),
                     **quality_against(reference, logits, ids)})
    return KVFormats(pd.DataFrame(rows).set_index("kv_format"), len(ids),
                     kv_bytes_per_token(model.spec, "float16", model.dtype))


# -------------------------------------------------------------------------------------------- weight formats
def weight_variant(model, name: str):
    """The loaded fp32 model in another weight format: a quantized copy, or a bfloat16 copy. The oneDNN-packed
    weights cannot be deep-copied, so the model is unpacked for the copy and packed again."""
    if name == "fp32":
        return model
    packed = any(getattr(m, "packed", None) is not None for m in model.modules())
    model.prepare(pack=False)
    try:
        clone = copy.deepcopy(model)
    finally:
        model.prepare(pack=packed)
    if name == "bf16":
        clone = clone.to(torch.bfloat16)
    else:  # the GGUF formats keep the file's own blocks when the model is the real one
        clone = quantize_model_weights(clone, name, shipped_source(clone) if name in ("q4_1", "q8_0") else None)
    return clone.prepare(pack=packed)


def weight_format_row(model, tokenizer, name: str, ids: list[int], reference: torch.Tensor, *,
                      decode_tokens: int = 32, repeats: int = 2, progress: ProgressFn = no_progress) -> dict:
    """One weight format: bytes (formula and allocated), best-of-``repeats`` batch-1 decode speed, and quality on
    ``ids`` against ``reference`` (the fp32 model's logits, fp32 cache)."""
    variant = weight_variant(model, name)
    progress(0, 2, f"{name}: {decode_tokens} decode tokens x {repeats}")
    speed = max(decode_tokens_per_s(variant, tokenizer, tokens=decode_tokens) for _ in range(repeats))
    progress(1, 2, f"{name}: teacher-forcing {len(ids)} held-out tokens")
    logits = reference if name == "fp32" else logits_through_cache(variant, ids, "auto")
    return {"weights": name, "weight_bytes_formula": weight_bytes(variant.spec, variant.dtype,
                                                                  getattr(variant, "weight_format", "auto")),
            "weight_bytes_allocated": model_weight_bytes(variant), "decode_tokens_per_s": speed,
            **quality_against(reference, logits, ids)}


@dataclass(frozen=True)
class PeerLine:
    """llama.cpp's batch-1 decode on the same GGUF file: run now on this machine, or a stored run elsewhere."""

    tokens_per_s: float
    label: str
    live: bool


def llama_cpp_decode(decode_tokens: int, threads: int) -> PeerLine | None:
    """llama-bench's ``tg`` tokens/s on the real model's GGUF: measured now where ``llama-bench`` is built on this
    machine (`workbench.llamacpp`), else the stored side-by-side run (labelled with its machine), else None."""
    from workbench import llamacpp
    from workbench.models.convert import find_gguf

    if llamacpp.llama_bench_path().is_file():
        speed = llamacpp.run_llama_bench(find_gguf(), threads, 0, decode_tokens, repetitions=2)["decode"]
        return PeerLine(speed, f"llama.cpp llama-bench tg{decode_tokens}, {threads} threads, measured now on this "
                               "machine", live=True)
    stored = llamacpp.load_result()
    return None if stored is None else PeerLine(stored.decode["llama.cpp"], stored.label, live=False)


@dataclass(frozen=True)
class WeightFormats:
    """The weight formats measured so far (index; fp32 first), with speed-up and bytes relative to fp32, and
    llama.cpp's decode on the same GGUF file where it could be had (``peer``)."""

    rows: tuple[dict, ...]
    tokens: int
    peer: PeerLine | None = None

    @property
    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(list(self.rows)).set_index("weights")
        frame["speedup_vs_fp32"] = frame["decode_tokens_per_s"] / frame.loc["fp32", "decode_tokens_per_s"]
        frame["bytes_vs_fp32"] = frame["weight_bytes_allocated"] / frame.loc["fp32", "weight_bytes_allocated"]
        return frame

    def speedup(self, name: str) -> float | None:
        frame = self.frame
        return float(frame.loc[name, "speedup_vs_fp32"]) if name in frame.index else None

    def baseline(self, model) -> Baseline:
        """Section 5's fp32 batch-1 decode, for the cross-chapter registry."""
        return Baseline(chapter="ch06", machine=describe_machine(model.device),
                        dtype=str(model.dtype).removeprefix("torch."),
                        source="section 5's weight-format panel: fp32 weights and cache, batch-1 decode of 32 tokens "
                               "(the best of two runs), one step = 1 / its tokens per second",
                        decode_step_ms=1e3 / float(self.frame.loc["fp32", "decode_tokens_per_s"]))


# ---------------------------------------------------------------------------------------------- activations
@dataclass(frozen=True)
class ActivationRounding:
    """`rounding_errors` (per variant of `VARIANTS`) and `spread` of one layer's inputs."""

    errors: pd.DataFrame
    spread: dict[str, float]
    layer: int
    projection: str

    @property
    def weights_only(self) -> float:
        return float(self.errors.loc[VARIANTS[0], "relative_error"])

    @property
    def per_tensor(self) -> float:
        return float(self.errors.loc[VARIANTS[1], "relative_error"])

    @property
    def per_token(self) -> float:
        return float(self.errors.loc[VARIANTS[2], "relative_error"])

    @property
    def split_rows(self) -> float:
        return float(self.errors.loc[VARIANTS[3], "relative_error"])


def activation_rounding(model, ids: list[int], layer: int, projection: str) -> ActivationRounding:
    x, weight = capture_inputs(model, ids, layer, projection)
    return ActivationRounding(rounding_errors(x, weight), spread(x, weight), layer, projection)


# --------------------------------------------------------------------------------------- the cached sweep
@dataclass(frozen=True)
class FormatSweep:
    """The cached weight × KV sweep (`benchmarks/bench_weight_quant.py`) with the memory one ``context``-token
    sequence needs per configuration (weights + its KV) and a readable ``config`` label."""

    frame: pd.DataFrame
    meta: dict
    context: int

    def row(self, weights: str = "auto", kv_format: str = "auto", dtype: str = "float32") -> pd.Series:
        s = self.frame
        match = s[(s.weights == weights) & (s.kv_format == kv_format)]
        if weights == "auto":
            match = match[match.dtype == dtype]
        return match.iloc[0]

    @property
    def recall_items_per_length(self) -> int:
        """Items behind each recall@N figure (the benchmark's --recall-per-length, 2 unless its meta says)."""
        return int(self.meta.get("recall_per_length", 2))

    @property
    def recall_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c.startswith("recall@")]

    def layered_table(self) -> pd.DataFrame:
        cols = ["config", "weight_bytes", "kv_bytes_per_token", "blocks_at_budget", "max_concurrency",
                "decode_tokens_per_s", "throughput_tokens_per_s", "kl_mean", "top1_agreement", "perplexity",
                *self.recall_columns]
        return self.frame[[c for c in cols if c in self.frame.columns]].set_index("config")

    def kv_speed_cost(self, kv_format: str = "fp8_e4m3") -> dict[str, float]:
        """What a quantized KV does at fp32 weights: 32-request throughput and batch-1 decode against the fp32
        cache (on a CPU the cache is dequantized on every step: a cost, not a gain), and the capacity it buys."""
        base, quant = self.row("auto", "auto"), self.row("auto", kv_format)
        return {"throughput_fp32_kv": float(base.throughput_tokens_per_s),
                "throughput": float(quant.throughput_tokens_per_s),
                "throughput_ratio": float(quant.throughput_tokens_per_s / base.throughput_tokens_per_s),
                "decode_ratio": float(quant.decode_tokens_per_s / base.decode_tokens_per_s),
                "sequences_fp32_kv": int(base.max_concurrency), "sequences": int(quant.max_concurrency)}


def format_sweep(path: Path = SWEEP_PATH, context: int = 2048) -> FormatSweep:
    s, meta = load_sweep(path)
    s["memory_mib"] = (s.weight_bytes + s.kv_bytes_per_token * context) / MiB
    s["weight_label"] = [WEIGHT_NAMES["bf16" if d == "bfloat16" else "fp32" if w == "auto" else w]
                         for w, d in zip(s.weights, s.dtype, strict=True)]
    s["config"] = s.weight_label + " weights, " + s.kv_format + " KV"
    return FormatSweep(s, meta, context)
