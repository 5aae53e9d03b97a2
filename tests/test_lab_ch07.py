"""Chapter 7's lab without a browser: its counts against the engine's own records, the pass-by-pass trace, the
panels' controls, the sampling check, the exercises and the closing table.

The real model is needed where acceptance matters (the trained draft reads its layers); runs are kept to a
couple of prompts and a dozen tokens. Timings are never asserted beyond being positive: the CPU is shared.
"""

from __future__ import annotations

import math

import pytest
import torch

import workbench
from workbench.lab import ch07_speculative as ch07
from workbench.lab.ch07_trace import trace_html, trace_request
from workbench.spec.experiments.compare import compare
from workbench.spec.experiments.forward_cost import _retime_stalls, forward_curve
from workbench.spec.experiments.methods import task_prompts
from workbench.spec.experiments.sampling_check import chi_square
from workbench.spec.stats import SpecCounters


@pytest.fixture(scope="module")
def draft(real_model):
    return ch07.load_draft(real_model)


@pytest.fixture(scope="module")
def comparison(real_model, tokenizer, draft):
    return compare(real_model, tokenizer, task_prompts("grounded", 2), [("prompt lookup", 3), ("trained draft", 3)],
                   max_tokens=14, draft=draft)


def test_counts_agree_with_the_engine(comparison):
    assert [r.label for r in comparison.runs] == ["plain", "prompt lookup", "trained draft"]
    for run in comparison.runs[1:]:
        counters, requests, steps = run.counters, run.requests, run.steps
        # Per-request rows sum to the engine's counters, which agree with its step records (a separate path).
        assert requests["drafted"].sum() == counters.drafted == steps["num_drafted_tokens"].sum() > 0
        assert requests["accepted"].sum() == counters.accepted == steps["num_accepted_tokens"].sum()
        assert requests["tested"].sum() == sum(counters.tested_at)
        assert counters.accepted <= sum(counters.tested_at) <= counters.drafted
        assert counters.emitted == counters.passes + counters.accepted  # each pass adds the target's own token
        positions = comparison.positions(run.label)
        assert list(positions["position"]) == [1, 2, 3]
        assert (positions["accepted"] <= positions["tested"]).all()
        assert (positions["tested"] <= positions["drafted"]).all()
        assert positions["acceptance_rate_theory"].tolist() == pytest.approx(
            [counters.alpha ** i for i in (1, 2, 3)])
        assert run.draft_positions > 0 and run.draft_seconds > 0 and run.decode_seconds > 0
    summary = comparison.summary()
    assert summary.loc["plain", "speedup"] == 1.0
    assert summary.loc["prompt lookup", "same_as_plain"] and summary.loc["trained draft", "same_as_plain"]
    assert (summary.loc[["prompt lookup", "trained draft"], "verify_cost_r"] > 0).all()
    assert summary["output_tokens"].tolist() == [28, 28, 28]
    assert len(comparison.requests()) == 6


def test_bad_inputs(real_model, tokenizer):
    with pytest.raises(ValueError, match="task"):
        task_prompts("poetry", 2)
    with pytest.raises(ValueError, match="K in"):
        compare(real_model, tokenizer, ["hi"], [("prompt lookup", 0)])
    with pytest.raises(ValueError, match="proposer"):
        compare(real_model, tokenizer, ["hi"], [("medusa", 2)])


def test_trace_replays_the_output_pass_by_pass(real_model, tokenizer, draft):
    prompt = task_prompts("grounded", 1)[0]
    trace = trace_request(real_model, tokenizer, prompt, "ngram", 4, max_tokens=20)
    assert [t for p in trace.passes for t in p.emitted] == trace.output_ids
    assert trace.same_as_plain
    assert trace.passes[0].drafts == []  # the prefill's token
    for p in trace.passes:
        assert p.emitted[:p.accepted] == p.drafts[:p.accepted]  # accepted drafts are emitted as drafted
        assert len(p.emitted) == (p.accepted + 1 if p.drafts else 1) or p is trace.passes[-1]
    frame = trace.frame()
    assert frame["accepted"].sum() > 0 and len(frame) == sum(1 for p in trace.passes if p.drafts)
    markup = trace_html(trace, tokenizer)
    assert markup.count("<span style=\"background") >= len(trace.output_ids) + frame["rejected"].sum()
    assert "draft rejected" in markup and "line-through" in markup


def test_forward_curve_on_a_small_model():
    small = workbench.random_model("smollm2-135m", num_layers=2, device="cpu")
    curve = forward_curve(small, (1, 2, 5, 20), repeats=1)
    assert curve.ratio(1) == 1.0 and curve.ms(5) > 0 and curve.bandwidth > 0 and curve.flops_rate > 0
    assert curve.verify_cost(4)(4) == pytest.approx(curve.ratio(20, 4))
    assert curve.roofline_ms(1) == pytest.approx(curve.ms(1))  # the bandwidth ceiling is fitted there
    # A stalled timing (slower than a forward over more positions) is timed again; a plausible one is kept.
    rows = [{"positions": 2, "ms": 1e6}, {"positions": 20, "ms": curve.ms(20)}]
    _retime_stalls(small, rows, 1)
    assert rows[0]["ms"] < 1e6 and rows[1]["ms"] == curve.ms(20)


