"""The KV cache of the 2025-26 architectures (chapter 2's last section), without widgets.

* ``architecture_sizes``: bytes per sequence and per token, by layer group, for DeepSeek-V3 (MLA), gpt-oss
  (128-token windows in every other layer, learned sinks), Gemma 3 27B (1,024-token windows in five layers of
  six), Qwen3-Next (linear attention in three layers of four) and Llama 3.1 (full attention everywhere) at 8K,
  32K and 128K tokens, and how many sequences' KV fits the KV share of an 80 GB GPU. Computed from
  ``datasets/configs`` (`workbench.cache.layout_sizing`): the same on every machine.
* ``sliding_run``: the engine's KV-group allocator live on SmolLM2 with a window on five layers of six: each
  group's blocks step by step, the windowed groups' count staying flat while the full group's grows.
* ``whatif_quality``: that what-if's quality cost against the memory it saves, measured side by side
  (`workbench.quality.window_whatif`), small enough for the notebook's budget; ``cached_whatif`` reads the
  larger run ``benchmarks/bench_window_whatif.py`` stored in ``datasets/eval/window_whatif.json`` (tens of
  minutes on a 2-core CPU), with the command, machine and date it ran on, which the chapter shows by default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from workbench.cache.hybrid_block_manager import HOLE
from workbench.cache.kv_layout import kv_layout
from workbench.cache.layout_sizing import DEFAULT_CONTEXTS, group_rows, sequences_that_fit
from workbench.config import FLOAT_KV_DTYPES, CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models.llama import LlamaModel
from workbench.paths import DATASETS_DIR
from workbench.quality.window_whatif import CHUNK, whatif_table, windowed_spec, with_spec

WHATIF_PATH = DATASETS_DIR / "eval" / "window_whatif.json"
ARCHITECTURES = ("llama-3.1-8b", "llama-3.1-70b", "gemma-3-27b", "gpt-oss-120b", "gpt-oss-20b",
                 "qwen3-next-80b-a3b", "deepseek-v3")
GPU_BYTES = 80 * 10**9  # an 80 GB GPU (H100)
UTILIZATION = 0.9


@dataclass(frozen=True)
class ArchitectureSizes:
    """``frame``: one row per (model, context, layer group) with its bytes per sequence; ``fits``: per (model,
    context), the sequences whose KV fits ``kv_budget_bytes`` (weights not subtracted: they only lower it)."""

    frame: pd.DataFrame
    fits: pd.DataFrame
    kv_budget_bytes: int
    tp: int
    kv_cache_dtype: str

    def per_sequence(self, model: str, context: int) -> int:
        rows = self.frame[(self.frame.model == model) & (self.frame.context == context)]
        return int(rows["bytes_per_sequence"].sum())

    def per_token(self, model: str, context: int) -> float:
        """Average bytes per token of context: constant for full attention, falling as windows and fixed state
        are spread over more tokens."""
        return self.per_sequence(model, context) / context

    def sequences(self, model: str, context: int) -> int:
        return int(self.fits.loc[(model, context), "sequences"])


def architecture_sizes(models: tuple[str, ...] = ARCHITECTURES, contexts: tuple[int, ...] = DEFAULT_CONTEXTS, *,
                       gpu_bytes: int = GPU_BYTES, utilization: float = UTILIZATION, tp: int = 1,
                       kv_cache_dtype: str = "bfloat16") -> ArchitectureSizes:
    """Every architecture's cache by layer group at every context, on one GPU (under TP ``tp``)."""
    kv_format = getattr(torch, kv_cache_dtype) if kv_cache_dtype in FLOAT_KV_DTYPES else kv_cache_dtype
    budget = int(gpu_bytes * utilization)
    rows, fits = [], []
    for model in models:
        layout = kv_layout(model)
        for context in contexts:
            groups = group_rows(layout, context, kv_format=kv_format, tp=tp).drop(index="total")
            for group, row in groups.iterrows():
                rows.append({"model": model, "context": context, "group": group, "layers": int(row["layers"]),
                             "bytes_per_token": int(row["bytes_per_token"]),
                             "cached_tokens": int(row["cached_tokens"]),
                             "bytes_per_sequence": int(row["bytes_per_sequence"])})
            fits.append({"model": model, "context": context,
                         "sequences": sequences_that_fit(layout, context, budget, kv_format=kv_format, tp=tp)})
    return ArchitectureSizes(pd.DataFrame(rows), pd.DataFrame(fits).set_index(["model", "context"]), budget, tp,
                             kv_cache_dtype)


# ------------------------------------------------------------------------------------------- the live allocator
@dataclass(frozen=True)
class SlidingRun:
    """Per engine step of one sequence: its computed tokens, the blocks each KV group holds, and the blocks
    windows have let go of so far. ``window_groups`` / ``full_groups`` name the frame's columns."""

    frame: pd.DataFrame
    window: int
    block_size: int
    window_groups: list[str]
    full_groups: list[str]

    @property
    def flat_window_blocks(self) -> int:
        """The most blocks one windowed group held: bounded by the window (plus a chunk), however long the run."""
        return int(self.frame[self.window_groups].max().max())

    @property
    def full_blocks_at_end(self) -> int:
        return int(self.frame[self.full_groups].iloc[-1].max())


