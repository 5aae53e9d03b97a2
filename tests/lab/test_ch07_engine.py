"""Chapter 7's measurements against the engine's own records: the counts of a comparison, the pass-by-pass trace,
the forward-cost curve and the chi-square statistic behind the sampling check.

The real model is needed where acceptance matters (the trained draft reads its layers); runs are kept to a
couple of prompts and a dozen tokens. Timings are never asserted beyond being positive: the CPU is shared.
"""

from __future__ import annotations

import pytest
import torch

from workbench.lab.ch07.runs import load_draft
from workbench.lab.ch07.trace import trace_html, trace_request
from workbench.spec_experiments.compare import compare
from workbench.spec_experiments.forward_cost import _retime_stalls, forward_curve
from workbench.spec_experiments.methods import task_prompts
from workbench.spec_experiments.sampling_check import chi_square


@pytest.fixture(scope="module")
def draft(real_model):
    return load_draft(real_model)


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


def test_bad_inputs(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="task"):
        task_prompts("poetry", 2)
    with pytest.raises(ValueError, match="K in"):
        compare(tiny_model, tokenizer, ["hi"], [("prompt lookup", 0)])
    with pytest.raises(ValueError, match="proposer"):
        compare(tiny_model, tokenizer, ["hi"], [("medusa", 2)])


def test_trace_replays_the_output_pass_by_pass(real_model, tokenizer):
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


def test_forward_curve_on_a_small_model(tiny_model):
    curve = forward_curve(tiny_model, (1, 2, 5, 20), repeats=1)
    assert curve.ratio(1) == 1.0 and curve.ms(5) > 0 and curve.bandwidth > 0 and curve.flops_rate > 0
    assert curve.verify_cost(4)(4) == pytest.approx(curve.ratio(20, 4))
    assert curve.roofline_ms(1) == pytest.approx(curve.ms(1))  # the bandwidth ceiling is fitted there
    # A stalled timing (slower than a forward over more positions) is timed again; a plausible one is kept.
    rows = [{"positions": 2, "ms": 1e6}, {"positions": 20, "ms": curve.ms(20)}]
    _retime_stalls(tiny_model, rows, 1)
    assert rows[0]["ms"] < 1e6 and rows[1]["ms"] == curve.ms(20)


def test_chi_square():
    counts = torch.tensor([50.0, 30.0, 20.0])
    stat, _, p = chi_square(counts, counts / 100)
    assert stat == pytest.approx(0, abs=1e-9) and p == pytest.approx(1.0)
    # 1 degree of freedom: a statistic of 4 has p = 0.0455 (3.841 would be the 5% point).
    stat, df, p = chi_square(torch.tensor([60.0, 40.0]), torch.tensor([0.5, 0.5]))
    assert (stat, df) == (4.0, 1) and p == pytest.approx(0.0455, abs=1e-4)
