"""A labelled what-if: SmolLM2-135M with a sliding window imposed on five layers of every six, as Gemma 3 is built.

SmolLM2 was trained with full attention in all 30 layers; here layers 0-4, 6-10, ... (25 of them) see only the
last ``window`` tokens and layers 5, 11, ... (5 of them) see everything. Its weights never learned that, so what
this measures is the cost of imposing the pattern on a model trained without it, an upper bound on what a model
trained with windows pays (Gemma 3's report measures that smaller cost on its own models). Both sides are measured
on the same weights (dequantized Q4_1), in one run:

- **quality**: exact recall of a number hidden at a distance (`workbench.quality.recall`), and perplexity of the
  held-out text ``datasets/eval/heldout.txt`` (every position, and the positions past the window, the only ones a
  window can change, beside full attention's perplexity on those same positions);
- **memory**: KV bytes per sequence at each context (`workbench.cache.sizing.kv_bytes`), and the peak KV bytes the
  engine really held during the same recall run (its block pool's high-water mark).
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from workbench.cache.grouped_attention import WindowedDenseAttention
from workbench.cache.sizing import kv_bytes
from workbench.config import CacheConfig, ModelSpec, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models.llama import LlamaModel
from workbench.paths import DATASETS_DIR
from workbench.quality.recall import make_items, run_recall

PATTERN = 6  # one full-attention layer in six, as Gemma 3
# Prompt tokens of one sequence per step. A window group holds the window behind a chunk plus the chunk, so a
# prompt prefilled in one step holds every block for that step: chunked prefill is what lets a window save at
# the peak, as in vLLM (whose default chunk is larger, and whose windows are longer).
CHUNK = 256


def windowed_spec(spec: ModelSpec, window: int, every: int = PATTERN) -> ModelSpec:
    """``spec`` with a ``window`` on every layer but each ``every``-th (layers every-1, 2*every-1, ... stay full)."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if not isinstance(every, int) or not 2 <= every <= spec.num_layers:
        raise ValueError(f"every must be an integer in [2, {spec.num_layers}], got {every!r}")
    types = tuple("full_attention" if i % every == every - 1 else "sliding_attention" for i in range(spec.num_layers))
    return spec.replace(name=f"{spec.name} + window {window} on {every - 1} of {every} layers",
                        sliding_window=window, layer_types=types)


def with_spec(model: LlamaModel, spec: ModelSpec) -> LlamaModel:
    """The same weights under another spec (windows change attention only, never the parameters)."""
    if spec.replace(sliding_window=model.spec.sliding_window, layer_types=model.spec.layer_types,
                    name=model.spec.name) != model.spec:
        raise ValueError("with_spec changes only the attention windows: the shapes must stay the model's")
    twin = copy.copy(model)  # a shallow copy shares every parameter
    twin.spec = spec
    return twin


@torch.inference_mode()
def token_nll(model: LlamaModel, token_ids: list[int]) -> torch.Tensor:
    """Negative log-likelihood of each token after the first under the model's own windows (one dense forward
    over the whole text: every position's logits)."""
    if len(token_ids) < 2:
        raise ValueError(f"need at least 2 tokens, got {len(token_ids)}")
    ids = torch.tensor(token_ids, device=model.device)
    backend = WindowedDenseAttention(model.spec.layer_windows, model.attention_scale)
    hidden = model(ids, torch.arange(len(ids), device=model.device), backend)
    return torch.nn.functional.cross_entropy(model.compute_logits(hidden[:-1]), ids[1:], reduction="none")


def perplexity(model: LlamaModel, token_ids: list[int], *, from_position: int = 0) -> float:
    """Perplexity of ``token_ids``, counting the predictions of tokens ``from_position + 1`` on."""
    if not 0 <= from_position < len(token_ids) - 1:
        raise ValueError(f"from_position must be in [0, {len(token_ids) - 2}], got {from_position}")
    return math.exp(float(token_nll(model, token_ids)[from_position:].mean()))


def heldout_ids(tokenizer, max_tokens: int = 2048) -> list[int]:
    text = (DATASETS_DIR / "eval" / "heldout.txt").read_text()
    return tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]


def recall_run(model: LlamaModel, tokenizer, lengths: list[int], per_length: int,
               chunk: int = CHUNK) -> tuple[pd.DataFrame, int]:
    """Recall items answered by the engine (grouped blocks when the model has windows), 8 at a time with prompts
    prefilled ``chunk`` tokens per step, and the peak KV bytes its pool held while answering them."""
    items = make_items(tokenizer, lengths, per_length)
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=max(chunk, 512), max_num_seqs=8,
                                                        max_prefill_chunk=chunk))
    frame = run_recall(model, tokenizer, items, engine=engine)
    frame["distance"] = ((1 - frame["depth"]) * frame["prompt_tokens"]).round().astype(int)
    peak_blocks = max(step.kv_blocks_used for step in engine.metrics.steps)
    return frame, peak_blocks * engine.cache.bytes_per_block


def whatif_table(model: LlamaModel, tokenizer, windows: list[int], *, lengths: list[int], per_length: int = 4,
                 heldout_tokens: int = 2048, chunk: int = CHUNK) -> pd.DataFrame:
    """Full attention and each window side by side: recall per context length, perplexity (all positions and past
    the window), KV bytes per sequence at the longest context and the engine's measured peak."""
    ids = heldout_ids(tokenizer, heldout_tokens)
    full_nll = token_nll(model, ids)
    longest = max(lengths)
    rows = []
    for window in [None, *windows]:
        spec = model.spec if window is None else windowed_spec(model.spec, window)
        variant = with_spec(model, spec)
        recall, peak = recall_run(variant, tokenizer, lengths, per_length, chunk)
        past = min(window or 0, len(ids) - 2)
        nll = full_nll if window is None else token_nll(variant, ids)
        row = {"attention": "full (as trained)" if window is None else f"window {window} on 25 of 30 layers",
               "window": window or 0, "perplexity": math.exp(float(nll.mean())),
               "perplexity_past_window": math.exp(float(nll[past:].mean())),
               "full_perplexity_same_positions": math.exp(float(full_nll[past:].mean())),
               "kv_bytes_per_seq_longest": kv_bytes(spec, longest, kv_format=model.dtype),
               "peak_kv_bytes_recall_run": peak}
        for length, hits in recall.groupby("context_tokens")["correct"]:
            row[f"recall@{length}"] = float(hits.mean())
        far = recall[recall["distance"] > (window or 0)] if window else recall
        row["recall_beyond_window"] = float(far["correct"].mean()) if len(far) else float("nan")
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("attention")
    base = frame.iloc[0]
    frame["kv_vs_full"] = frame["kv_bytes_per_seq_longest"] / base["kv_bytes_per_seq_longest"]
    frame["peak_vs_full"] = frame["peak_kv_bytes_recall_run"] / base["peak_kv_bytes_recall_run"]
    frame["perplexity_vs_full"] = frame["perplexity"] / base["perplexity"]
    return frame
