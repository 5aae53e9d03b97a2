"""One table per KV format: memory, next-token fidelity, perplexity and long-context recall.

    report = kv_quality_report(model, tokenizer)      # minutes on a 2-core CPU

Memory comes from the cache layout the engine really allocates (scales included) and is checked against the
sizing formula; fidelity compares each format's next-token distributions with the unquantized cache on the
held-out text (``datasets/eval/heldout.txt``, written for this project); recall asks for a number hidden in
long filler text at several context lengths. The weights are SmolLM2-135M-Instruct dequantized from Q4_1,
so every number is about those weights.
"""

from __future__ import annotations

import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.cache.calibration import calibration_ids
from workbench.cache.sizing import bytes_per_block, kv_bytes_per_token, max_concurrency
from workbench.config import CacheConfig
from workbench.models.llama import LlamaModel
from workbench.paths import DATASETS_DIR
from workbench.quality.recall import make_items, run_recall
from workbench.quality.teacher_forcing import compare_logits, logits_through_cache

FORMATS = ("auto", "fp8_e4m3", "int8", "int4")


def memory_row(model: LlamaModel, kv_format: str, *, budget_bytes: int, context_len: int,
               block_size: int = 16) -> dict:
    """Bytes per token (allocated layout and formula), blocks a budget holds, sequences of context_len."""
    per_block = bytes_per_block(model, CacheConfig(block_size=block_size, kv_cache_dtype=kv_format))
    blocks = budget_bytes // per_block
    return {"bytes_per_token": per_block // block_size,
            "bytes_per_token_formula": kv_bytes_per_token(model.spec, kv_format, model.dtype),
            "blocks_at_budget": blocks, "max_concurrency": max_concurrency(blocks, block_size, context_len)}


def kv_quality_report(model: LlamaModel, tokenizer, formats: tuple[str, ...] = FORMATS, *,
                      recall_lengths: tuple[int, ...] = (256, 1024, 2048), recall_per_length: int = 6,
                      budget_bytes: int = 1 << 30, context_len: int = 2048, text_tokens: int | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """The per-format results table (index: format)."""
    text = (DATASETS_DIR / "eval" / "heldout.txt").read_text()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:text_tokens]
    targets = torch.tensor(ids[1:], device=model.device)
    calibration = calibration_ids(model, tokenizer)
    items = make_items(tokenizer, list(recall_lengths), recall_per_length, seed=0) if recall_per_length else []
    reference = logits_through_cache(model, ids, "auto")
    rows = {}
    for fmt in tqdm(formats, desc="KV formats", disable=not progress):
        row = memory_row(model, fmt, budget_bytes=budget_bytes, context_len=context_len)
        logits = reference if fmt == "auto" else logits_through_cache(model, ids, fmt, calibration_ids=calibration)
        row.update(compare_logits(reference[:-1], logits[:-1], targets))
        if items:
            recall = run_recall(model, tokenizer, items, fmt)
            for length, accuracy in recall.groupby("context_tokens")["correct"].mean().items():
                row[f"recall@{length}"] = float(accuracy)
        rows[fmt] = row
    frame = pd.DataFrame(rows).T
    frame.index.name = "kv_format"
    return frame
