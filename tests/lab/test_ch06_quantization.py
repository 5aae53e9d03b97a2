"""Chapter 6's lab: the panels measure and redraw, the sweep round-trips through its file, the arithmetic matches
hand-computed bytes, the call-outs and exercises compute what they say.

The panels run on a two-layer random-weight model with SmolLM2's shapes (its full vocabulary, so the real
tokenizer's held-out ids fit, and a small MLP): the test checks the panels' wiring and arithmetic, not quality or
speed, which are only meaningful on the real weights (the notebook under nbval and
benchmarks/bench_weight_quant.py measure those).
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch

from workbench.lab import ch06_quantization as ch06
from workbench.lab.ch06_activations import VARIANTS, capture_inputs
from workbench.models import load_tokenizer, model_spec, random_model
from workbench.quality import format_sweep as ch06_sweep

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small():
    # Renamed: labels treat any "smollm2-135m*" spec as the real weights.
    spec = model_spec("smollm2-135m").replace(name="tiny-random", num_layers=2, intermediate_size=256)
    return random_model(spec, device="cpu", seed=6), load_tokenizer()


@cache
def kv_lab():
    model, tokenizer = small()
    return ch06.KVFormatLab(model, tokenizer, heldout_tokens=256)


@cache
def weight_lab():
    model, tokenizer = small()
    return ch06.WeightFormatLab(model, tokenizer, heldout_tokens=128, decode_tokens=4, repeats=1)


@cache
def sweep_frame():
    model, tokenizer = small()
    ids = ch06_sweep.heldout_ids(tokenizer, 96)
    reference = ch06_sweep.logits_through_cache(model, ids, "auto")
    int8 = ch06.weight_variant(model, "int8")
    rows = [ch06_sweep.measure_config(m, tokenizer, kv, reference, ids, recall_lengths=(256,), recall_per_length=1,
                                      requests=2, decode_tokens=2)
            for m, kv in ((model, "auto"), (model, "int8"), (model, "int4"), (int8, "auto"), (int8, "int8"))]
    return ch06_sweep.pd.DataFrame(rows)


def test_kv_bytes_per_token_match_hand_computed_layouts():
    spec = model_spec("smollm2-135m")  # 30 layers, 3 KV heads of 64; x2 for K and V
    pairs = 2 * 30 * 3
    assert ch06.kv_breakdown(spec, "auto") == {"bytes_per_token": pairs * 64 * 4, "data_bytes": pairs * 64 * 4,
                                               "scale_bytes": 0}
    assert ch06.kv_breakdown(spec, "int8") == {"bytes_per_token": pairs * (64 + 2), "data_bytes": pairs * 64,
                                               "scale_bytes": pairs * 2}
    # int4: two values per byte, an fp16 scale and zero per group of 32 values
    assert ch06.kv_breakdown(spec, "int4") == {"bytes_per_token": pairs * (32 + 2 * 2 * 2), "data_bytes": pairs * 32,
                                               "scale_bytes": pairs * 8}
    assert ch06.kv_breakdown(spec, "fp8_e4m3")["scale_bytes"] == 0  # per-layer static scales, not per slot


def test_kv_panel_measures_every_format_and_rereads_capacity_at_the_budget():
    lab = kv_lab()
    table = lab.table()
    assert list(table.index) == list(ch06_sweep.KV_FORMATS)
    assert table.loc["auto", "kl_mean"] == pytest.approx(0.0, abs=1e-9) and table.loc["auto", "top1_agreement"] == 1
    assert (table.drop(index="auto").kl_mean > 0).all()
    by_size = table.sort_values("bytes_per_token", ascending=False).sequences_at_budget
    assert by_size.is_monotonic_increasing and by_size.iloc[-1] > by_size.iloc[0]  # fewer bytes, more sequences
    assert int(table.loc["int8", "blocks_at_budget"]) == 2**30 // (table.loc["int8", "bytes_per_token"] * 16)
    lab.budget.value = 4.0  # redraw only: nothing re-measured
    frame_id = id(lab.frame)
    assert int(lab.table().loc["int8", "blocks_at_budget"]) == 4 * 2**30 // (table.loc["int8", "bytes_per_token"] * 16)
    assert id(lab.frame) == frame_id and "4 GiB" in lab.status.value
    lab.kv_format.value = "int4"
    assert f"{int(table.loc['int4', 'bytes_per_token']):,} bytes per token" in lab.status.value
    assert len(lab.stored_outputs(png=False)) == 1 + 3 + 1


def test_weight_panel_keeps_fp32_as_the_baseline_and_measures_a_format_when_chosen():
    lab = weight_lab()
    assert list(lab.frame.index) == ["fp32", "int8"]
    assert lab.frame.loc["fp32", "speedup_vs_fp32"] == 1.0 and lab.frame.loc["fp32", "top1_agreement"] == 1.0
    assert lab.frame.loc["int8", "weight_bytes_allocated"] < lab.frame.loc["fp32", "weight_bytes_allocated"]
    assert lab.frame.loc["int8", "kl_mean"] > 0
    lab.weights.value = "bf16"
    assert list(lab.frame.index) == ["fp32", "int8", "bf16"] and "bfloat16" in lab.status.value
    assert lab.frame.loc["bf16", "weight_bytes_allocated"] == pytest.approx(
        lab.frame.loc["fp32", "weight_bytes_allocated"] / 2, rel=0.01)


def test_activation_panel_separates_weight_and_activation_rounding():
    model, tokenizer = small()
    lab = ch06.ActivationLab(model, tokenizer, layer=1, projection="down_proj", tokens=64)
    assert list(lab.errors.index) == list(VARIANTS)
    assert lab.errors.loc[VARIANTS[0], "input_error"] == 0.0  # weights only: inputs exact
    assert (lab.errors.relative_error > 0).all() and (lab.errors.iloc[1:].input_error > 0).all()
    lab.projection.value = "qkv_proj"
    assert "qkv_proj" in lab.status.value
    with pytest.raises(ValueError, match="layer"):
        capture_inputs(model, [1, 2, 3], 2, "down_proj")
    with pytest.raises(ValueError, match="float model"):
        capture_inputs(ch06.weight_variant(model, "int8"), [1, 2, 3], 0, "down_proj")


def test_sweep_round_trips_through_its_file_and_feeds_the_closing_table(tmp_path):
    frame = sweep_frame()
    with pytest.raises(FileNotFoundError, match="bench_weight_quant"):
        ch06.load_sweep(tmp_path / "absent.json")
    path = tmp_path / "sweep.json"
    ch06_sweep.save_sweep(frame, {"int8_over_fp32_median": 1.0}, path)
    machine = json.loads(path.read_text())["meta"]["machine"]  # the int8/fp32 ratio depends on it: ISA, threads
    assert torch.backends.cpu.get_cpu_capability() in machine and f"{torch.get_num_threads()} threads" in machine
    lab = ch06.SweepLab(path=path)
    assert "CACHED" in lab.figure.layout.title.subtitle.text
    table = lab.layered_table()
    assert len(table) == 5 and {"recall@256", "decode_tokens_per_s", "throughput_tokens_per_s"} <= set(table.columns)
    assert table.loc["int8 linears weights, auto KV", "weight_bytes"] < table.loc["fp32 weights, auto KV",
                                                                                  "weight_bytes"]
    lab.metric.value = "top1_agreement"
    assert lab.figure.layout.yaxis.type == "linear" and len(lab.figure.data) == 2
    verdicts = ch06.takeaways(kv_lab().table(), weight_lab().frame, lab.sweep)
    assert len(verdicts) == 5 and verdicts["measured here"].str.len().min() > 20


def test_seed_checks_and_exercises_compute_their_answers():
    checks = ch06.seed_checks(kv_lab().table())
    assert "1.675" in checks.iloc[3]["computed / measured here"]
    assert "1.6%" in checks.iloc[0]["computed / measured here"]  # 2 bytes of scale per 128 one-byte values
    ex = ch06.EXERCISES
    assert ex["int8_kv_bytes"].check(11_880).correct and not ex["int8_kv_bytes"].check(11_520).correct
    assert ex["bandwidth_ratio"].check(1.675).correct and not ex["bandwidth_ratio"].check(2.0).correct
    hierarchy = ch06.seed_hierarchy().set_index(["weights", "kv"])
    assert ex["int4_fp8_sequences"].check(int(hierarchy.loc[("int4", "fp8_e4m3"), "sequences_80GiB_90pct"])).correct
    assert ex["int4_fp8_sequences"].check(None).correct is None
