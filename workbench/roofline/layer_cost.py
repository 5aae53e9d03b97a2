"""Where the time of one decoder layer goes as the sequence grows: FLOP counts and layer timing (chapter 1's).

A layer does two kinds of work on a prefill of N tokens. The linear parts (the q/k/v and output projections,
the MLP) multiply each token by fixed weight matrices: cost proportional to N. Attention compares every query
with every earlier key: cost proportional to N². Which one dominates depends on N and on the layer's width, so
this module both counts FLOPs from a ``ModelSpec`` (exact, any config) and times the real operations of a
loaded model's layer (on whatever device it lives on), each part the fastest of several runs after a warm-up
(`workbench.timing.best_seconds`). Plain torch and pandas: no widgets here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from workbench.config import ModelSpec
from workbench.models.attention import causal_attention
from workbench.models.llama import LlamaModel
from workbench.progress import ProgressFn
from workbench.timing import best_seconds

PARTS = ("attention", "qkv + output projections", "MLP")


def linear_params_per_layer(spec: ModelSpec) -> int:
    """Weights one token is multiplied by in a layer (q/k/v, output, gate/up/down projections)."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return h * (q + 2 * kv) + q * h + 3 * h * spec.intermediate_size


def layer_flops(spec: ModelSpec, n: int, window: int | None = None) -> dict[str, float]:
    """FLOPs of one layer's causal prefill of ``n`` tokens, by part (a multiply-add counts 2).

    Attention: query i scores keys 0..i (QKᵀ) and mixes their values (PV), 2 x 2 x head_dim FLOPs per pair and
    query head, with n(n+1)/2 pairs causally, or about n x window with a sliding window."""
    pairs = n * (n + 1) / 2 if window is None or window >= n else window * (window + 1) / 2 + (n - window) * window
    q = spec.num_heads * spec.head_dim
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    return {"attention": 4.0 * pairs * q,
            "qkv + output projections": 2.0 * n * (h * (q + 2 * kv) + q * h),
            "MLP": 2.0 * n * 3 * h * spec.intermediate_size}


def crossover_length(spec: ModelSpec) -> int | None:
    """Context length at which a causal prefill's attention FLOPs equal the linear parts' FLOPs, with the
    config's own attention (its sliding window, if any); None if attention never catches up.

    Full causal: 2·n²·q = 2·n·P (q = query width, P = linear weights per layer) gives n = P / q. With a window
    W < P / q, each token beyond W scores only W keys, so attention grows linearly too: the two meet at
    n = 2qW(W-1) / (4qW - 2P) when 2qW > P, and never otherwise."""
    q, linear = spec.num_heads * spec.head_dim, linear_params_per_layer(spec)
    full = round(linear / q)
    window = spec.sliding_window
    if window is None or full <= window:
        return full
    if 2 * q * window <= linear:
        return None
    return round(2 * q * window * (window - 1) / (4 * q * window - 2 * linear))


def attention_share(spec: ModelSpec, n: int, window: int | None = None) -> float:
    """Attention's share of one layer's prefill FLOPs at ``n`` tokens."""
    flops = layer_flops(spec, n, window)
    return flops["attention"] / sum(flops.values())


