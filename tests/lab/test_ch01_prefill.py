"""Chapter 1's prefill measurements (the memory of materialised scores, time to first token and the chapter's
baseline), its exercises and its computed closing table."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from closing_helpers import rows_that_never_turn

import workbench
from workbench.lab import ch01
from workbench.lab.ch01.memory import (
    AttentionMemory,
    TensorPeak,
    layer_activation_peak,
    materialized_attention,
    score_matrix_bytes,
)
from workbench.lab.ch01.panels_prefill import DECODE, FLOPS, MEMORY_TRACES, TTFT
from workbench.lab.ch01.runs import ContextTTFT, LayerTiming, ttft_sweep
from workbench.lab.kit.closing import Verdict
from workbench.lab.kit.figures import trace
from workbench.models.attention import causal_attention
from workbench.workloads import prompt_of_length


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
    memory = lab.result  # measured on first access
    assert list(memory.frame.index) == [256, 512, 1024]
    assert memory.ratio > 2
    assert memory.slope("materialized_bytes") > 1.5 and memory.slope("fused_bytes") == pytest.approx(1.0, abs=0.01)
    scores = trace(lab.figure, MEMORY_TRACES["score_matrix_bytes"])
    assert list(scores.y) == pytest.approx([9 * n * n * 4 / 2**20 for n in (256, 512, 1024)])
    lab.longest.value = 2048
    assert list(trace(lab.figure, MEMORY_TRACES["materialized_bytes"]).x) == [256, 512, 1024, 2048]
    assert lab.result.tokens == 2048


def test_context_ttft_lab_times_prefill_and_gives_the_baseline(tiny_model, tokenizer):
    lab = ch01.ContextTTFTLab(tiny_model, tokenizer, longest=1024, repeats=1)
    with lab.changes():
        lab.longest.value = 256
    sweep = lab.result
    assert list(sweep.frame.index) == [64, 128, 256] and (sweep.frame > 0).all().all()
    flops_line = list(trace(lab.figure, FLOPS).y)
    assert flops_line[-1] == pytest.approx(sweep.ttft_long_ms)  # scaled to the longest point
    assert flops_line == sorted(flops_line)
    assert list(trace(lab.figure, TTFT).y) == list(sweep.frame["ttft_ms"])
    assert list(trace(lab.figure, DECODE).x) == [64, 128, 256]
    baseline = sweep.baseline()
    assert baseline.chapter == "ch01" and baseline.dtype == "float32" and baseline.prefill_tokens == 256
    assert baseline.prefill_ms_per_token == pytest.approx(sweep.ttft_long_ms / 256)
    assert baseline.decode_step_ms == pytest.approx(sweep.frame["decode_step_ms"].median())
    with pytest.raises(ValueError, match="context"):
        ttft_sweep(tiny_model, tokenizer, [64, tiny_model.spec.max_context])


def test_prompt_of_length_is_exact(tokenizer):
    assert len(prompt_of_length(tokenizer, 333)) == 333
    with pytest.raises(ValueError, match="num_tokens"):
        prompt_of_length(tokenizer, 0)


# ----------------------------------------------------------------------------------- exercises and closing table
@pytest.mark.parametrize("key", sorted(ch01.exercises()))
def test_exercises_say_right_wrong_and_to_do(key):
    exercise = ch01.exercises()[key]
    expected = exercise.expected()
    assert exercise.check(expected).correct is True
    assert exercise.check(expected * 3 + 1).correct is False
    assert exercise.check(...).correct is None and "Not answered" in exercise.check(...).message


def test_exercise_answers_are_the_course_formulas():
    exercises = ch01.exercises()
    assert exercises["full_context_kv"].expected() == 2 * 80 * 8 * 128 * 8192 * 2
    assert exercises["kv_per_token"].expected() == 2 * 28 * 4 * 128 * 2
    assert exercises["window_tokens"].expected() == 4096
    assert exercises["score_bytes"].expected() == 9 * 8192 * 8192 * 4


SPEC = workbench.model_spec("smollm2-135m")
N = [512, 1024, 2048, 4096]


def _frame(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(values, index=pd.Index(N, name="tokens"))


def _results(attention_s, share, ttft_ms, decode_ms=(20, 20, 21, 20)):
    parts = {"attention s": attention_s, "qkv + output projections s": N, "MLP s": N, "attention share": share}
    layer = LayerTiming(_frame(parts), SPEC, None, 0)
    ttft = ContextTTFT(_frame({"ttft_ms": ttft_ms, "decode_step_ms": list(decode_ms)}), SPEC, "cpu", "float32", 2)
    memory = AttentionMemory(_frame({"materialized_bytes": [4.0, 16, 64, 256], "fused_bytes": [1.0, 2, 4, 8],
                                     "score_matrix_bytes": [3.0, 12, 48, 192], "layer_kv_bytes": [1.0, 2, 4, 8]}),
                             "test")
    return layer, ttft, memory


def test_closing_table_computes_every_verdict_from_the_results():
    table = ch01.closing_table(*_results([x * x for x in N], [0.2, 0.3, 0.5, 0.6], [50, 100, 200, 400]))
    assert len(table) == 5 and all(isinstance(v, Verdict) for v in table.verdicts)
    # Row 1's caveat: not every config reaches its FLOP crossover inside its context (computed from the configs).
    assert table.verdicts == [Verdict.CAVEAT, Verdict.CAVEAT, Verdict.CAVEAT, Verdict.CAVEAT, Verdict.HOLDS]
    assert all(row.evidence and "effect" in row.evidence_text for row in table.rows)
    assert "configs whose FLOP crossover lies inside their context" in table.rows[0].evidence_text
    assert "32x less" in table.rows[2].measured and "4x less" in table.rows[2].measured
    assert "…" not in repr(table) and "…" not in table._repr_html_()  # stored whole


def test_closing_table_verdicts_follow_the_measurements():
    linear_parts_win = _results([x * x for x in N], [0.1, 0.15, 0.2, 0.3], [50, 100, 200, 400])
    assert ch01.closing_table(*linear_parts_win).verdicts[0] is Verdict.CAVEAT
    flat_attention = _results(list(N), [0.1, 0.1, 0.1, 0.1], [50, 100, 200, 400])
    assert ch01.closing_table(*flat_attention).verdicts[0] is Verdict.WRONG
    quadratic_ttft = _results([x * x for x in N], [0.2, 0.3, 0.5, 0.6], [10, 40, 160, 640])
    assert ch01.closing_table(*quadratic_ttft).verdicts[3] is Verdict.HOLDS  # slope 2: no caveat left
    flat_ttft = _results([x * x for x in N], [0.2, 0.3, 0.5, 0.6], [30, 30, 31, 50])  # < 2x, within 3 steps
    assert ch01.closing_table(*flat_ttft).verdicts[3] is Verdict.WRONG
    noisy_ttft = _results([x * x for x in N], [0.2, 0.3, 0.5, 0.6], [30, 30, 31, 60])  # 2x: inside the margin
    assert ch01.closing_table(*noisy_ttft).verdicts[3] is Verdict.NOT_MEASURABLE


def test_every_measured_row_can_turn():
    """Rows 2 and 3 are arithmetic on the configs (they turn only with other configs); the measured rows turn
    with the measurements."""
    agree = _results([x * x for x in N], [0.2, 0.3, 0.5, 0.6], [50, 100, 200, 400])
    against = _results(list(N), [0.1, 0.1, 0.1, 0.1], [30, 30, 31, 28])
    assert rows_that_never_turn(ch01.closing_table(*agree), ch01.closing_table(*against)) == [2, 3]
