"""Chapter 1's measurements as result objects: what the panels draw, the prose reads and the closing table judges.

- `layer_timing` → `LayerTiming`: one real decoder layer's parts timed against N (`attention_cost`), with the
  attention variant it was timed with (full causal or a sliding window) and that variant's FLOP crossover;
- `context_ttft` → `ContextTTFT`: time to first token against prompt length on the loaded model, the decode step
  after it, and the chapter's `Baseline` (prefill ms per token at the longest prompt, the batch-1 decode step);
- `attention_memory` (`memory`) → `AttentionMemory`: one layer's activation peak, materialised vs fused;
- `kv_memory` → `KVMemory`: a config's KV cache under MHA/GQA/MQA/SWA next to its weights (computed, no model).

Every timing is the fastest of several runs after a warm-up run that is never part of the number. No widgets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from workbench.cache.sizing import attention_variants, kv_bytes_per_token, weight_bytes
from workbench.config import ModelSpec, SamplingParams
from workbench.generation import stream_token_ids
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.notebook import dtype_name
from workbench.models import model_spec
from workbench.models.llama import LlamaModel
from workbench.progress import ProgressFn, no_progress
from workbench.roofline.layer_cost import PARTS, crossover_length, layer_flops, loglog_slope, time_layer_parts
from workbench.timing import describe_machine
from workbench.workloads import prompt_of_length


def upper_half_slope(frame: pd.DataFrame, column: str) -> float:
    """Log-log slope of ``column`` against the index over the longer half of the lengths (short ones are set
    by fixed overheads, not by the work)."""
    upper = frame.iloc[len(frame) // 2:]
    return loglog_slope(upper.index, upper[column])


# ------------------------------------------------------------------------------------------ layer timing
@dataclass(frozen=True)
class LayerTiming:
    """`time_layer_parts` of one layer (seconds per part, attention's share) with the variant it was timed with."""

    frame: pd.DataFrame
    spec: ModelSpec
    window: int | None  # None: full causal attention
    layer: int

    @property
    def variant(self) -> str:
        return "full causal attention" if self.window is None else f"a {self.window:,}-token sliding window"

    @property
    def longest(self) -> int:
        return int(self.frame.index[-1])

    @property
    def attention_share(self) -> float:
        """Attention's share of the layer's time at the longest N."""
        return float(self.frame["attention share"].iloc[-1])

    def slopes(self) -> dict[str, float]:
        """Log-log slope of each part over the upper half of the lengths."""
        return {part: upper_half_slope(self.frame, f"{part} s") for part in PARTS}

    def crossover(self) -> int | None:
        """Where attention's FLOPs would equal the linear parts' with *this* variant (None: never)."""
        return crossover_length(self.spec.replace(sliding_window=self.window))

    def flop_shares(self) -> list[float]:
        """Attention's share of the layer's FLOPs at each timed length, with this variant."""
        return [f["attention"] / sum(f.values()) for f in
                (layer_flops(self.spec, int(n), self.window) for n in self.frame.index)]


def layer_timing(model: LlamaModel, lengths: Sequence[int], *, window: int | None = None, layer: int = 0,
                 progress: ProgressFn = no_progress) -> LayerTiming:
    frame = time_layer_parts(model, lengths, window=window, layer=layer, progress=progress)
    return LayerTiming(frame, model.spec, window, layer)


# ------------------------------------------------------------------------------------------------ TTFT
def _first_two_tokens(model: LlamaModel, prompt: list[int]) -> tuple[float, float]:
    """(TTFT, the decode step after it) in seconds, for one greedy request with a KV cache."""
    events = list(stream_token_ids(model, prompt, SamplingParams(max_tokens=2, ignore_eos=True)))
    return events[0].time_s, events[1].time_s - events[0].time_s


def ttft_sweep(model: LlamaModel, tokenizer, lengths: Sequence[int], *, repeats: int = 2,
               progress: ProgressFn = no_progress) -> tuple[pd.DataFrame, pd.DataFrame]:
    """TTFT and the next decode step for prompts of each length (fastest of ``repeats``, after a warm-up run
    that is not counted; the fastest run is the one least disturbed by other work on a shared machine), and
    every run's times (ms, lists per length: the evidence of a verdict needs the spread)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if max(lengths) >= model.spec.max_context:
        raise ValueError(f"prompt lengths must stay below the model's context of {model.spec.max_context:,}, "
                         f"got {max(lengths):,}")
    _first_two_tokens(model, prompt_of_length(tokenizer, min(lengths)))  # warm-up: first calls allocate, pick kernels
    rows, every = [], []
    for i, n in enumerate(lengths):
        progress(i, len(lengths), f"prefill of {n:,} tokens")
        prompt = prompt_of_length(tokenizer, n)
        runs = [_first_two_tokens(model, prompt) for _ in range(repeats)]
        rows.append({"prompt_tokens": n, "ttft_ms": 1e3 * min(r[0] for r in runs),
                     "decode_step_ms": 1e3 * min(r[1] for r in runs)})
        every.append({"prompt_tokens": n, "ttft": [1e3 * r[0] for r in runs], "decode": [1e3 * r[1] for r in runs]})
    progress(len(lengths), len(lengths), "done")
    frame = pd.DataFrame(rows).set_index("prompt_tokens")
    return frame, pd.DataFrame(every).set_index("prompt_tokens")


@dataclass(frozen=True)
class ContextTTFT:
    """TTFT and the decode step after it, per prompt length (ms), on one model and device."""

    frame: pd.DataFrame
    spec: ModelSpec
    machine: str
    dtype: str
    repeats: int
    runs: pd.DataFrame | None = None  # every run's TTFT and decode step per length (lists, ms)

    @property
    def shortest(self) -> int:
        return int(self.frame.index[0])

    @property
    def longest(self) -> int:
        return int(self.frame.index[-1])

    @property
    def ttft_short_ms(self) -> float:
        return float(self.frame["ttft_ms"].iloc[0])

    @property
    def ttft_long_ms(self) -> float:
        return float(self.frame["ttft_ms"].iloc[-1])

    @property
    def decode_ms(self) -> float:
        """The batch-1 decode step: the median over the sweep (it barely depends on the prompt)."""
        return float(self.frame["decode_step_ms"].median())

    @property
    def slope(self) -> float:
        return upper_half_slope(self.frame, "ttft_ms")

    @property
    def steps_per_ttft(self) -> float:
        return self.ttft_long_ms / self.decode_ms

    def runs_ms(self, column: str, row: int) -> list[float]:
        """Every timed run of ``column`` ('ttft' or 'decode') at the ``row``-th length (the table keeps the
        fastest; the evidence of a verdict needs them all)."""
        if self.runs is None:
            return [float(self.frame[{"ttft": "ttft_ms", "decode": "decode_step_ms"}[column]].iloc[row])]
        return list(self.runs[column].iloc[row])

    @property
    def prefill_ms_per_token(self) -> float:
        """TTFT of the longest prompt over its tokens (the one sampled token in it is a rounding error)."""
        return self.ttft_long_ms / self.longest

    def attention_flop_share(self) -> float:
        flops = layer_flops(self.spec, self.longest, self.spec.sliding_window)
        return flops["attention"] / sum(flops.values())

    def baseline(self) -> Baseline:
        return Baseline(chapter="ch01", machine=self.machine, dtype=self.dtype,
                        source=f"section 6's TTFT sweep: one request at a time through the single-sequence loop, "
                               f"fastest of {self.repeats} runs per length after an uncounted warm-up; prefill = "
                               f"TTFT of the {self.longest:,}-token prompt / its tokens, decode = the median "
                               "step after the first token",
                        decode_step_ms=self.decode_ms, prefill_ms_per_token=self.prefill_ms_per_token,
                        prefill_tokens=self.longest, ttft_miss_ms=self.ttft_long_ms, ttft_tokens=self.longest)


def context_ttft(model: LlamaModel, tokenizer, lengths: Sequence[int], *, repeats: int = 2,
                 progress: ProgressFn = no_progress) -> ContextTTFT:
    frame, runs = ttft_sweep(model, tokenizer, lengths, repeats=repeats, progress=progress)
    return ContextTTFT(frame, model.spec, describe_machine(model.device), dtype_name(model.dtype), repeats, runs)


# ------------------------------------------------------------------------------------------- KV memory
@dataclass(frozen=True)
class KVMemory:
    """One config's KV cache under each attention variant at a context, and a batch of it next to the weights."""

    spec: ModelSpec
    table: pd.DataFrame  # `attention_variants`
    context: int
    kv_cache_dtype: str
    batch: int
    device_bytes: int

    @property
    def own(self) -> pd.Series:
        """The row that is the config as published (its own variant)."""
        if self.spec.sliding_window is not None:
            return self.table.iloc[3]
        return self.table.loc[self.spec.attention_kind]

    @property
    def per_token(self) -> int:
        return kv_bytes_per_token(self.spec, self.kv_cache_dtype)

    @property
    def weights(self) -> int:
        return weight_bytes(self.spec, torch.bfloat16)

    @property
    def total(self) -> float:
        """Weights (bf16) plus ``batch`` sequences of the config's own KV."""
        return self.weights + self.batch * float(self.own["bytes_per_sequence"])


def kv_memory(name: str, context: int, kv_cache_dtype: str, batch: int, device_bytes: int) -> KVMemory:
    spec = model_spec(name)
    # SWA row: the model's own window if it has one, else 4096 (Mistral-7B's).
    table = attention_variants(spec, context, kv_format=kv_cache_dtype, window=spec.sliding_window or 4096)
    return KVMemory(spec, table, context, kv_cache_dtype, batch, device_bytes)
