"""Chapter 1's lab without a browser: FLOP counts, the sliding-window op, the memory and TTFT measurements, the
widgets' callbacks, the exercises and the closing table.

With no kernel, ipywidgets uses a dummy comm, so setting a control's ``value`` runs its callback in-process and
the FigureWidget's data can be read back directly.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import workbench
from workbench.cache.sizing import kv_bytes, weight_bytes
from workbench.lab import ch01_attention as ch01
from workbench.lab.attention_cost import (
    crossover_length,
    flop_table,
    flop_table_text,
    layer_flops,
    linear_params_per_layer,
    loglog_slope,
    sliding_window_attention,
    time_layer_parts,
)
from workbench.lab.ch01_measures import (
    TensorPeak,
    layer_activation_peak,
    materialized_attention,
    score_matrix_bytes,
    ttft_sweep,
)
from workbench.lab.kit.notebook import GiB
from workbench.models.attention import causal_attention
from workbench.workloads import prompt_of_length


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


def test_crossover_status_line_handles_a_window_without_crossover(tiny_model):
    lab = ch01.LayerScalingLab(tiny_model, lengths=(32, 64, 128), windows=(16,))
    assert "6,144" in lab.status.value


# ----------------------------------------------------------------------------------------------- memory
def test_tensor_peak_counts_storages_once_and_follows_frees():
    with TensorPeak() as peak:
        a = torch.empty(1000)  # 4,000 bytes
        view = a[:10]  # a view: no new storage
        b = torch.empty(500)
        del b
        c = torch.empty(250)
    assert peak.peak == 6000 and peak.live == 5000
    del a, view, c
    assert peak.live == 0


def test_materialized_attention_matches_the_engines_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(37, 9, 16, generator=gen), torch.randn(37, 3, 16, generator=gen), torch.randn(
        37, 3, 16, generator=gen)
    torch.testing.assert_close(materialized_attention(q, k, v, 0.25), causal_attention(q, k, v, 0.25),
                               rtol=1e-5, atol=1e-6)


def test_layer_memory_fused_is_linear_materialised_is_quadratic(tiny_model):
    fused = [layer_activation_peak(tiny_model, n, materialize=False) for n in (512, 1024)]
    assert fused[1] == 2 * fused[0]  # every tensor of a fused layer is N rows
    big = [layer_activation_peak(tiny_model, n, materialize=True) for n in (512, 1024)]
    assert big[1] > 3 * big[0]  # the [heads, N, N] scores take over: towards 4x per doubling
    assert big[1] > 2 * score_matrix_bytes(tiny_model, 1024)  # scores and their softmax are both alive


def test_attention_memory_lab(tiny_model):
    lab = ch01.AttentionMemoryLab(tiny_model, longest=1024)
    assert list(lab.frame.index) == [256, 512, 1024]
    s = lab.summary()
    assert s["materialized_mib"] > 2 * s["fused_mib"]
    assert s["materialized_slope"] > 1.5 and s["fused_slope"] == pytest.approx(1.0, abs=0.01)
    assert list(lab.figure.data[2].y) == pytest.approx([9 * n * n * 4 / 2**20 for n in (256, 512, 1024)])
    lab.longest.value = 2048
    assert list(lab.figure.data[0].x) == [256, 512, 1024, 2048] and "2,048" in lab.status.value


def test_ttft_lab_times_prefill_against_prompt_length(tiny_model, tokenizer):
    lab = ch01.TTFTLab(tiny_model, tokenizer, longest=512, repeats=1)
    assert list(lab.frame.index) == [64, 128, 256, 512]
    assert (lab.frame > 0).all().all()
    flops_line = list(lab.figure.data[2].y)
    assert flops_line[-1] == pytest.approx(lab.frame["ttft_ms"].iloc[-1])  # scaled to the longest point
    assert flops_line == sorted(flops_line)
    assert "decode step" in lab.status.value
    lab.longest.value = 1024
    assert lab.frame.index[-1] == 1024
    # 16x the prompt of a 2-layer model: the prefill dominates even on a loaded machine.
    assert lab.frame["ttft_ms"].iloc[-1] > lab.frame["ttft_ms"].iloc[0]
    with pytest.raises(ValueError, match="context"):
        ttft_sweep(tiny_model, tokenizer, [64, tiny_model.spec.max_context])


def test_prompt_of_length_is_exact(tokenizer):
    assert len(prompt_of_length(tokenizer, 333)) == 333
    with pytest.raises(ValueError, match="num_tokens"):
        prompt_of_length(tokenizer, 0)


# ----------------------------------------------------------------------------------- exercises and closing table
@pytest.mark.parametrize("key", sorted(ch01.EXERCISES))
def test_exercises_say_right_wrong_and_to_do(key):
    exercise = ch01.EXERCISES[key]
    expected = exercise.expected()
    assert exercise.check(expected).correct is True
    assert exercise.check(expected * 3 + 1).correct is False
    assert exercise.check(...).correct is None and "Not answered" in exercise.check(...).message


def test_exercise_answers_are_the_course_formulas():
    assert ch01.EXERCISES["full_context_kv"].expected() == 2 * 80 * 8 * 128 * 8192 * 2
    assert ch01.EXERCISES["kv_per_token"].expected() == 2 * 28 * 4 * 128 * 2
    assert ch01.EXERCISES["window_tokens"].expected() == 4096
    assert ch01.EXERCISES["score_bytes"].expected() == 9 * 8192 * 8192 * 4


def _frame(values: dict[str, list[float]], index: list[int]) -> pd.DataFrame:
    return pd.DataFrame(values, index=pd.Index(index, name="tokens"))


def test_takeaways_verdicts_follow_the_measurements():
    n = [512, 1024, 2048, 4096]
    quadratic = _frame({"attention s": [x * x for x in n], "attention share": [0.2, 0.3, 0.5, 0.6]}, n)
    ttft = _frame({"ttft_ms": [50, 100, 200, 400], "decode_step_ms": [20, 20, 21, 20]}, n)
    memory = _frame({"materialized_bytes": [4.0, 16, 64, 256], "fused_bytes": [1.0, 2, 4, 8]}, n)
    table = ch01.takeaways(quadratic, ttft, memory)
    assert list(table.columns) == ["the seed says", "measured here", "verdict"] and len(table) == 5
    assert table.loc[1, "verdict"] == "holds" and table.loc[4, "verdict"] == "holds"
    assert "32x" in table.loc[3, "measured here"] and "4x" in table.loc[3, "measured here"]
    assert table.loc[2, "verdict"].startswith("holds with a caveat")  # GQA: same attention FLOPs
    linear_parts_win = quadratic.assign(**{"attention share": [0.1, 0.15, 0.2, 0.3]})
    assert "caveat" in ch01.takeaways(linear_parts_win, ttft, memory).loc[1, "verdict"]
    flat = quadratic.assign(**{"attention s": n})
    assert ch01.takeaways(flat, ttft, memory).loc[1, "verdict"].startswith("not seen")
    flat_ttft = ttft.assign(ttft_ms=[30, 30, 31, 50])  # grows, but by less than 2x and within 3 decode steps
    assert ch01.takeaways(quadratic, flat_ttft, memory).loc[4, "verdict"].startswith("not seen")
