"""Chapter 4's roofline and decode panels without a browser (`workbench.lab.ch04.panels`, `.steps`), the course's
numbers recomputed (`.arithmetic`), the exercises (right, wrong, unanswered) and the chapter's Baseline.

The tiny model (2 layers of SmolLM2's shapes, random weights) keeps the runs short; assertions are about the
structure of what was measured, not about timings.
"""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.lab import ch04
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.figures import trace
from workbench.roofline import DevicePeaks, count_step, decode_work, measure_peaks, prefill_work

SWEEP = [("small", (16, 128), (1, 4), 16)]
SMALL_PROBES = {"buffer_bytes": 32 << 20, "matmul_sizes": (256,)}


@pytest.fixture(scope="module")
def peaks():
    return measure_peaks("cpu", torch.float32, **SMALL_PROBES)


@pytest.fixture(scope="module")
def roofline(tiny_model, peaks):
    return ch04.RooflineLab(tiny_model, peaks=peaks, sweeps=SWEEP).run()


@pytest.fixture(scope="module")
def decode(tiny_model, peaks):
    return ch04.DecodeLab(tiny_model, peaks, batches=(1, 4), contexts=(16, 64), context=16, steps=2).run()


def test_panels_do_not_measure_when_built(tiny_model, peaks):
    lab = ch04.RooflineLab(tiny_model, peaks=peaks, sweeps=SWEEP)
    assert not lab.measured and lab.status.value == ""


def test_roofline_lab_places_every_step(roofline, peaks):
    steps = roofline.result
    assert list(steps.points["kind"]) == ["prefill", "prefill", "decode", "decode"]
    fig = roofline.figure
    assert list(trace(fig, ch04.panels.PREFILL_POINTS).text) == ["16", "128"]
    assert list(trace(fig, ch04.panels.DECODE_POINTS).text) == ["b=1", "b=4"]
    roof = trace(fig, ch04.panels.ROOF_LINE)
    assert min(roof.y) > 0 and max(roof.y) == pytest.approx(peaks.flops_per_s / 1e9)
    assert fig.layout.shapes[0].x0 == pytest.approx(peaks.ridge)
    assert f"{peaks.ridge:.1f} FLOP per byte" in roofline.status.value
    assert steps.point("decode", 4)["batch"] == 4
    with pytest.raises(ValueError, match="no prefill step measured at 99"):
        steps.point("prefill", 99)
    assert [caption for caption, _ in roofline.stored_tables()] == ["Every step on the roofline",
                                                                   "The device's ceilings, per probe"]


def test_roofline_steps_give_the_chapter_baseline(roofline):
    steps = roofline.result
    base = steps.baseline()
    assert isinstance(base, Baseline) and base.chapter == "ch04"
    assert base.prefill_tokens == 128  # no 1,024-token prefill in this sweep: the longest one
    assert base.prefill_ms_per_token == pytest.approx(steps.point("prefill", 128)["step_s"] * 1e3 / 128)
    assert base.decode_step_ms == pytest.approx(steps.decode_one["step_s"] * 1e3)
    assert "warm-up" in base.source and "batch-1 decode step" in base.line()


def test_roofline_lab_can_remeasure_its_peaks(tiny_model, peaks):
    lab = ch04.RooflineLab(tiny_model, peaks=peaks, sweeps=SWEEP, peak_options=SMALL_PROBES).run()
    assert lab.peaks is peaks and lab.result.peaks is peaks
    lab.remeasure.value = True  # a control change re-runs everything, the peaks included
    assert lab.result.peaks is not peaks and lab.result.peaks.flops_per_s > 0


