"""Chapter 6's lab: the panels measure when asked and redraw, the sweep round-trips through its file, the arithmetic
matches hand-computed bytes, the exercises and the closing table compute what they say.

The panels run on the tiny random model (SmolLM2's shapes, two layers): the tests check the panels' wiring and
arithmetic, not quality or speed, which are only meaningful on the real weights (the notebook and
benchmarks/bench_weight_quant.py measure those).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pandas as pd
import pytest
import torch

from workbench.lab import ch06
from workbench.lab.ch06.activations import VARIANTS
from workbench.lab.ch06.capacity_run import MemoryLimitedRun
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace
from workbench.models import model_spec
from workbench.quality import format_sweep as sweep_engine
from workbench_kernels.kv_quant import KV_FORMATS

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module", autouse=True)
def one_thread_for_the_module_fixtures():
    """The module's panels and sweep are measured once, in module fixtures, which run before the function-scoped
    ``one_torch_thread``: one thread for them too (two threads spin on a loaded machine, tests/conftest.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def kv_lab(tiny_model, tokenizer):
    return ch06.KVFormatLab(tiny_model, tokenizer, heldout_tokens=256).run()


@pytest.fixture(scope="module")
def weight_lab(tiny_model, tokenizer):
    # peer=False: llama.cpp's line runs llama-bench where it is built (a third-party program); tested below with a
    # stored run instead.
    return ch06.WeightFormatLab(tiny_model, tokenizer, heldout_tokens=128, decode_tokens=4, repeats=1,
                                peer=False).run()


@pytest.fixture(scope="module")
def sweep_path(tiny_model, tokenizer, tmp_path_factory):
    ids = sweep_engine.heldout_ids(tokenizer, 96)
    reference = sweep_engine.logits_through_cache(tiny_model, ids, "auto")
    int8 = ch06.weight_variant(tiny_model, "int8")
    rows = [sweep_engine.measure_config(m, tokenizer, kv, reference, ids, recall_lengths=(256,), recall_per_length=1,
                                        requests=2, decode_tokens=2)
            for m, kv in ((tiny_model, "auto"), (tiny_model, "fp8_e4m3"), (tiny_model, "int8"), (tiny_model, "int4"),
                          (int8, "auto"), (int8, "int8"))]
    path = tmp_path_factory.mktemp("ch06") / "sweep.json"
    sweep_engine.save_sweep(pd.DataFrame(rows), {"int8_over_fp32_median": 1.0}, path)
    return path


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


def test_fp8_saves_half_of_a_16_bit_cache_and_three_quarters_of_fp32():
    """Issue 30: the closing table said fp8 'saves 88% against 16-bit' (1 - (bytes/fp32)/2); it is 50%."""
    spec = model_spec("smollm2-135m")
    assert ch06.saving(11_520, 23_040) == 0.5
    frame = pd.DataFrame([{"kv_format": f, **ch06.kv_breakdown(spec, f)} for f in ("auto", "fp8_e4m3")])
    kv = ch06.KVFormats(frame.set_index("kv_format"), tokens=0, bytes_16bit=2 * 30 * 3 * 64 * 2)
    assert kv.saving_vs_16bit("fp8_e4m3") == pytest.approx(0.5)
    assert kv.saving_vs_fp32("fp8_e4m3") == pytest.approx(0.75)


def test_panels_do_not_measure_until_asked(tiny_model, tokenizer):
    lab = ch06.KVFormatLab(tiny_model, tokenizer, heldout_tokens=256)
    assert not lab.measured and lab.status.value == ""
    assert not ch06.WeightFormatLab(tiny_model, tokenizer).measured
    assert not ch06.ActivationLab(tiny_model, tokenizer).measured
    assert not ch06.FormatSweepLab().measured


def test_kv_panel_measures_every_format_and_rereads_capacity_at_the_budget(kv_lab):
    table = kv_lab.table()
    assert list(table.index) == list(KV_FORMATS)
    assert table.loc["auto", "kl_mean"] == pytest.approx(0.0, abs=1e-9) and table.loc["auto", "top1_agreement"] == 1
    assert (table.drop(index="auto").kl_mean > 0).all()
    by_size = table.sort_values("bytes_per_token", ascending=False).sequences_at_budget
    assert by_size.is_monotonic_increasing and by_size.iloc[-1] > by_size.iloc[0]  # fewer bytes, more sequences
    assert int(table.loc["int8", "blocks_at_budget"]) == 2**30 // (table.loc["int8", "bytes_per_token"] * 16)
    result = kv_lab.result
    kv_lab.budget.value = 4.0  # redraw only: nothing re-measured
    assert int(kv_lab.table().loc["int8", "blocks_at_budget"]) == 4 * 2**30 // (
        table.loc["int8", "bytes_per_token"] * 16)
    assert kv_lab.result is result and "4 GiB" in kv_lab.status.value
    kv_lab.kv_format.value = "int4"
    assert f"{int(table.loc['int4', 'bytes_per_token']):,} bytes per token" in kv_lab.status.value
    bytes_fig = kv_lab.figures_[0]
    assert list(trace(bytes_fig, "scales stored beside them").y) == list(table.scale_bytes)
    assert len(kv_lab.stored_outputs(png=False)) == 1 + 3 + 1


