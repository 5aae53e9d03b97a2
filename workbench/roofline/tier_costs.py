"""Restore against recompute, measured: what moving a KV block to and from each tier of `workbench.cache.tier`
costs on this machine, what recomputing it costs, and where the two cross by prefix length. Chapter 11 draws it,
and benchmarks/bench_kv_tiers.py measures it beside the multi-turn sessions (`workbench.bench.sessions`).

Each tier's cost is measured through the engine's own tier (`workbench.cache.tier`): real blocks of the model's
cache stored and restored under scratch names, 1 and 8 at a time, the fastest of several runs kept; the disk
tier twice, reading from the page cache (just written) and cold (each file synced and dropped from the page cache
first, what a restarted machine reads). The prefill is timed on the engine at several prompt lengths
(`workbench.roofline.steps.measure_prefill_steps`), and what recomputing an L-token prefix costs is L times the
slope of a straight line through those times: the part of a forward the prefix adds (its intercept, the forward's
fixed cost, is paid by the request's own new tokens either way). A line, not a curve: at these lengths attention's
quadratic share is a few percent of this model's prefill (chapter 1), inside a shared machine's noise.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.rule import TransferCost
from workbench.config import CacheConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.roofline.steps import measure_prefill_steps

BLOCK_SIZE = 16
TIERS = ("host memory", "disk, page cache", "disk, cold")
LENGTHS = (16, 64, 256, 512)  # prompt tokens whose prefill is timed (512: ~1 s on a quiet 2-core CPU)
REPEATS = 3


@dataclass
class TierCosts:
    """Each tier's measured transfer costs and the prefill, for one model and KV format."""

    kv_format: str
    bytes_per_block: int
    restore: dict[str, TransferCost]  # tier -> tier-to-device cost
    store: dict[str, TransferCost]  # tier -> device-to-tier cost
    prefill: pd.DataFrame  # context (prompt tokens), step_s: measured whole-prompt prefills
    per_token_s: float  # the slope of the line through the prefill times

    def recompute_s(self, tokens) -> np.ndarray:
        """What recomputing a ``tokens``-token prefix adds to a forward."""
        return np.asarray(tokens, dtype=float) * self.per_token_s

    def restore_s(self, tier: str, tokens) -> np.ndarray:
        blocks = np.ceil(np.asarray(tokens, dtype=float) / BLOCK_SIZE)
        cost = self.restore[tier]
        return np.where(blocks > 0, cost.fixed_s + blocks * cost.per_block_s, 0.0)

    def crossover_tokens(self, tier: str, longest: int = 32768) -> float:
        """The shortest whole-block prefix whose restore beats its recompute (inf: none up to ``longest``)."""
        tokens = np.arange(BLOCK_SIZE, longest + 1, BLOCK_SIZE)
        wins = self.restore_s(tier, tokens) < self.recompute_s(tokens)
        return float(tokens[wins.argmax()]) if wins.any() else math.inf

    def speedup(self, tier: str, tokens: int) -> float:
        """Recompute time over restore time for a prefix of ``tokens`` tokens."""
        return float(self.recompute_s(tokens) / self.restore_s(tier, tokens))

    def table(self) -> pd.DataFrame:
        rows = [{"tier": tier, "fixed ms": cost.fixed_s * 1e3, "ms per block": cost.per_block_s * 1e3,
                 "GB/s": cost.bytes_per_s / 1e9, "store GB/s": self.store[tier].bytes_per_s / 1e9}
                for tier, cost in self.restore.items()]
        per_token = float(self.recompute_s(BLOCK_SIZE)) / BLOCK_SIZE
        rows.append({"tier": "recompute (prefill)", "fixed ms": 0.0, "ms per block": per_token * BLOCK_SIZE * 1e3,
                     "GB/s": self.bytes_per_block / (per_token * BLOCK_SIZE) / 1e9, "store GB/s": math.nan})
        return pd.DataFrame(rows)


def _tier_engine(model, kind: str, kv_format: str, directory: Path | None) -> LLMEngine:
    config = KVOffloadConfig(kind, size_gib=0.25, directory=directory, restore="always")  # no start-up rule needed
    return LLMEngine(model, None, cache_config=CacheConfig(block_size=BLOCK_SIZE, num_blocks=16,
                                                           kv_cache_dtype=kv_format), kv_offload=config)


def measure_tiers(model, *, kv_format: str = "auto", lengths=LENGTHS, repeats: int = REPEATS,
                  progress=None) -> TierCosts:
    """Every tier's store and restore cost, and the prefill at ``lengths``, for ``model`` and ``kv_format``."""
    restore, store = {}, {}
    with tempfile.TemporaryDirectory(prefix="ch11-tiers-") as folder:
        for i, tier in enumerate(TIERS):
            if progress is not None:
                progress(i, len(TIERS) + 1, f"timing the {tier} tier")
            engine = _tier_engine(model, "host" if tier == TIERS[0] else "disk", kv_format,
                                  None if tier == TIERS[0] else Path(folder) / str(i))
            store[tier], restore[tier] = engine.kv_offload.measure_transfers(
                list(range(8)), cold=tier == TIERS[2], repeats=repeats)
            bytes_per_block = engine.kv_offload.codec.bytes_per_block
            del engine
    if progress is not None:
        progress(len(TIERS), len(TIERS) + 1, "timing prefills")
    prefill = measure_prefill_steps(model, list(lengths), repeats=2)[["context", "step_s"]]
    return TierCosts(kv_format, bytes_per_block, restore, store, prefill, slope(prefill))


def slope(prefill: pd.DataFrame) -> float:
    """Seconds per prompt token: the least-squares slope through (context, step_s); if noise makes it not
    positive, the longest prefill's time over its tokens."""
    x, y = prefill["context"].to_numpy(float), prefill["step_s"].to_numpy(float)
    per_token = float(np.polyfit(x, y, 1)[0]) if len(x) > 1 else 0.0
    return per_token if per_token > 0 else float(y[x.argmax()] / x.max())


def crossover_frame(costs: TierCosts, longest: int = 1024) -> pd.DataFrame:
    """Restore (each tier) and recompute time of a prefix, by its length in tokens, whole blocks."""
    tokens = np.arange(BLOCK_SIZE, longest + 1, BLOCK_SIZE)
    frame = pd.DataFrame({"tokens": tokens, "recompute_ms": costs.recompute_s(tokens) * 1e3})
    for tier in costs.restore:
        frame[f"{tier}_ms"] = costs.restore_s(tier, tokens) * 1e3
    return frame
