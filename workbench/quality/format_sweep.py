"""Chapter 6's measurements: one weight format x KV format configuration's memory, speed and quality.

Why it exists: the chapter's layered table (weights, then KV cache) is a sweep over configurations of the real
model, and the same functions serve the notebook's live panels (one configuration, small) and
``benchmarks/bench_weight_quant.py`` (every configuration, full size), which writes the cached sweep the
notebook reads where a live run would not fit its time budget (`load_sweep`).

Quality is always against one reference, the fp32 model with an fp32 cache, on the held-out text
(``datasets/eval/heldout.txt``, teacher-forced through the paged cache: `workbench.quality.teacher_forcing`);
recall hides a number in long filler text (`workbench.quality.recall`). Memory comes from the sizing formulas,
checked against what the loaded model allocates (`workbench.models.int8_linear.model_weight_bytes`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch

from workbench.bench import run_workload
from workbench.cache.calibration import calibration_ids
from workbench.cache.sizing import kv_bytes_per_token, max_concurrency, weight_bytes
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models.int8_linear import model_weight_bytes, weight_format_of
from workbench.paths import DATASETS_DIR
from workbench.quality.recall import make_items, run_recall
from workbench.quality.teacher_forcing import compare_logits, logits_through_cache
from workbench.timing import describe_cpu
from workbench.workloads import mixed_lengths

SWEEP_PATH = DATASETS_DIR / "eval" / "quant_sweep.json"
SWEEP_COMMAND = ".venv/bin/python benchmarks/bench_weight_quant.py"
BUDGET_BYTES = 1 << 30  # the engine's default CPU KV budget, so blocks here are the blocks the engine gets
CONTEXT = 2048  # sequence length for "max concurrency"
BLOCK_SIZE = 16
DECODE_PROMPT = "The history of the printing press"


def config_label(weights: str, kv_format: str, dtype: str = "float32") -> str:
    """'int8 weights, fp8_e4m3 KV' and the like, for tables and legends."""
    names = {"auto": "fp32 weights" if dtype == "float32" else f"{dtype} weights", "int8": "int8 weights",
             "int8_all": "int8 weights + head", "q4_1": "GGUF Q4_1 weights", "q8_0": "GGUF Q8_0 weights"}
    return f"{names[weights]}, {kv_format} KV"


def heldout_ids(tokenizer, limit: int | None = None) -> list[int]:
    return tokenizer((DATASETS_DIR / "eval" / "heldout.txt").read_text(), add_special_tokens=False)["input_ids"][:limit]


def memory_row(model, kv_format: str, *, budget_bytes: int = BUDGET_BYTES, context_len: int = CONTEXT) -> dict:
    """Weight bytes (formula and allocated), KV bytes per token (scales included), blocks and sequences at a budget."""
    spec, fmt = model.spec, weight_format_of(model)
    per_token = kv_bytes_per_token(spec, kv_format, model.dtype)
    blocks = budget_bytes // (per_token * BLOCK_SIZE)
    return {"weight_bytes": weight_bytes(spec, model.dtype, fmt), "weight_bytes_allocated": model_weight_bytes(model),
            "kv_bytes_per_token": per_token, "blocks_at_budget": blocks,
            "max_concurrency": max_concurrency(blocks, BLOCK_SIZE, context_len)}


def quality_row(model, tokenizer, kv_format: str, reference: torch.Tensor, ids: list[int]) -> dict:
    """KL / top-1 agreement / perplexity of this model and KV format against the reference logits on ``ids``."""
    calibration = calibration_ids(model, tokenizer) if kv_format == "fp8_e4m3" else None
    logits = logits_through_cache(model, ids, kv_format, calibration_ids=calibration)
    targets = torch.tensor(ids[1:], device=model.device)
    return compare_logits(reference[:-1].to(logits.device), logits[:-1], targets)


def recall_row(model, tokenizer, kv_format: str, lengths: tuple[int, ...], per_length: int) -> dict:
    if not per_length:
        return {}
    frame = run_recall(model, tokenizer, make_items(tokenizer, list(lengths), per_length, seed=0), kv_format)
    return {f"recall@{n}": float(a) for n, a in frame.groupby("context_tokens")["correct"].mean().items()}


def decode_tokens_per_s(model, tokenizer, kv_format: str = "auto", tokens: int = 32) -> float:
    """Batch-1 decode speed: one request, prefill excluded (the clock starts once the first token is out)."""
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(kv_cache_dtype=kv_format, num_blocks=64),
                       scheduler_config=SchedulerConfig(max_num_seqs=1))
    prompt = tokenizer(DECODE_PROMPT, add_special_tokens=False)["input_ids"]
    engine.add_request(prompt, SamplingParams(max_tokens=tokens + 1, ignore_eos=True), chat=False)
    engine.step()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return tokens / (time.perf_counter() - start)


def throughput_tokens_per_s(model, tokenizer, kv_format: str = "auto", requests: int = 32) -> float:
    """Output tokens/s of ``requests`` mixed-length requests arriving at once (continuous batching, 16 at a time)."""
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(kv_cache_dtype=kv_format),
                       scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512))
    workload = mixed_lengths(requests, seed=0)
    result = run_workload(engine, workload, realtime=False, progress=False)
    return float(result.requests["output_tokens"].sum()) / result.wall_s


def measure_config(model, tokenizer, kv_format: str, reference: torch.Tensor, ids: list[int], *,
                   recall_lengths: tuple[int, ...] = (1024, 2048), recall_per_length: int = 4,
                   requests: int = 32, decode_tokens: int = 32) -> dict:
    """Every column of the chapter's table for one loaded model (its weight format) and one KV format."""
    row = {"weights": weight_format_of(model), "dtype": str(model.dtype).removeprefix("torch."),
           "kv_format": kv_format, **memory_row(model, kv_format)}
    row.update(quality_row(model, tokenizer, kv_format, reference, ids))
    row.update(recall_row(model, tokenizer, kv_format, recall_lengths, recall_per_length))
    if decode_tokens:
        row["decode_tokens_per_s"] = decode_tokens_per_s(model, tokenizer, kv_format, decode_tokens)
    if requests:
        row["throughput_tokens_per_s"] = throughput_tokens_per_s(model, tokenizer, kv_format, requests)
    return row


def save_sweep(frame: pd.DataFrame, extra: dict, path: Path = SWEEP_PATH) -> None:
    """Write the sweep with what made it (command, date, machine), for the notebook to load and label."""
    meta = {"command": SWEEP_COMMAND, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "machine": describe_cpu(), **extra}
    rows = frame.reset_index(drop=True).to_dict(orient="records")
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=float) + "\n")


def load_sweep(path: Path = SWEEP_PATH) -> tuple[pd.DataFrame, dict]:
    """The cached sweep (rows as a frame) and its metadata; raises with the command that makes it if absent."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `{SWEEP_COMMAND}` to measure it")
    data = json.loads(path.read_text())
    return pd.DataFrame(data["rows"]), data["meta"]