@pytest.fixture(scope="module")
def forward_lab(real_model):
    return ch07.ForwardCostLab(real_model, k=3, positions=(1, 2, 4, 5, 8, 16, 32, 64))


@pytest.fixture(scope="module")
def acceptance(real_model, tokenizer, draft):
    lab = ch07.AcceptanceLab(real_model, tokenizer, draft, k=3, num_prompts=1, max_tokens=12)
    lab.task.value = "open chat"  # the chapter's second run: every test below sees both tasks
    return lab


@pytest.fixture(scope="module")
def sampling():
    return ch07.SamplingLab(samples=1000)


def test_forward_cost_lab_redraws_without_remeasuring(forward_lab):
    curve = forward_lab.curve
    forward_lab.batch.value = 1
    assert list(forward_lab.figure.data[2].x) == [1, 4]
    forward_lab.batch.value = 16  # redraw only: B = 16 plain, 16 x (K + 1) = 64 verifying
    assert forward_lab.curve is curve and list(forward_lab.figure.data[2].x) == [16, 64]
    assert "r = " in forward_lab.status.value


def test_acceptance_lab_controls(acceptance):
    assert list(acceptance.positions_figure.data[0].x) == [1, 2, 3]
    comparison = acceptance.comparison
    acceptance.shown.value = "trained draft"  # redraw only
    assert acceptance.comparison is comparison and "trained draft" in acceptance.positions_figure.layout.title.text
    assert len(acceptance.history) == 2 and set(acceptance.history_frame()["task"]) == {"grounded", "open chat"}
    caption, table = acceptance.stored_tables()[0]
    assert list(table.index) == ["plain", "prompt lookup", "trained draft"] and "c, r" in caption
    assert "open chat" in acceptance.status.value and "tokens/s" in acceptance.status.value

    exercise = ch07.measured_alpha_exercise(acceptance)
    row = acceptance.summary().loc["trained draft"]
    assert exercise.check(row["accepted"] / row["tested"]).correct
    assert exercise.check(row["accepted_per_drafted"] + 0.2).correct is False


def test_chi_square():
    counts = torch.tensor([50.0, 30.0, 20.0])
    stat, _, p = chi_square(counts, counts / 100)
    assert stat == pytest.approx(0, abs=1e-9) and p == pytest.approx(1.0)
    # 1 degree of freedom: a statistic of 4 has p = 0.0455 (3.841 would be the 5% point).
    stat, df, p = chi_square(torch.tensor([60.0, 40.0]), torch.tensor([0.5, 0.5]))
    assert (stat, df) == (4.0, 1) and p == pytest.approx(0.0455, abs=1e-4)


def test_sampling_lab(sampling):
    result = sampling.result
    assert result.passed and result.drafted > 0 and result.counts.sum() == 1000
    assert len(sampling.figure.data[0].x) == 36 and "p = " in sampling.status.value


def test_takeaways_table(real_model, tokenizer, draft, forward_lab, acceptance, sampling):
    batch = ch07.BatchLab(real_model, tokenizer, draft, forward_lab.curve, k=3, batches=(1, 2), max_tokens=6)
    frame = batch.frame()
    assert set(frame["batch"]) == {1, 2} and frame["same_as_plain"].dropna().all()
    table = ch07.takeaways(forward_lab, acceptance, batch, sampling)
    assert len(table) == 5 and list(table.columns) == ["seed takeaway", "measured here", "verdict"]
    assert table["verdict"].iloc[1].startswith("holds with a caveat") and "70%" in table["verdict"].iloc[1]
    assert table["verdict"].iloc[3] == "not tested here"


def test_exercises_right_wrong_and_unanswered():
    tokens = ch07.EXERCISES["tokens_per_pass"]
    assert tokens.check((1 - 0.8 ** 6) / 0.2).correct
    assert tokens.check(4.0).correct is False
    assert tokens.check(...).correct is None
    assert ch07.EXERCISES["best_k"].check(3).correct and not ch07.EXERCISES["best_k"].check(4).correct
    assert ch07.EXERCISES["break_even"].check(0.167).correct


def test_seed_arithmetic_and_vllm_counters():
    table = ch07.seed_arithmetic().set_index("claim")
    assert table.loc["tokens per target pass, α = 0.9, K = 4", "computed here"] == "4.10"
    assert table.loc["speedup of its own timeline (150 ms target, 20 ms of drafting)", "computed here"] == "3.61x"
    counters = SpecCounters()
    counters.record(4, 2, 3)
    counters.record(4, 4, 5)
    values = ch07.vllm_counters(counters)
    assert values["vllm:spec_decode_num_drafts_total"] == 2 and values["vllm:spec_decode_num_draft_tokens_total"] == 8
    assert values['vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"}'] == 1
    assert values["mean acceptance length = 1 + accepted ÷ drafts"] == 4.0
    assert values["α = accepted ÷ tested (not a vLLM counter)"] == pytest.approx(6 / 7)
    assert not math.isnan(values["acceptance rate = accepted ÷ draft tokens"])
