"""Chapter 1's FLOP counts, the sliding-window op, the layer timing and the KV memory panels, without a browser.

With no kernel, ipywidgets uses a dummy comm, so setting a control's ``value`` runs its callback in-process; the
panels' results and figures (traces read by name) are checked directly.
"""

from __future__ import annotations

import math

import pytest
import torch

import workbench
from workbench.cache.sizing import kv_bytes, weight_bytes
from workbench.lab import ch01
from workbench.lab.ch01.panels import FLOP_SHARE, KV_OF_BATCH, KV_PER_SEQUENCE, WEIGHTS
from workbench.lab.kit.figures import trace
from workbench.lab.kit.notebook import GiB
from workbench.models.attention import causal_attention
from workbench.roofline.layer_cost import (
    crossover_length,
    flop_table,
    flop_table_text,
    layer_flops,
    linear_params_per_layer,
    loglog_slope,
    sliding_window_attention,
    time_layer_parts,
)


def test_attention_flops_quadruple_when_n_doubles_and_linear_parts_double():
    spec = workbench.model_spec("llama-3-8b")
    small, big = layer_flops(spec, 4096), layer_flops(spec, 8192)
    assert big["attention"] / small["attention"] == pytest.approx(4.0, rel=1e-3)
    assert big["MLP"] / small["MLP"] == pytest.approx(2.0)
    assert big["qkv + output projections"] / small["qkv + output projections"] == pytest.approx(2.0)


def test_crossover_length_is_where_attention_equals_the_linear_parts():
    for name in ("smollm2-135m", "llama-3-8b", "llama-3-70b"):
        spec = workbench.model_spec(name)
        n = crossover_length(spec)
        flops = layer_flops(spec, n)
        assert flops["attention"] == pytest.approx(flops["MLP"] + flops["qkv + output projections"], rel=1e-3)
    # SmolLM2: 3,538,944 linear weights per layer over a 576-wide query.
    assert linear_params_per_layer(workbench.model_spec("smollm2-135m")) == 3_538_944
    assert crossover_length(workbench.model_spec("smollm2-135m")) == 6144


def test_flop_table_shares_grow_with_length():
    table = flop_table([workbench.model_spec("qwen2.5-7b")], [1024, 8192, 131072])  # a 131,072-token context
    shares = table.iloc[0, :3].to_list()
    assert shares == sorted(shares) and 0 < shares[0] < 0.05 and shares[-1] > 0.5


def test_sliding_window_flops_grow_linearly_beyond_the_window():
    spec = workbench.model_spec("smollm2-135m")
    a, b = layer_flops(spec, 4096, window=256)["attention"], layer_flops(spec, 8192, window=256)["attention"]
    assert b / a == pytest.approx(2.0, rel=0.05)
    assert layer_flops(spec, 128, window=256) == layer_flops(spec, 128)


@pytest.mark.parametrize(("n", "window", "heads", "kv_heads"), [(70, 16, 9, 3), (64, 64, 4, 4), (33, 1, 8, 1)])
def test_sliding_window_attention_matches_a_masked_reference(n, window, heads, kv_heads):
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(n, heads, 32, generator=gen)
    k, v = torch.randn(n, kv_heads, 32, generator=gen), torch.randn(n, kv_heads, 32, generator=gen)
    got = sliding_window_attention(q, k, v, 0.2, window)
    # Reference: dense scores with every key outside (i - window, i] masked out.
    kk, vv = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, kk) * 0.2
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    scores = scores.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if window >= n:
        torch.testing.assert_close(got, causal_attention(q, k, v, 0.2), rtol=1e-4, atol=1e-5)


def test_loglog_slope_recovers_powers():
    xs = [100, 200, 400, 800]
    assert loglog_slope(xs, [x**2 for x in xs]) == pytest.approx(2.0)
    assert loglog_slope(xs, [3 * x for x in xs]) == pytest.approx(1.0)


def test_time_layer_parts_reports_every_part(tiny_model):
    frame = time_layer_parts(tiny_model, [32, 64], window=16)
    assert list(frame.index) == [32, 64]
    assert (frame[["attention s", "qkv + output projections s", "MLP s"]] > 0).all().all()
    assert frame["attention share"].between(0, 1).all()


def test_layer_scaling_lab_measures_when_asked_and_redraws_on_a_control(tiny_model):
    lab = ch01.LayerScalingLab(tiny_model, lengths=(32, 64, 128, 256), windows=(16,))
    assert not lab.measured  # building a panel measures nothing
    with lab.changes():
        lab.max_tokens.value = 128
    timing = lab.result
    assert list(timing.frame.index) == [32, 64, 128] and timing.window is None
    attention = trace(lab.figure, "attention")
    assert list(attention.x) == [32, 64, 128] and all(y > 0 for y in attention.y)
    assert timing.crossover() == 6144  # full causal SmolLM2: linear weights per layer / query width
    full_flops = list(trace(lab.figure, FLOP_SHARE).y)
    lab.window.value = 16  # a control change re-measures with a sliding window
    windowed = lab.result
    assert windowed is not timing and windowed.window == 16
    assert list(trace(lab.figure, FLOP_SHARE).y)[-1] < full_flops[-1]
    assert not any(c.disabled for c in lab.controls)  # re-enabled after measuring