def test_weight_panel_keeps_fp32_as_the_baseline_and_measures_a_format_when_chosen(weight_lab):
    frame = weight_lab.frame
    assert list(frame.index) == ["fp32", "int8"]
    assert frame.loc["fp32", "speedup_vs_fp32"] == 1.0 and frame.loc["fp32", "top1_agreement"] == 1.0
    assert frame.loc["int8", "weight_bytes_allocated"] < frame.loc["fp32", "weight_bytes_allocated"]
    assert frame.loc["int8", "kl_mean"] > 0
    weight_lab.weights.value = "bf16"
    frame = weight_lab.frame
    assert list(frame.index) == ["fp32", "int8", "bf16"] and "bfloat16" in weight_lab.status.value
    assert frame.loc["bf16", "weight_bytes_allocated"] == pytest.approx(frame.loc["fp32", "weight_bytes_allocated"] / 2,
                                                                        rel=0.01)
    assert list(trace(weight_lab.speed_fig, "batch-1 decode").y) == list(frame.decode_tokens_per_s)


def test_weight_panel_measures_gguf_blocks_and_draws_llama_cpp_from_the_stored_run(tiny_model, tokenizer, tmp_path,
                                                                                  monkeypatch):
    from workbench import llamacpp
    from workbench.cache.sizing import weight_bytes

    stored = {"machine": "x86_64, Test CPU, 2 threads, AVX512", "threads": 2, "date": "2026-11-26",
              "decode": {"llama.cpp": 123.4, "q4_1": 130.0}, "prefill": {"llama.cpp": 300.0, "q4_1": 700.0},
              "decode_tokens": 64, "prompt_tokens": 512, "load_average": [0.1, 0.2]}
    (tmp_path / "vs.json").write_text(json.dumps(stored))
    monkeypatch.setattr(llamacpp, "RESULT_PATH", tmp_path / "vs.json")
    monkeypatch.setattr(llamacpp, "llama_bench_path", lambda: tmp_path / "not-built")  # no live run here
    lab = ch06.WeightFormatLab(tiny_model, tokenizer, weights="q4_1", heldout_tokens=64, decode_tokens=2,
                               repeats=1).run()
    frame = lab.frame
    assert list(frame.index) == ["fp32", "q4_1"]
    assert frame.loc["q4_1", "weight_bytes_allocated"] == weight_bytes(tiny_model.spec, torch.float32, "q4_1")
    assert frame.loc["q4_1", "kl_mean"] > 0  # random float weights quantized to 4 bits: not the same model
    assert list(trace(lab.speed_fig, "llama.cpp (same GGUF)").y) == [123.4, 123.4]
    assert "llama.cpp on the same GGUF file: 123.4 tokens/s" in lab.status.value
    assert "Test CPU" in lab.status.value and "compare with care" in lab.status.value
    monkeypatch.setattr(llamacpp, "RESULT_PATH", tmp_path / "none.json")
    assert ch06.WeightFormatLab(tiny_model, tokenizer, weights="q8_0", heldout_tokens=64, decode_tokens=2,
                                repeats=1).run().result.peer is None


def test_activation_panel_separates_weight_and_activation_rounding(tiny_model, tokenizer):
    lab = ch06.ActivationLab(tiny_model, tokenizer, layer=1, projection="down_proj", tokens=64).run()
    errors = lab.result.errors
    assert list(errors.index) == list(VARIANTS)
    assert errors.loc[VARIANTS[0], "input_error"] == 0.0  # weights only: inputs exact
    assert (errors.relative_error > 0).all() and (errors.iloc[1:].input_error > 0).all()
    assert lab.result.weights_only == errors.relative_error.iloc[0]
    lab.projection.value = "qkv_proj"
    assert "qkv_proj" in lab.status.value and lab.result.projection == "qkv_proj"
    with pytest.raises(ValueError, match="layer"):
        ch06.capture_inputs(tiny_model, [1, 2, 3], 2, "down_proj")
    with pytest.raises(ValueError, match="float model"):
        ch06.capture_inputs(ch06.weight_variant(tiny_model, "int8"), [1, 2, 3], 0, "down_proj")


def test_sweep_round_trips_through_its_file_and_says_what_a_quantized_cache_costs(sweep_path, tmp_path):
    with pytest.raises(FileNotFoundError, match="bench_weight_quant"):
        ch06.format_sweep(tmp_path / "absent.json")
    machine = json.loads(sweep_path.read_text())["meta"]["machine"]  # the int8/fp32 ratio depends on it: ISA, threads
    assert torch.backends.cpu.get_cpu_capability() in machine and re.search(r"\b\d+ threads\b", machine)
    lab = ch06.FormatSweepLab(path=sweep_path).run()
    assert "CACHED" in lab.figure.layout.title.subtitle.text
    table = lab.layered_table()
    assert len(table) == 6 and {"recall@256", "decode_tokens_per_s", "throughput_tokens_per_s"} <= set(table.columns)
    assert table.loc["int8 linears weights, auto KV", "weight_bytes"] < table.loc["fp32 weights, auto KV",
                                                                                  "weight_bytes"]
    cost = lab.result.kv_speed_cost("fp8_e4m3")
    assert cost["sequences"] > cost["sequences_fp32_kv"]
    assert f"{cost['throughput']:.1f} tokens/s" in lab.status.value
    assert ("dequantized" in lab.status.value) == (cost["throughput_ratio"] < 1)
    lab.metric.value = "top1_agreement"
    assert lab.figure.layout.yaxis.type == "linear"
    assert trace(lab.figure, "int8 linears").y is not None


