"""Chapter 1's lab without a browser: FLOP counts, the sliding-window op, and the widgets' callbacks.

With no kernel, ipywidgets uses a dummy comm, so setting a control's ``value`` runs its callback in-process and
the FigureWidget's data can be read back directly.
"""

from __future__ import annotations

import math

import pytest
import torch

import workbench
from workbench.cache.sizing import kv_bytes, weight_bytes
from workbench.lab import ch01_attention as ch01
from workbench.lab.attention_cost import (
    crossover_length,
    flop_table,
    layer_flops,
    linear_params_per_layer,
    loglog_slope,
    sliding_window_attention,
    time_layer_parts,
)
from workbench.lab.common import GiB
from workbench.models.attention import causal_attention


@pytest.fixture(scope="module")
def tiny_model():
    """SmolLM2's shapes, two layers, random weights: real layer widths, fast enough for unit tests."""
    return workbench.random_model("smollm2-135m", num_layers=2, device="cpu")


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
    table = flop_table([workbench.model_spec("llama-3-8b")], [1024, 8192, 131072])
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


def test_layer_scaling_lab_redraws_when_a_control_changes(tiny_model):
    lab = ch01.LayerScalingLab(tiny_model, lengths=(32, 64, 128, 256), windows=(16,))
    fig = lab.figure
    assert list(fig.data[0].x) == [32, 64, 128, 256]
    assert all(y > 0 for y in fig.data[0].y)
    assert "slopes" in lab.status.value and "6,144" in lab.status.value
    full_flops = list(fig.data[6].y)
    lab.window.value = 16  # a control change re-measures with a sliding window
    assert list(fig.data[6].y) != full_flops and fig.data[6].y[-1] < full_flops[-1]
    lab.max_tokens.value = 128
    assert list(fig.data[0].x) == [32, 64, 128] and len(lab.frame) == 3
    assert not any(c.disabled for c in lab.controls)  # re-enabled after measuring


def test_kv_memory_lab_sizes_by_kv_heads_not_query_heads():
    lab = ch01.KVMemoryLab("cpu", model="llama-3-70b", context=8192, kv_dtype="bfloat16", batch=1)
    bars = dict(zip(lab.figure.data[0].x, lab.figure.data[0].y, strict=True))
    spec = workbench.model_spec("llama-3-70b")
    assert bars["GQA"] * GiB == kv_bytes(spec, 8192, kv_format=torch.bfloat16)  # 8 KV heads: 2.5 GiB
    assert bars["MHA"] == pytest.approx(8 * bars["GQA"])  # 64 query heads
    assert bars["MQA"] == pytest.approx(bars["GQA"] / 8)
    assert "GQA" in lab.status.value and "327,680 B per token" in lab.status.value


def test_kv_memory_lab_controls_update_the_figure():
    lab = ch01.KVMemoryLab("cpu", model="llama-3-8b", context=8192, kv_dtype="bfloat16", batch=1)
    gqa_bf16 = lab.figure.data[0].y[1]
    lab.kv_dtype.value = "float32"
    assert lab.figure.data[0].y[1] == pytest.approx(2 * gqa_bf16)
    one = list(lab.figure.data[2].y)
    lab.batch.value = 4
    assert list(lab.figure.data[2].y) == pytest.approx([4 * y for y in one])
    lab.memory.value = 80 * GiB
    weights = weight_bytes(workbench.model_spec("llama-3-8b"), torch.bfloat16)
    assert lab.figure.data[1].y[0] == pytest.approx(100 * weights / (80 * GiB))
    lab.model.value = "llama-2-7b"  # MHA: its own row is the MHA row
    assert "llama-2-7b" in lab.figure.layout.title.text and "(MHA)" in lab.status.value
    lab.model.value = "mistral-7b"
    lab.context.value = 32768  # beyond the 4,096 window: SWA keeps only the window
    bars = dict(zip(lab.figure.data[0].x, lab.figure.data[0].y, strict=True))
    assert bars["GQA + SWA 4096"] == pytest.approx(bars["GQA"] * 4096 / 32768)
    assert "SWA" in lab.status.value
    assert math.isclose(sum(lab.figure.data[0].y), sum(bars.values()))