def test_the_windowed_variant_reports_its_own_crossover(tiny_model):
    """Issue 30: after switching to a 256-token window the panel reported the full-attention crossover."""
    lab = ch01.LayerScalingLab(tiny_model, lengths=(128, 256, 512), windows=(256,))
    with lab.changes():
        lab.window.value = 256
    assert lab.result.window == 256
    # 2 x 576 x 256 FLOPs per token against 3.5 M linear weights: attention never catches up past the window.
    assert lab.result.crossover() is None
    assert crossover_length(lab.result.spec) == 6144  # ... while full causal attention does


def test_kv_memory_lab_sizes_by_kv_heads_not_query_heads():
    lab = ch01.KVMemoryLab("cpu", model="llama-3-70b", context=8192, kv_cache_dtype="bfloat16", batch=1).run()
    bars = dict(zip(trace(lab.figure, KV_PER_SEQUENCE).x, trace(lab.figure, KV_PER_SEQUENCE).y, strict=True))
    spec = workbench.model_spec("llama-3-70b")
    assert bars["GQA"] * GiB == kv_bytes(spec, 8192, kv_format=torch.bfloat16)  # 8 KV heads: 2.5 GiB
    assert bars["MHA"] == pytest.approx(8 * bars["GQA"])  # 64 query heads
    assert bars["MQA"] == pytest.approx(bars["GQA"] / 8)
    assert lab.result.own.name == "GQA" and lab.result.per_token == 327_680


def test_kv_memory_lab_controls_update_the_figure():
    lab = ch01.KVMemoryLab("cpu", model="llama-3-8b", context=8192, kv_cache_dtype="bfloat16", batch=1).run()

    def bars(name):
        return dict(zip(trace(lab.figure, name).x, trace(lab.figure, name).y, strict=True))

    gqa_bf16 = bars(KV_PER_SEQUENCE)["GQA"]
    lab.kv_cache_dtype.value = "float32"
    assert bars(KV_PER_SEQUENCE)["GQA"] == pytest.approx(2 * gqa_bf16)
    one = bars(KV_OF_BATCH)
    lab.batch.value = 4
    assert bars(KV_OF_BATCH) == pytest.approx({k: 4 * v for k, v in one.items()})
    lab.memory.value = 80 * GiB
    weights = weight_bytes(workbench.model_spec("llama-3-8b"), torch.bfloat16)
    assert bars(WEIGHTS)["GQA"] == pytest.approx(100 * weights / (80 * GiB))
    lab.model.value = "llama-2-7b"  # MHA: its own row is the MHA row
    assert "llama-2-7b" in lab.figure.layout.title.text and lab.result.own.name == "MHA"
    lab.model.value = "mistral-7b"
    lab.context.value = 32768  # beyond the 4,096 window: SWA keeps only the window
    swa = bars(KV_PER_SEQUENCE)
    assert swa["GQA + SWA 4096"] == pytest.approx(swa["GQA"] * 4096 / 32768)
    assert lab.result.own.name == "GQA + SWA 4096"
    assert lab.result.total == pytest.approx(lab.result.weights + 4 * swa["GQA + SWA 4096"] * GiB)
    assert math.isclose(sum(trace(lab.figure, KV_PER_SEQUENCE).y), sum(swa.values()))


# ---------------------------------------------------------------------------------------- crossover corrections
def test_crossover_follows_the_configs_own_sliding_window():
    mistral = workbench.model_spec("mistral-7b")
    assert mistral.sliding_window == 4096
    assert crossover_length(mistral) is None  # 2·q·W < P: past the window attention grows linearly, and slower
    # A window wide enough for attention to catch up: the crossover is where the windowed FLOPs are equal.
    wide = mistral.replace(sliding_window=40_000)
    n = crossover_length(wide)
    assert n is not None and n > 40_000
    flops = layer_flops(wide, n, wide.sliding_window)
    assert flops["attention"] == pytest.approx(flops["MLP"] + flops["qkv + output projections"], rel=1e-3)
    # A window longer than the full-causal crossover changes nothing.
    assert crossover_length(mistral.replace(sliding_window=60_000)) == crossover_length(mistral.replace(
        sliding_window=None))


def test_flop_table_uses_the_window_and_blanks_lengths_past_the_context_limit():
    specs = [workbench.model_spec(n) for n in ("mistral-7b", "llama-2-7b", "qwen2.5-7b")]
    table = flop_table(specs, [1024, 32768, 131072])
    mistral = table.loc["mistral-7b"]
    assert math.isnan(mistral["attention share @131,072"])  # past its 32,768-token limit
    full = layer_flops(specs[0].replace(sliding_window=None), 32768)
    assert mistral["attention share @32,768"] < 0.5 * full["attention"] / sum(full.values())
    assert math.isnan(mistral["crossover tokens"]) and mistral["sliding window"] == 4096
    assert math.isnan(table.loc["llama-2-7b", "attention share @32,768"])  # 4,096-token context
    assert table.loc["qwen2.5-7b", "attention share @131,072"] > 0.5
    text = flop_table_text(table)
    assert "past limit" in text and "never" in text and "(past limit)" in text  # Llama-2-7B: 49,408 > 4,096