@pytest.fixture(scope="module")
def memory_run(tiny_model):
    return ch06.memory_limited_run(tiny_model, None, requests=24, prompt_tokens=40, output_tokens=8)


def _memory(peaks: tuple[int, int], speeds: tuple[float, float]) -> MemoryLimitedRun:
    frame = pd.DataFrame({"kv_format": ["auto", "int8"], "num_blocks": [16, 60], "fit": [4, 15],
                          "peak_batch": list(peaks), "mean_decode_batch": list(peaks), "preemptions": [0, 0],
                          "output_tok_s": list(speeds)})
    return MemoryLimitedRun(frame, 1 << 22, 64, 24)


def test_the_memory_limited_run_is_bounded_by_the_pool_not_a_cap(memory_run):
    """The run that tests "a smaller cache, a larger batch": every format's batch below max_num_seqs and the
    requests offered, so the KV pool, not the configuration, sets it; the quantized cache fits more."""
    for kv_format in memory_run.frame["kv_format"]:
        assert not memory_run.limit(kv_format).set_by_cap, memory_run.sentence()
    assert memory_run.row("int8")["fit"] > memory_run.row("auto")["fit"]
    assert memory_run.row("int8")["peak_batch"] > memory_run.row("auto")["peak_batch"]
    assert "the KV pool sets it" in memory_run.sentence()


def test_closing_table_verdicts_are_computed_from_the_results(kv_lab, weight_lab, sweep_path):
    kv, weights, sweep = kv_lab.result, weight_lab.result, ch06.format_sweep(sweep_path)
    table = ch06.closing_table(kv, weights, sweep, _memory((4, 15), (20.0, 30.0)), budget_gib=1.0)
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert all(isinstance(v, Verdict) for v in table.verdicts)
    assert table.verdicts[0] in (Verdict.HOLDS, Verdict.CAVEAT) and table.verdicts[4] is Verdict.NOT_MEASURABLE
    assert table.verdicts[3] is Verdict.NOT_MEASURABLE and "items" in table.rows[3].evidence_text
    assert "saves 50% against a 16-bit cache" in table.rows[2].measured
    assert "per token and head" in table.rows[2].measured and "static scales" in table.rows[2].measured
    cost = sweep.kv_speed_cost("fp8_e4m3")
    assert f"{cost['throughput']:.1f} tokens/s" in table.rows[0].measured
    assert (table.verdicts[0] is Verdict.CAVEAT) == (cost["throughput_ratio"] < 1)
    # A result that contradicts the claims: an "int8" cache as large as fp32 fits no more sequences, and an fp8
    # cache of 16-bit size saves nothing against 16 bits.
    frame = kv.frame.copy()
    frame.loc["int8", "bytes_per_token"] = frame.loc["auto", "bytes_per_token"]
    frame.loc["fp8_e4m3", "bytes_per_token"] = kv.bytes_16bit
    contradicted = ch06.closing_table(replace(kv, frame=frame), weights, sweep, _memory((4, 4), (20.0, 15.0)))
    assert contradicted.verdicts[0] is Verdict.WRONG and contradicted.verdicts[2] is Verdict.WRONG
    noise = ch06.closing_table(kv, weights, sweep, _memory((4, 15), (20.0, 20.5)))
    assert noise.verdicts[0] is Verdict.NOT_MEASURABLE and "within its noise" in noise.rows[0].note


def test_seed_checks_and_exercises_compute_their_answers(kv_lab):
    checks = ch06.seed_checks(kv_lab.result)
    assert "1.675" in checks.iloc[3]["computed / measured here"]
    assert "1.6%" in checks.iloc[0]["computed / measured here"]  # 2 bytes of scale per 128 one-byte values
    assert "per token and head" in checks.iloc[1]["computed / measured here"]
    assert checks.iloc[1]["verdict"] == ch06.fp8_quality_reading(kv_lab.result)  # one reading, in both places
    ex = ch06.exercises()
    assert ex["int8_kv_bytes"].check(11_880).correct and not ex["int8_kv_bytes"].check(11_520).correct
    assert ex["bandwidth_ratio"].check(1.675).correct and not ex["bandwidth_ratio"].check(2.0).correct
    hierarchy = ch06.seed_hierarchy().set_index(["weights", "kv"])
    assert ex["int4_fp8_sequences"].check(int(hierarchy.loc[("int4", "fp8_e4m3"), "sequences_80GiB_90pct"])).correct
    assert ex["int4_fp8_sequences"].check(None).correct is None
