"""The 2025-26 architectures' KV caches by layer group, checked against hand arithmetic on their config.json values,
and `workbench info` printing them."""

from __future__ import annotations

import json

import pytest
import torch

import workbench
from workbench.cache.kv_layout import LayerGroup, kv_layout
from workbench.cache.layout_sizing import (
    architecture_table,
    bytes_per_sequence,
    group_bytes_per_token,
    group_rows,
    group_state_bytes,
    sequences_that_fit,
)
from workbench.cache.sizing import kv_bytes
from workbench.cli import main
from workbench.models.registry import architecture_names
from workbench.paths import CONFIGS_DIR

NEW = ["deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "gemma-3-27b", "qwen3-next-80b-a3b", "llama-3.1-8b",
       "llama-3.1-70b"]
BF16 = 2


@pytest.mark.parametrize("name", NEW)
def test_every_new_config_names_its_sources(name):
    config = json.loads((CONFIGS_DIR / f"{name}.json").read_text())
    assert config["_source"]
    sources = config["_sources"]
    assert sources.get("*"), "a default source for the values without their own"
    values = config.get("text_config", config)
    for key in sources:
        if key != "*" and not key.startswith("_"):
            assert key.removeprefix("text_config.") in values, f"{name}: a source for {key}, which is not a value"
    assert set(NEW) <= set(architecture_names())


def test_mla_is_one_576_wide_head_per_layer():
    layout = kv_layout("deepseek-v3")
    (mla,) = layout.groups
    assert (mla.kind, mla.num_layers, mla.head_dim) == ("mla", 61, 512 + 64)
    per_token = (512 + 64) * 61 * BF16  # the hand calculation: 70,272 B
    assert group_bytes_per_token(layout, mla) == per_token == 70_272
    assert bytes_per_sequence(layout, 8192) == 8192 * per_token
    # fp8: one byte per value; the latent is not split by TP, so every rank holds all of it
    assert group_bytes_per_token(layout, mla, "fp8_e4m3") == 576 * 61
    assert group_bytes_per_token(layout, mla, tp=8) == per_token
    # a GQA model of the same width would have cached 2 x 128 heads x 192 dims: MLA is 85x smaller
    assert 2 * 128 * (128 + 64) * 61 * BF16 / per_token == pytest.approx(85.3, rel=0.01)


def test_gpt_oss_alternates_windows_and_adds_learned_sinks():
    layout = kv_layout("gpt-oss-120b")
    sliding, full = layout.groups
    assert (sliding.kind, sliding.window, sliding.num_layers, full.num_layers) == ("sliding", 128, 18, 18)
    per_layer = 2 * 8 * 64 * BF16
    assert bytes_per_sequence(layout, 32768) == 18 * per_layer * 32768 + 18 * per_layer * 128
    assert bytes_per_sequence(layout, 100) == 36 * per_layer * 100  # inside the window nothing is saved
    assert "learned" in layout.sinks  # parameters, no cached tokens
    assert kv_layout("gpt-oss-20b").num_layers == 24


def test_gemma3_keeps_the_window_in_five_layers_of_six():
    layout = kv_layout("gemma-3-27b")
    sliding, full = layout.groups
    assert (sliding.num_layers, full.num_layers, sliding.window) == (52, 10, 1024)
    per_layer = 2 * 16 * 128 * BF16  # 16 KV heads, not the 32 query heads
    frame = group_rows(layout, 131072)
    assert frame.loc["full", "bytes_per_sequence"] == 10 * per_layer * 131072
    assert frame.loc["sliding 1,024", "bytes_per_sequence"] == 52 * per_layer * 1024
    assert frame.loc["total", "bytes_per_token"] == 62 * per_layer


def test_linear_attention_state_is_per_sequence_and_splits_by_tp():
    layout = kv_layout("qwen3-next-80b-a3b")
    linear, full = layout.groups
    assert (linear.num_layers, full.num_layers) == (36, 12)
    # Gated DeltaNet: 32 value heads x 128 x 128 recurrent state + (4 - 1) x (2 x 16 x 128 + 32 x 128) conv inputs
    state = 32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)
    assert linear.state_elements == state == 548_864
    assert group_state_bytes(layout, linear) == 36 * state * BF16
    assert group_state_bytes(layout, linear, torch.float32) == 36 * state * 4
    assert group_state_bytes(layout, linear, tp=4) == 36 * state * BF16 // 4
    assert linear.cached_tokens(262144) == 0
    per_token = 12 * 2 * 2 * 256 * BF16
    assert bytes_per_sequence(layout, 1000) == 1000 * per_token + 36 * state * BF16
    assert bytes_per_sequence(layout, 2000) - bytes_per_sequence(layout, 1000) == 1000 * per_token