def test_decode_lab_floor_and_bytes_per_token(decode, peaks):
    sweep = decode.result
    assert list(sweep.by_batch["batch"]) == [1, 4] and list(sweep.by_context["context"]) == [16 + 1, 64 + 1]
    assert list(sweep.by_batch["bandwidth_floor_s"]) == pytest.approx(list(sweep.by_batch["bytes"] / peaks.bytes_per_s))
    weights, kv = trace(decode.parts_figure, "weights"), trace(decode.parts_figure, "KV read + written")
    assert weights.y[1] == pytest.approx(weights.y[0] / 4, rel=0.01)  # four sequences share one read of the weights
    assert kv.y[1] == pytest.approx(kv.y[0])  # but each reads its own KV
    assert sweep.throughput_gain == pytest.approx(4 / sweep.itl_growth)
    decode.context.value = 64  # re-measures the batch sweep at the longer context
    assert list(decode.result.by_batch["context"]) == [65, 65]
    assert "floor" in decode.status.value


def test_seed_numbers_recomputed(peaks):
    claims = ch04.seed_decode_claims(peaks)
    # 141 GB on one 80 GiB A100 is no deployment: the floor is taken at TP 2, each GPU reading half the weights.
    assert claims.loc["llama-3-70b", "on one A100 80GB"] == "needs TP >= 2" and claims.loc["llama-3-70b", "at TP"] == 2
    assert claims.loc["llama-3-70b", "GPU floor (ms)"] == pytest.approx(141.11e9 / 2 / 2.039e12 * 1e3, rel=1e-3)
    assert claims.loc["llama-2-7b", "GPU floor (ms)"] == pytest.approx(13.48e9 / 2.039e12 * 1e3, rel=1e-3)
    assert claims.loc["llama-2-7b", "implied TB/s per GPU"] == "0.45-0.67"
    assert "at most 0.67 TB/s per GPU, 33%" in ch04.implied_bandwidth_reading(claims)
    assert ch04.streaming_arithmetic() == {"streamed_s": 15.0, "buffered_s": 3.0, "rate_for_equal_s": 100.0}
    with pytest.raises(ValueError, match="bytes_per_s"):
        ch04.decode_floor_ms(workbench.model_spec("llama-2-7b"), 0)


def test_ridge_batch_is_where_decode_intensity_crosses_the_ridge():
    spec = workbench.model_spec("smollm2-135m")
    peaks = DevicePeaks("cpu", "float32", flops_per_s=60e9, bytes_per_s=15e9)  # ridge 4 FLOP/B
    batch = ch04.ridge_batch(spec, peaks)
    intensity = [count_step(spec, decode_work(b, 64)).intensity for b in (batch - 1, batch)]
    assert intensity[0] < 4 <= intensity[1]
    assert batch == 9  # ~0.5 FLOP/B per sequence in fp32, a little less as the KV adds up


def test_ridge_prompt_length_is_where_prefill_intensity_crosses_the_ridge():
    spec = workbench.model_spec("smollm2-135m")
    peaks = DevicePeaks("cpu", "float32", flops_per_s=60e9, bytes_per_s=15e9)
    n = ch04.ridge_prompt_length(spec, peaks)
    assert count_step(spec, prefill_work(n - 1)).intensity < 4 <= count_step(spec, prefill_work(n)).intensity
    assert ch04.ridge_prompt_length(spec, DevicePeaks("cpu", "float32", 1e15, 1e9), limit=64) == 65  # never


def test_exercises_right_wrong_and_unanswered(roofline, tiny_model):
    ttft = ch04.PrefillTTFTLab(tiny_model, lengths=(16, 64)).run().result
    exercises = ch04.exercises(roofline.result, ttft)
    assert set(exercises) == {"floor_70b", "decode_intensity", "ridge_batch", "ttft_ratio"}
    for exercise in exercises.values():
        expected = exercise.expected()
        assert exercise.check(expected).correct is True
        assert exercise.check(None).correct is None
        assert exercise.check(expected * 3 + 1).correct is False
    assert exercises["floor_70b"].check(34.8).correct is True  # within 2%
    assert exercises["floor_70b"].check(70.6).correct is False  # the one-GPU figure: no deployment
    assert exercises["ttft_ratio"].expected() == pytest.approx(ttft.ttft_long_ms / ttft.ttft_short_ms)