def flop_table(specs: Sequence[ModelSpec], lengths: Sequence[int]) -> pd.DataFrame:
    """Attention's share of a layer's prefill FLOPs for each config and length, with the config's own sliding
    window, and the crossover length. A length beyond the config's ``max_position_embeddings`` is NaN (the model
    cannot take it), and so is a crossover that never happens."""
    rows = []
    for spec in specs:
        row: dict[str, object] = {"model": spec.name}
        for n in lengths:
            share = attention_share(spec, n, spec.sliding_window)
            row[f"attention share @{n:,}"] = round(share, 3) if n <= spec.max_position_embeddings else math.nan
        crossover = crossover_length(spec)
        row["crossover tokens"] = math.nan if crossover is None else float(crossover)
        row["context limit"] = spec.max_position_embeddings
        row["sliding window"] = spec.sliding_window or 0
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def flop_table_text(frame: pd.DataFrame) -> str:
    """`flop_table` as text: "past limit" where a length exceeds the context limit, "never" for a crossover
    that does not happen, and a crossover beyond the context limit flagged as such."""
    shown = frame.astype(object)
    for column in frame.columns:
        if column.startswith("attention share"):
            shown[column] = [f"{v:.3f}" if v == v else "past limit" for v in frame[column]]
    shown["crossover tokens"] = [
        "never" if c != c else f"{int(c):,}" + (" (past limit)" if c > limit else "")
        for c, limit in zip(frame["crossover tokens"], frame["context limit"], strict=True)]
    shown["context limit"] = [f"{int(v):,}" for v in frame["context limit"]]
    shown["sliding window"] = [f"{int(v):,}" if v else "-" for v in frame["sliding window"]]
    return shown.to_string()


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                             window: int) -> torch.Tensor:
    """Causal attention where each query sees only the last ``window`` keys (itself included).

    Computed a window of queries at a time against the keys that window can reach, so the work is about
    n x 2·window instead of n²: a mask alone would still compute every score. q: [n, H, D]; k, v: [n, Hkv, D].
    """
    n = q.shape[0]
    out = torch.empty_like(q)
    for start in range(0, n, window):
        end = min(start + window, n)
        lo = max(0, start - window + 1)
        rows = torch.arange(start, end, device=q.device)[:, None]
        cols = torch.arange(lo, end, device=q.device)[None, :]
        mask = (cols <= rows) & (cols > rows - window)
        qs, ks, vs = (t.transpose(0, 1)[None] for t in (q[start:end], k[lo:end], v[lo:end]))
        gqa = qs.shape[1] != ks.shape[1]
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale,
                                                        enable_gqa=gqa)[0].transpose(0, 1)
    return out


def _mlp(block, x: torch.Tensor) -> torch.Tensor:
    gate, up = block.gate_up_proj(x).chunk(2, dim=-1)
    return block.down_proj(F.silu(gate) * up)


def _part_runners(model: LlamaModel, layer: int, n: int, window: int | None) -> dict[str, Callable[[], object]]:
    """Zero-argument callables running each part of ``model.layers[layer]`` on random activations of n tokens."""
    spec, block = model.spec, model.layers[layer]
    device, dtype, scale = model.device, model.dtype, model.attention_scale
    gen = torch.Generator(device=device).manual_seed(n)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    x, attn_out = rand(n, spec.hidden_size), rand(n, spec.num_heads * spec.head_dim)
    q = rand(n, spec.num_heads, spec.head_dim)
    k, v = rand(n, spec.num_kv_heads, spec.head_dim), rand(n, spec.num_kv_heads, spec.head_dim)
    if window is None or window >= n:
        def attention() -> object:
            return causal_attention(q, k, v, scale)
    else:
        def attention() -> object:
            return sliding_window_attention(q, k, v, scale, window)
    return {"attention": attention,
            "qkv + output projections": lambda: (block.qkv_proj(x), block.o_proj(attn_out)),
            "MLP": lambda: _mlp(block, x)}


@torch.inference_mode()
def time_layer_parts(model: LlamaModel, lengths: Sequence[int], *, window: int | None = None, layer: int = 0,
                     progress: ProgressFn | None = None) -> pd.DataFrame:
    """Seconds one layer of ``model`` spends in each part for a causal prefill of each length.

    The layer's own weights and the workbench's attention op run on random activations of the right shapes
    (timing does not depend on the values). ``window`` switches attention to a sliding window."""
    rows = []
    for i, n in enumerate(lengths):
        if progress is not None:
            progress(i, len(lengths), f"timing N = {n:,}")
        runners = _part_runners(model, layer, n, window)
        times = {part: best_seconds(run, model.device, repeats=3, min_total_s=0.15)
                 for part, run in runners.items()}
        flops = layer_flops(model.spec, n, window)
        rows.append({"tokens": n, **{f"{p} s": t for p, t in times.items()},
                     **{f"{p} GFLOP": f / 1e9 for p, f in flops.items()}})
    if progress is not None:
        progress(len(lengths), len(lengths), "done")
    frame = pd.DataFrame(rows).set_index("tokens")
    total = frame[[f"{p} s" for p in PARTS]].sum(axis=1)
    frame["attention share"] = frame["attention s"] / total
    return frame


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y against log x: 1 for linear growth, 2 for quadratic."""
    lx, ly = torch.log(torch.tensor(list(x), dtype=torch.float64)), torch.log(torch.tensor(list(y),
                                                                                       dtype=torch.float64))
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / (lx * lx).sum())
