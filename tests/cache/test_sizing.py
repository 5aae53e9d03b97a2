"""KV cache sizing agrees with hand arithmetic for every architecture in datasets/configs."""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.cache.sizing import (
    attention_variants,
    block_budget,
    kv_bytes,
    kv_bytes_per_token,
    max_concurrency,
    sizing_table,
)

# (layers, kv_heads, head_dim) read off each config.json by hand.
HAND = {
    "smollm2-135m": (30, 3, 64), "llama-3-8b": (32, 8, 128), "llama-3-70b": (80, 8, 128),
    "llama-2-70b": (80, 8, 128), "llama-2-7b": (32, 32, 128), "mistral-7b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128), "llama-3.1-8b": (32, 8, 128), "llama-3.1-70b": (80, 8, 128),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_bytes_per_token_matches_hand_arithmetic(name):
    layers, kv_heads, head_dim = HAND[name]
    spec = workbench.model_spec(name)
    assert kv_bytes_per_token(spec, torch.bfloat16) == 2 * layers * kv_heads * head_dim * 2
    assert kv_bytes_per_token(spec, torch.float32) == 2 * layers * kv_heads * head_dim * 4
    assert kv_bytes_per_token(spec, "fp8_e4m3") == 2 * layers * kv_heads * head_dim
    # int8: one byte per value plus a 2-byte scale per head vector.
    assert kv_bytes_per_token(spec, "int8") == 2 * layers * kv_heads * (head_dim + 2)
    # int4: half a byte per value plus 4 bytes (scale and zero point) per group of 32.
    assert kv_bytes_per_token(spec, "int4") == 2 * layers * kv_heads * (head_dim // 2 + 4 * (head_dim // 32))


def test_sizing_uses_kv_heads_not_query_heads():
    spec = workbench.model_spec("llama-3-70b")  # 64 query heads share 8 KV heads
    assert kv_bytes_per_token(spec, torch.bfloat16) == 327_680  # 320 KiB
    wrong = 2 * spec.num_layers * spec.num_heads * spec.head_dim * 2
    assert kv_bytes_per_token(spec, torch.bfloat16) * 8 == wrong


def test_llama_2_70b_at_4096_tokens():
    # 2 x 80 x 8 x 4096 x 128 x 2 bytes = 1,342,177,280 bytes = 1.25 GiB per sequence
    assert kv_bytes(workbench.model_spec("llama-2-70b"), 4096) == 1_342_177_280


def test_sliding_window_caps_cached_tokens():
    spec = workbench.model_spec("mistral-7b")
    assert kv_bytes(spec, 32768) == kv_bytes(spec, 4096) == 4096 * kv_bytes_per_token(spec)


def test_block_budget_and_concurrency():
    spec = workbench.model_spec("llama-3-8b")
    budget = block_budget(spec, 80 * 2**30, utilization=0.9, activation_bytes=2 * 2**30, block_size=16)
    usable = int(80 * 2**30 * 0.9)
    weights = spec.num_parameters() * 2
    per_block = 16 * 131_072  # 128 KiB per token in bf16
    assert budget.weight_bytes == weights
    assert budget.num_blocks == (usable - weights - 2 * 2**30) // per_block
    assert budget.max_concurrency(8192) == budget.num_blocks // 512
    assert max_concurrency(100, 16, 17) == 50  # 17 tokens round up to 2 blocks


def test_block_budget_refuses_when_weights_do_not_fit():
    with pytest.raises(ValueError, match="no room for a KV cache"):
        block_budget(workbench.model_spec("llama-3-70b"), 80 * 2**30)
    with pytest.raises(ValueError, match="utilization"):
        block_budget(workbench.model_spec("smollm2-135m"), 2**30, utilization=1.5)


def test_attention_variants_side_by_side():
    table = attention_variants(workbench.model_spec("llama-3-8b"), 8192)
    assert list(table.index) == ["MHA", "GQA", "MQA", "GQA + SWA 4096"]
    assert table.loc["GQA", "vs_MHA"] == pytest.approx(8 / 32)
    assert table.loc["MQA", "vs_MHA"] == pytest.approx(1 / 32)
    assert table.loc["GQA + SWA 4096", "cached_tokens"] == 4096
    mha = workbench.model_spec("llama-2-7b")  # an MHA model gets a GQA row with 8 KV heads
    assert attention_variants(mha, 1024).loc["GQA", "kv_heads"] == 8


def test_sizing_table_covers_every_config():
    specs = [workbench.model_spec(n) for n in workbench.config_names()]
    table = sizing_table(specs, 4096)
    assert set(table.index) == set(HAND)
    assert table.loc["llama-2-7b", "attention"] == "MHA"


def test_unknown_kv_format_lists_the_options():
    with pytest.raises(ValueError, match="int8"):
        kv_bytes_per_token(workbench.model_spec("smollm2-135m"), "int3")