def sliding_run(model: LlamaModel, *, window: int = 64, prompt_tokens: int = 192, new_tokens: int = 48,
                block_size: int = 16, chunk: int = 64) -> SlidingRun:
    """Run one sequence through the engine with a ``window`` on five layers of six, recording each group's live
    blocks after every step (prompt chunks of ``chunk`` tokens, then one token per step)."""
    variant = with_spec(model, windowed_spec(model.spec, window))
    engine = LLMEngine(variant, cache_config=CacheConfig(block_size=block_size, num_blocks=4096,
                                                         enable_prefix_caching=False),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=chunk, max_num_seqs=1))
    prompt = torch.randint(0, model.spec.vocab_size, (prompt_tokens,), generator=torch.Generator().manual_seed(0))
    engine.add_request(prompt.tolist(), SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    seq = next(iter(engine.requests.values())).seqs[0]
    groups = engine.blocks.layout.groups
    names = [f"{'window' if g.is_sliding else 'full'} layers {g.layers[0]}-{g.layers[-1]}" for g in groups]
    rows = []
    while engine.has_unfinished_requests():
        engine.step()
        if seq.seq_id not in engine.blocks:
            break
        row = {"step": len(rows), "tokens": engine.blocks.num_computed_tokens(seq.seq_id),
               "slid_blocks": engine.blocks.num_slid_blocks}
        for name, g in zip(names, range(len(groups)), strict=True):
            row[name] = sum(b != HOLE for b in engine.blocks.group_table(seq.seq_id, g))
        rows.append(row)
    return SlidingRun(pd.DataFrame(rows), window, block_size,
                      [n for n, g in zip(names, groups, strict=True) if g.is_sliding],
                      [n for n, g in zip(names, groups, strict=True) if not g.is_sliding])


# ------------------------------------------------------------------------------------------------- the what-if
def whatif_quality(model: LlamaModel, tokenizer, *, windows: tuple[int, ...] = (128,),
                   lengths: tuple[int, ...] = (256, 512), per_length: int = 2,
                   heldout_tokens: int = 384, chunk: int = CHUNK) -> pd.DataFrame:
    """The what-if's quality cost and memory saved side by side, sized for the notebook (benchmarks/
    bench_window_whatif.py runs the larger version recorded in RESULTS.md); prompts prefilled ``chunk`` tokens
    per step."""
    return whatif_table(model, tokenizer, list(windows), lengths=list(lengths), per_length=per_length,
                        heldout_tokens=heldout_tokens, chunk=chunk)


@dataclass(frozen=True)
class WhatIf:
    """One what-if run: ``table`` (one row per attention: recall, perplexities, KV kept; `whatif_table`'s
    columns) and ``source``, where it was measured (the stored run's command, machine and date, or this kernel)."""

    table: pd.DataFrame
    source: str
    cached: bool


def cached_whatif(path: Path = WHATIF_PATH) -> WhatIf:
    """The stored run of ``benchmarks/bench_window_whatif.py``, with what it ran on."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run .venv/bin/python benchmarks/bench_window_whatif.py "
                                f"--json {path}")
    stored = json.loads(path.read_text())
    missing = [key for key in ("table", "command", "machine", "date") if key not in stored]
    if missing:
        raise ValueError(f"{path} lacks {missing}: write it with benchmarks/bench_window_whatif.py --json")
    minutes = stored["seconds"] / 60 if "seconds" in stored else float("nan")
    source = (f"CACHED: measured by `{stored['command']}` on {stored['date']} ({stored['machine']}; "
              f"{stored['per_length']} items per length, {stored['heldout_tokens']:,} held-out tokens, "
              f"{minutes:.0f} min)")
    return WhatIf(pd.DataFrame(stored["table"]).set_index("attention"), source, cached=True)


def whatif_reading(table: pd.DataFrame) -> str:
    """What a what-if run shows, read from its table: per window, the KV it keeps, the needles further back than
    the window it recalls, and perplexity past the window beside full attention's on the same positions."""
    recall = [c for c in table.columns if c.startswith("recall@")]
    longest = max(int(c.removeprefix("recall@")) for c in recall)
    full = table[table["window"] == 0].iloc[0]
    parts = []
    for _, row in table[table["window"] > 0].iterrows():
        far = row["recall_beyond_window"]
        recalled = ("no needle lay further back than the window" if pd.isna(far) else
                    f"it recalled {far:.0%} of the needles further back than the window")
        parts.append(f"A {int(row['window']):,}-token window keeps {row['kv_vs_full']:.0%} of the KV of a "
                     f"{longest:,}-token sequence ({row['peak_vs_full']:.0%} of the engine's peak); {recalled}; "
                     f"past the window its perplexity is {row['perplexity_past_window']:.1f} against full "
                     f"attention's {row['full_perplexity_same_positions']:.1f} on the same positions")
    return (f"Full attention recalled {full[recall].mean():.0%} of the needles. " + ". ".join(parts)
            + ". The windows run on 25 of the 30 layers, so one layer in six still sees every token.")


def live_whatif(model: LlamaModel, tokenizer, *, windows: tuple[int, ...] = (128,),
                lengths: tuple[int, ...] = (256, 512), per_length: int = 2) -> WhatIf:
    """``whatif_quality`` run in this kernel: the smaller version (the stored run has three windows, contexts up to
    2,048 tokens and 4 items per length)."""
    table = whatif_quality(model, tokenizer, windows=windows, lengths=lengths, per_length=per_length)
    return WhatIf(table, f"measured live in this kernel: window {', '.join(map(str, windows))}, recall at "
                         f"{' / '.join(f'{n:,}' for n in lengths)} tokens x {per_length} items per length",
                  cached=False)
