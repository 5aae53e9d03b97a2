"""Chapter 1's crossover verdict redone with the 128K configs."""

from __future__ import annotations

import workbench
from workbench.lab.ch01.crossover_128k import crossover_table, crossover_verdict, hybrid_shapes, model_crossover
from workbench.roofline.layer_cost import crossover_length


def test_numeric_crossover_agrees_with_the_closed_form():
    for name in ("llama-3-8b", "llama-3.1-70b", "smollm2-135m", "mistral-7b"):
        spec = workbench.model_spec(name)
        closed, numeric = crossover_length(spec), model_crossover(spec)
        assert (closed is None and numeric is None) or abs(closed - numeric) <= 1, name


def test_128k_configs_cross_inside_their_context_and_windows_can_hold_it_off():
    table = crossover_table()
    assert table.loc["llama-3.1-8b", "inside_context"] and table.loc["llama-3.1-70b", "inside_context"]
    assert not table.loc["llama-3-8b", "inside_context"]  # the 8K config chapter 1 judged by
    gemma = hybrid_shapes()[0]
    assert not table.loc[gemma.name, "inside_context"]
    assert model_crossover(gemma.replace(layer_types=("full_attention",) * gemma.num_layers)) < 131072
    verdict = crossover_verdict(table)
    assert "llama-3.1-8b" in verdict and gemma.name in verdict
