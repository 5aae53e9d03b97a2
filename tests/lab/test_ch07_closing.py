"""Chapter 7's ending without a model: the exercises, the seed's arithmetic, vLLM's counters, and the closing table
built from hand-made results, so that each verdict is seen to follow the numbers (a result that contradicts a claim
is judged WRONG)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import workbench
from workbench.lab import ch07
from workbench.lab.ch07.runs import AcceptanceRun, BatchRun, same_draft_two_runs
from workbench.lab.ch07.trees import TreeComparison
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.spec.stats import SpecCounters
from workbench.spec_experiments.sampling_check import SamplingCheck

COLUMNS = ["speedup", "alpha", "accepted_per_drafted", "tokens_per_pass", "draft_cost_c", "verify_cost_r",
           "drafted", "tested", "accepted"]


def acceptance(task: str, lookup: tuple[float, float], head: tuple[float, float]) -> AcceptanceRun:
    """A run whose (speedup, α) per proposer are given; the rest is plausible."""
    rows = {"plain": [1.0] + [math.nan] * 8,
            "prompt lookup": [lookup[0], lookup[1], lookup[1] * 0.6, 1 + 2 * lookup[1], 0.001, 1.2, 40, 30,
                              round(30 * lookup[1])],
            "trained draft": [head[0], head[1], head[1] * 0.6, 1 + 2 * head[1], 0.15, 1.3, 40, 30, round(30 * head[1])]}
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=COLUMNS)
    return AcceptanceRun(task, 4, 0.0, 2, 40, SimpleNamespace(summary=lambda: frame))


def batch(lookup: list[float], head: list[float]) -> BatchRun:
    rows = [{"batch": b, "method": m, "speedup": s, "alpha": 0.4, "tokens_per_pass": 1.8, "draft_cost_c": 0.1,
             "verify_cost_r": 1.2} for m, speeds in (("prompt lookup", lookup), ("trained draft", head))
            for b, s in zip((1, 4, 16), speeds, strict=True)]
    return BatchRun("open chat", 4, 16, (1, 4, 16), pd.DataFrame(rows))


def trees(chain: float, static: float, dynamic: float, speedups=(0.9, 1.0, 0.8), prompts: int = 2) -> TreeComparison:
    labels = ["plain", "chain K=4", "static (2, 1)", "dynamic 4 nodes, top-3, depth 3"]
    yields = [1.0, chain, static, dynamic]
    frame = pd.DataFrame({"tokens_per_pass": yields, "passes": [0] + [round(prompts * 16 / y) for y in yields[1:]],
                          "expected_tokens": yields, "r": [math.nan, 1.2, 1.3, 1.4],
                          "speedup": [1.0, *speedups]}, index=labels)
    return TreeComparison(4, prompts, 16, frame, "static (2, 1)")


def sampling(p: float = 0.5) -> SamplingCheck:
    counts = torch.ones(4)
    return SamplingCheck("draft model", 1.0, 4, counts, counts / 4, counts / 4, 8, 4, 1.0, 3, p, 1e-9)


CURVE = SimpleNamespace(ratio=lambda n, b=1: 1.1)


def test_closing_table_follows_the_results():
    grounded = acceptance("grounded", (1.9, 0.73), (0.8, 0.33))
    chat = acceptance("open chat", (0.9, 0.25), (0.9, 0.42))
    table = ch07.closing_table(CURVE, grounded, chat, batch([1.0, 0.9, 0.7], [1.1, 0.7, 0.5]), sampling(),
                               trees(1.8, 1.9, 1.95))
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert table.verdicts[0] is Verdict.HOLDS  # 2.46 tokens per pass against r = 1.1
    assert table.verdicts[2] is Verdict.HOLDS  # both fall, monotonically
    # 1.08x the chain's tokens per pass from 2 prompts × 16 tokens: a pass or two, inside the counts' noise.
    assert table.verdicts[3] is Verdict.NOT_MEASURABLE and "within its noise" in table.rows[3].note
    assert "H100" in table.rows[3].measured
    many = ch07.closing_table(CURVE, grounded, chat, batch([1.0, 0.9, 0.7], [1.1, 0.7, 0.5]), sampling(),
                              trees(1.8, 1.9, 2.4, prompts=40))
    assert many.verdicts[3] is Verdict.CAVEAT  # more tokens per pass beyond the noise, but not faster
    assert "1.33x the chain's" in many.rows[3].note
    assert "26 CPU minutes" not in repr(table) and "section 10" in table.rows[4].note
    assert all(isinstance(v, Verdict) for v in table.verdicts)


def test_a_contradicting_result_is_judged_wrong():
    grounded = acceptance("grounded", (0.8, 0.73), (0.8, 0.33))  # lookup: higher α on grounded, lower speedup
    chat = acceptance("open chat", (0.9, 0.25), (0.9, 0.42))
    table = ch07.closing_table(CURVE, grounded, chat, batch([1.0, 1.1, 1.2], [0.9, 1.0, 1.2]), sampling(0.0),
                               trees(1.9, 1.8, 1.85))
    assert table.verdicts[1:3] == [Verdict.WRONG] * 2 and table.verdicts[4] is Verdict.WRONG
    assert table.verdicts[3] is Verdict.NOT_MEASURABLE  # 1.9 vs 1.8 per pass over 2 prompts: noise either way
    fewer = ch07.closing_table(CURVE, grounded, chat, batch([1.0, 1.1, 1.2], [0.9, 1.0, 1.2]), sampling(0.0),
                               trees(2.4, 1.8, 1.85, prompts=40))
    assert fewer.verdicts[3] is Verdict.WRONG
    assert all(row.note for row in table.rows[1:])
    with pytest.raises(ValueError, match="grounded run"):
        ch07.closing_table(CURVE, chat, grounded, batch([1, 1, 1], [1, 1, 1]), sampling(), trees(1, 1, 1))


def test_tree_comparison_and_the_two_runs_sentence():
    result = trees(1.8, 1.9, 1.95)
    assert result.chain == "chain K=4" and result.best_tree.startswith("dynamic")
    assert result.trees_raise_yield and not result.faster_too and result.gain() == pytest.approx(1.95 / 1.8)
    assert "5 positions per pass" in result.sentence()
    chat = acceptance("open chat", (0.9, 0.25), (0.86, 0.42))
    sentence = same_draft_two_runs(chat, batch([1.0, 0.9, 0.7], [1.1, 0.7, 0.5]))
    assert "2 open chat prompt(s) × 40 tokens" in sentence and "1 open chat prompt(s) × 16 tokens" in sentence
    assert "0.86x" in sentence and "1.10x" in sentence


def test_exercises_right_wrong_and_unanswered():
    exercises = ch07.exercises()
    tokens = exercises["tokens_per_pass"]
    assert tokens.check((1 - 0.8 ** 6) / 0.2).correct
    assert tokens.check(4.0).correct is False
    assert tokens.check(...).correct is None
    assert exercises["best_k"].check(3).correct and not exercises["best_k"].check(4).correct
    assert exercises["break_even"].check(0.167).correct
    measured = ch07.measured_alpha_exercise(acceptance("open chat", (0.9, 0.25), (0.9, 0.42)))
    assert measured.check(13 / 30).correct and measured.check(13 / 40).correct is False  # 13 = round(30 × 0.42)


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


def test_the_batch_panel_gives_the_registry_its_batch_1_and_16_steps():
    run = batch([1.0, 0.9, 0.7], [1.1, 0.7, 0.5])
    plain = pd.DataFrame([{"batch": b, "method": "plain", "speedup": 1.0, "decode_tokens_per_s": tps}
                          for b, tps in ((1, 25.0), (4, 90.0), (16, 320.0))])
    run = BatchRun(run.task, run.k, run.max_tokens, run.batches, pd.concat([run.frame, plain], ignore_index=True))
    base = run.baseline(workbench.random_model("smollm2-135m", num_layers=1, device="cpu"))
    assert base.decode_step_ms == pytest.approx(40.0) and base.decode_step_b16_ms == pytest.approx(50.0)
