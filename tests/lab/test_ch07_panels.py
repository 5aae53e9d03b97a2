"""Chapter 7's panels: each is built, ``.run()`` once (construction measures nothing), and its named traces, status
line and result object are read. Panels that only need prompt lookup run on the tiny model; the acceptance and
batch panels need the real model, because the trained draft reads its layers."""

from __future__ import annotations

import pytest

import workbench
from workbench.lab import ch07
from workbench.lab.ch07.trees import TreeComparison
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace


@pytest.fixture(scope="module")
def draft(real_model):
    return ch07.load_draft(real_model)


@pytest.fixture(scope="module")
def forward_lab(tiny_model):
    return ch07.ForwardCostLab(tiny_model, k=3, positions=(1, 2, 4, 5, 8, 16, 32, 64)).run()


def test_construction_measures_nothing(tiny_model, tokenizer):
    lab = ch07.TokenTraceLab(tiny_model, tokenizer, None, k=2, max_tokens=6)
    assert not lab.measured and ch07.SamplingLab(samples=1000).measured is False
    assert not ch07.TreeLab(tiny_model, tokenizer, None).measured


def test_forward_cost_lab_redraws_without_remeasuring(forward_lab):
    curve = forward_lab.curve
    forward_lab.batch.value = 1
    marks = "plain step (B positions) → verifying step (B·(K+1))"
    assert list(trace(forward_lab.figure, marks).x) == [1, 4]
    forward_lab.batch.value = 16  # redraw only: B = 16 plain, 16 x (K + 1) = 64 verifying
    assert forward_lab.curve is curve and list(trace(forward_lab.figure, marks).x) == [16, 64]
    assert "r = " in forward_lab.status.value


def test_token_trace_and_k_sweep_on_the_tiny_model(tiny_model, tokenizer, forward_lab):
    lab = ch07.TokenTraceLab(tiny_model, tokenizer, None, proposer="prompt lookup", k=2, max_tokens=8).run()
    assert lab.result.same_as_plain and "target passes" in lab.status.value
    assert len(trace(lab.figure, "accepted").x) == len(lab.result.frame())
    sweep = ch07.KSweepLab(tiny_model, tokenizer, None, forward_lab.curve, ks=(1, 2), max_tokens=6).run()
    assert list(trace(sweep.figure, "measured").x) == [1, 2] and len(trace(sweep.figure, "model's best K").x) == 1


def test_tree_lab_on_the_tiny_model(tiny_model, tokenizer):
    poor_draft = workbench.random_model(tiny_model.spec.replace(num_layers=1), device="cpu", seed=9)
    lab = ch07.TreeLab(tiny_model, tokenizer, poor_draft, num_prompts=1, max_tokens=6).run()
    result = lab.result
    assert isinstance(result, TreeComparison) and result.chain == "chain K=4" and len(result.trees) == 2
    assert (result.frame["positions"].drop("plain") == 5).all()
    assert list(trace(lab.figure, "tokens per pass, measured").x) == [result.chain, *result.trees]
    assert "tokens per pass" in lab.status.value


def test_sampling_lab():
    lab = ch07.SamplingLab(samples=1000).run()
    assert lab.result.passed and lab.result.drafted > 0 and lab.result.counts.sum() == 1000
    assert len(trace(lab.figure, "speculative samples (share)").x) == 36 and "p = " in lab.status.value


@pytest.mark.slow
def test_acceptance_and_batch_panels_and_the_closing_table(real_model, tokenizer, draft, forward_lab):
    acceptance = ch07.AcceptanceLab(real_model, tokenizer, draft, k=3, num_prompts=1, max_tokens=10).run()
    grounded = acceptance.result
    acceptance.task.value = "open chat"  # re-measures, as clicking the control does
    chat = acceptance.result
    assert (grounded.task, chat.task) == ("grounded", "open chat") and acceptance.latest("grounded") is grounded
    assert list(trace(acceptance.positions_figure, "α at position i: accepted ÷ tested").x) == [1, 2, 3]
    acceptance.shown.value = "trained draft"  # redraw only
    assert acceptance.result is chat and "trained draft" in acceptance.positions_figure.layout.title.text
    caption, table = acceptance.stored_tables()[0]
    assert list(table.index) == ["plain", "prompt lookup", "trained draft"] and "c, r" in caption
    assert ch07.measured_alpha_exercise(chat).check(chat.row("trained draft")["accepted"]
                                                    / chat.row("trained draft")["tested"]).correct

    batch = ch07.BatchLab(real_model, tokenizer, draft, forward_lab.curve, k=3, batches=(1, 2), max_tokens=5).run()
    assert set(batch.result.frame["batch"]) == {1, 2} and batch.result.frame["same_as_plain"].dropna().all()
    assert "1 open chat prompt(s) × 5 tokens" in ch07.same_draft_two_runs(chat, batch.result)

    sampling = ch07.SamplingLab(samples=1000).run()
    trees = ch07.TreeLab(real_model, tokenizer, draft, num_prompts=1, max_tokens=5).run()
    closing = ch07.closing_table(forward_lab.curve, grounded, chat, batch.result, sampling.result, trees.result)
    assert isinstance(closing, ClosingTable) and len(closing) == 5
    assert all(isinstance(v, Verdict) for v in closing.verdicts)