def test_tensor_parallel_divides_then_replicates_kv_heads():
    layout = kv_layout("llama-3.1-8b")
    (full,) = layout.groups
    assert group_bytes_per_token(layout, full) == 2 * 32 * 8 * 128 * BF16 == 131_072
    assert group_bytes_per_token(layout, full, tp=4) == 131_072 // 4
    assert group_bytes_per_token(layout, full, tp=16) == 131_072 // 8  # past 8 KV heads: one copy per rank
    with pytest.raises(ValueError, match="tensor-parallel degree 3"):
        group_bytes_per_token(layout, full, tp=3)


def test_llama_family_layouts_agree_with_the_engine_sizing():
    for name in ("llama-3.1-70b", "mistral-7b", "smollm2-135m"):
        spec = workbench.model_spec(name)
        assert bytes_per_sequence(kv_layout(name), 32768) == kv_bytes(spec, 32768, kv_format=torch.bfloat16)
    spec = workbench.model_spec("smollm2-135m")
    what_if = spec.replace(sliding_window=256, layer_types=tuple(
        "full_attention" if i % 6 == 5 else "sliding_attention" for i in range(30)))
    assert kv_bytes(what_if, 4096) == (5 * 4096 + 25 * 256) * 2 * 3 * 64 * 2


def test_sizes_fit_a_budget_and_tabulate():
    layout = kv_layout("deepseek-v3")
    assert sequences_that_fit(layout, 131072, 72 * 10**9) == 72 * 10**9 // (131072 * 70_272)
    table = architecture_table(["deepseek-v3", "llama-3.1-8b"], (8192, 131072))
    row = table[(table.model == "llama-3.1-8b") & (table.context == 131072)].iloc[0]
    assert row.GiB_per_sequence == 16
    with pytest.raises(ValueError, match="window"):
        LayerGroup("sliding", 2, 8, 64)


def test_non_llama_architectures_are_sized_not_built():
    assert "deepseek-v3" not in workbench.config_names()
    with pytest.raises(ValueError, match="kv_layout"):
        workbench.model_spec("deepseek-v3")
    with pytest.raises(ValueError, match="unknown architecture"):
        kv_layout("gpt-5")


def test_info_prints_groups_and_the_per_sequence_total(capsys):
    assert main(["info", "--model", "deepseek-v3", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "70,272 B per token" in out and f"{8192 * 70_272:,} B" in out
    assert main(["info", "--model", "deepseek-v3", "--context", "8192", "-tp", "8"]) == 0
    assert "each rank caches all of it" in capsys.readouterr().out
    assert main(["info", "--model", "qwen3-next-80b-a3b", "--context", "1000"]) == 0
    out = capsys.readouterr().out
    assert f"{36 * 548_864 * 2:,} B of state per sequence" in out and "12,288" not in out.split("full")[0]
    assert main(["info", "--model", "gpt-oss-20b", "--context", "0"]) == 2


def test_llama3_rope_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from workbench.models.rope import RotaryEmbedding

    spec = workbench.model_spec("llama-3.1-8b")
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**spec.to_hf_config()), "cpu")
    ours = RotaryEmbedding(spec.head_dim, spec.rope_theta, 16, scaling=spec.rope_scaling).inv_freq
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    small = dict(vocab_size=64, hidden_size=256, num_heads=2, num_kv_heads=1, intermediate_size=64, num_layers=1)
    model = workbench.random_model(spec.replace(**small), device="cpu")  # the model wires the scaling in
    torch.testing.assert_close(model.rope.inv_freq, ours)
    plain = workbench.random_model(workbench.model_spec("llama-3-8b").replace(**small), device="cpu")
    assert not torch.allclose(plain.rope.inv_freq, ours)
