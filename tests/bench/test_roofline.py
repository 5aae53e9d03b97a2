"""The measured roofline: step FLOP and byte counts against hand arithmetic, the roofline's geometry, and real
engine steps measured on this machine sitting under its measured ceilings, on the correct side of the ridge."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import workbench
from workbench.roofline import (
    DevicePeaks,
    SeqWork,
    attended_pairs,
    count_step,
    decode_work,
    measure_decode_steps,
    measure_peaks,
    measure_prefill_steps,
    place_on_roofline,
    prefill_work,
)

# Timings on a shared 2-core machine wander; an achieved rate may beat a ceiling measured a moment earlier by
# this much before it means the count or the probe is wrong.
NOISE = 1.3


def test_smollm2_decode_step_counted_by_hand():
    """SmolLM2-135M (30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocab 49152, tied), fp32,
    one sequence decoding its 100th token."""
    spec = workbench.model_spec("smollm2-135m")
    c = count_step(spec, decode_work(1, 100), dtype=torch.float32)
    per_layer = 576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536
    assert per_layer == 3_538_944
    assert c.flops_linear == 2 * 1 * 30 * 3_538_944
    assert c.flops_attention == 4 * 100 * 576 * 30  # the token at position 99 scores and mixes 100 keys
    assert c.flops_lm_head == 2 * 576 * 49_152
    # 30 layers of linear weights and two norm gains, the final norm, the (tied) head, one embedding row.
    assert c.bytes_weights == 4 * (30 * (3_538_944 + 2 * 576) + 576 + 49_152 * 576 + 576)
    assert c.bytes_weights == 4 * (spec.num_parameters() + 576)
    kv_per_token = 2 * 30 * 3 * 64 * 4
    assert c.bytes_kv_read == 100 * kv_per_token == 4_608_000
    assert c.bytes_kv_written == kv_per_token
    per_token_layer = (576 + 576 + 384) + (576 + 576) + (576 + 576) + (576 + 2 * 1536) + (1536 + 576)
    assert c.bytes_activations == 4 * (30 * per_token_layer + 576) + 4 * 49_152
    assert c.intensity == pytest.approx(c.flops / c.bytes)
    assert 0.45 < c.intensity < 0.55  # ~2 FLOPs per 4-byte weight read


def test_llama3_8b_prefill_counted_by_hand():
    """Llama-3-8B (32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 128256, untied), bf16,
    a 512-token prompt in one step."""
    spec = workbench.model_spec("llama-3-8b")
    c = count_step(spec, prefill_work(512), dtype=torch.bfloat16)
    per_layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert per_layer == 218_103_808
    assert c.flops_linear == 2 * 512 * 32 * per_layer
    assert c.flops_attention == 4 * (512 * 513 // 2) * 4096 * 32
    assert c.flops_lm_head == 2 * 1 * 4096 * 128_256  # logits for the last position only
    assert c.bytes_weights == 2 * (32 * (per_layer + 2 * 4096) + 4096 + 128_256 * 4096 + 512 * 4096)
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert c.bytes_kv_read == c.bytes_kv_written == 512 * kv_per_token
    per_token_layer = (4096 + 4096 + 2048) + 2 * 4096 + 2 * 4096 + (4096 + 2 * 14336) + (14336 + 4096)
    assert c.bytes_activations == 2 * (512 * 32 * per_token_layer + 4096) + 4 * 128_256
    assert c.intensity > 100  # a long prefill: hundreds of FLOPs for every byte


def test_attended_pairs_for_chunks_and_windows():
    assert attended_pairs(4, 10) == 7 + 8 + 9 + 10  # a chunk of 4 after 6 cached tokens
    assert attended_pairs(4, 10, window=8) == 7 + 8 + 8 + 8
    assert attended_pairs(4, 10, window=5) == 4 * 5
    assert attended_pairs(10, 10, window=4) == 1 + 2 + 3 + 4 + 6 * 4
    assert attended_pairs(1, 100) == 100


def test_batching_decode_reads_the_weights_once_for_all_sequences():
    spec = workbench.model_spec("smollm2-135m")
    one, eight = count_step(spec, decode_work(1, 64)), count_step(spec, decode_work(8, 64))
    assert eight.flops == pytest.approx(8 * one.flops)
    assert eight.bytes_weights - one.bytes_weights == 7 * 576 * 4  # only the extra embedding rows
    assert eight.intensity / one.intensity == pytest.approx(8, rel=0.1)
    chunk = count_step(spec, (SeqWork(32, 96, logits=False),))
    assert chunk.flops_lm_head == 0 and chunk.bytes_kv_read == 96 * 46_080


@pytest.mark.parametrize(("make", "message"), [
    (lambda: SeqWork(0, 4), "new_tokens"), (lambda: SeqWork(5, 4), "context"), (lambda: decode_work(0, 8), "batch"),
    (lambda: prefill_work(8, cached=-1), "cached"),
    (lambda: count_step(workbench.model_spec("smollm2-135m"), ()), "at least one"),
    (lambda: measure_peaks("cpu", buffer_bytes=1 << 20), "16 MiB"), (lambda: measure_peaks("meta"), "CPU or CUDA"),
])
def test_bad_input_names_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_roofline_geometry():
    peaks = DevicePeaks("cpu", "float32", flops_per_s=100e9, bytes_per_s=20e9)
    assert peaks.ridge == 5.0
    assert peaks.roof(1.0) == 20e9 and peaks.roof(50.0) == 100e9
    assert peaks.bound(0.5) == "bandwidth" and peaks.bound(5.0) == "compute"
    assert peaks.floor_seconds(1e9, 1e9) == 0.05  # the bytes bind: 1 GB at 20 GB/s
    steps = pd.DataFrame({"intensity": [0.5, 50.0], "flops": [1e9, 1e11], "bytes": [2e9, 2e9],
                          "flops_per_s": [5e9, 50e9]})
    placed = place_on_roofline(steps, peaks)
    assert list(placed["bound"]) == ["bandwidth", "compute"]
    assert list(placed["share_of_roof"]) == pytest.approx([0.5, 0.5])
    assert list(placed["floor_s"]) == pytest.approx([0.1, 1.0])


def test_real_steps_sit_under_the_measured_roof_on_their_side_of_the_ridge(real_model):
    """On this CPU, with the real model: decode at batch 1 is left of the ridge, a 512-token prefill right of it,
    and neither beats the ceilings measured around them by more than noise."""
    # A 128 MiB buffer is 4x the CI CPU's L3; square products of 512 and 1024 already run at the peak there.
    probes = {"buffer_bytes": 128 << 20, "matmul_sizes": (512, 1024)}
    before = measure_peaks("cpu", torch.float32, **probes)
    prefill = measure_prefill_steps(real_model, [512], repeats=1)
    decode = measure_decode_steps(real_model, [1], [32], steps=4)
    after = measure_peaks("cpu", torch.float32, **probes)
    peaks = DevicePeaks("cpu", "float32", max(before.flops_per_s, after.flops_per_s),
                        max(before.bytes_per_s, after.bytes_per_s))
    assert min(before.flops_per_s, before.bytes_per_s, *before.flops_by_probe.values(),
               *before.bandwidth_by_probe.values()) > 0
    points = place_on_roofline(pd.concat([prefill, decode], ignore_index=True), peaks)
    assert (points["flops_per_s"] <= NOISE * peaks.flops_per_s).all(), points
    assert (points["bytes_per_s"] <= NOISE * peaks.bytes_per_s).all(), points
    long, one = points.iloc[0], points.iloc[1]
    assert (long["kind"], one["kind"], one["batch"]) == ("prefill", "decode", 1)
    assert one["intensity"] < peaks.ridge < long["intensity"], (one["intensity"], peaks.ridge, long["intensity"])
    assert one["bound"] == "bandwidth" and long["bound"] == "compute"
    assert one["context"] == 32 + 2 and one["step_s"] > 0  # the middle of four decode steps after a 32-token prompt


@pytest.mark.gpu
def test_cuda_steps_sit_under_the_measured_roof_on_their_side_of_the_ridge():
    """The same on a GPU, in bf16, with Llama-3-8B's shapes (four layers, random weights): the real model is too
    small there for a batch-1 decode to be more than kernel launches."""
    model = workbench.random_model("llama-3-8b", num_layers=4, dtype=torch.bfloat16, device="cuda")
    before = measure_peaks("cuda", torch.bfloat16)
    prefill = measure_prefill_steps(model, [4096], repeats=1)
    decode = measure_decode_steps(model, [1], [128], steps=4)
    after = measure_peaks("cuda", torch.bfloat16)
    peaks = DevicePeaks("cuda", "bfloat16", max(before.flops_per_s, after.flops_per_s),
                        max(before.bytes_per_s, after.bytes_per_s))
    points = place_on_roofline(pd.concat([prefill, decode], ignore_index=True), peaks)
    assert (points["flops_per_s"] <= NOISE * peaks.flops_per_s).all(), points
    assert (points["bytes_per_s"] <= NOISE * peaks.bytes_per_s).all(), points
    long, one = points.iloc[0], points.iloc[1]
    assert one["intensity"] < peaks.ridge < long["intensity"], (one["intensity"], peaks.ridge, long["intensity"])
