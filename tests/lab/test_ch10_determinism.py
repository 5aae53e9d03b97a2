"""Chapter 10's lab: its measurements, panels (run on the tiny model, shrunk), exercises and closing table."""

from __future__ import annotations

import pytest

from workbench.lab import ch10
from workbench.lab.kit.closing import Verdict
from workbench.lab.kit.figures import trace, trace_names


def test_summation_orders_differ_and_stay_close_to_the_exact_sum():
    orders = ch10.summation_orders()
    assert orders["float32 sum"].nunique() > 1
    assert orders["error vs exact"].abs().max() < 1e-2


def test_the_product_check_finds_which_layers_round_with_the_batch(tiny_model):
    tiny_model.prepare()
    check = ch10.product_check(tiny_model, batch_sizes=(2, 8))
    assert set(check.frame["layer"]) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    assert check.mode_is_identical
    differ = check.frame.loc[~check.frame["identical"], "max_abs_diff"]
    assert (differ > 0).all() and (differ < 1e-3).all()


def test_attention_paths_differ_by_default_and_not_in_the_mode(tiny_model):
    paths = ch10.attention_paths(tiny_model, context=130)
    assert paths["batch-invariant: max diff vs decode"].max() == 0.0
    assert paths["default: max diff vs decode"].max() < 1e-4


def test_the_cached_result_has_every_format_in_both_modes():
    frame = ch10.cached_frame(ch10.cached_divergence())
    assert set(frame["kv_cache_dtype"]) >= {"auto", "int4"} and set(frame["batch_invariant"]) == {False, True}
    assert (frame.loc[frame["batch_invariant"], "runs_with_other_logits"] == 0).all()


def test_a_missing_cache_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="bench_determinism.py"):
        ch10.cached_divergence(tmp_path / "none.json")


@pytest.fixture(scope="module")
def panels(tiny_model, tokenizer):
    prompt_ids, cost_prompts = ch10.chat_prompts(tokenizer)
    products = ch10.ProductsLab(tiny_model)
    divergence = ch10.DivergenceLab(tiny_model, tokenizer, prompt_ids, runs=4, max_tokens=8)
    with divergence.changes():
        divergence.max_others.value = 4
    cost = ch10.ModeCostLab(tiny_model, tokenizer, cost_prompts, max_tokens=4)
    with cost.changes():
        cost.requests.value = 2
    return products.run(), divergence, cost


def test_panels_draw_named_traces_and_computed_status(panels):
    products, divergence, cost = panels
    assert trace_names(products.figures[0]) == ["default", "batch-invariant"]
    assert trace(divergence.figures[1], "distinct completions").y[1] == 1  # the mode: one answer
    assert divergence.summaries()[True]["runs_with_other_logits"] == 0
    assert {t.name for t in cost.figures[0].data} == {"default", "batch-invariant"}
    assert cost.ratio > 0


def test_the_closing_table_computes_every_verdict(panels):
    products, divergence, cost = panels
    frame = ch10.cached_frame(ch10.cached_divergence())
    table = ch10.closing_table(frame, divergence.result, cost.ratio, products.result)
    assert len(table) == 4 and all(isinstance(v, Verdict) for v in table.verdicts)
    assert table.verdicts[2] is Verdict.HOLDS  # the mode gave one answer in every cached and live run
    exercises = ch10.exercises(products.result, frame)
    assert exercises["layer"].check(products.result.layers_that_differ[0]).correct
    assert exercises["int4"].check(-1).correct is False
