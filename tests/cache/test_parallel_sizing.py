"""Per-GPU KV sizing under tensor and pipeline parallelism: heads split, heads replicated past their number,
layers split the way vLLM splits them, and clear errors for degrees a model cannot take."""

from __future__ import annotations

import pytest
import torch

from workbench.cache.parallel_sizing import gpu_share, kv_heads_per_rank, layers_per_stage, valid_tp_degrees
from workbench.cache.sizing import kv_bytes_per_token
from workbench.cli import main
from workbench.models import model_spec

LLAMA_70B = model_spec("llama-3-70b")  # 64 query heads, 8 KV heads, head_dim 128, 80 layers


def test_tp_splits_kv_heads_not_query_heads():
    share = gpu_share(LLAMA_70B, 4)
    assert (share.kv_heads_per_rank, share.kv_head_replicas) == (2, 1)
    # 2 (K, V) x 80 layers x 2 heads x 128 dims x 2 bytes
    assert share.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2 == 81_920
    assert share.total_kv_bytes_per_token == kv_bytes_per_token(LLAMA_70B, torch.bfloat16) == 327_680
    assert share.kv_bytes_per_token * 4 == share.total_kv_bytes_per_token  # no replication: the shares add up


def test_past_the_kv_heads_each_head_is_replicated_and_the_per_gpu_cache_stops_shrinking():
    at_8, at_16, at_32 = (gpu_share(LLAMA_70B, t) for t in (8, 16, 32))
    assert at_8.kv_bytes_per_token == at_16.kv_bytes_per_token == at_32.kv_bytes_per_token == 40_960
    assert [s.kv_head_replicas for s in (at_8, at_16, at_32)] == [1, 2, 4]
    assert kv_heads_per_rank(model_spec("smollm2-135m"), 9) == (1, 3)


@pytest.mark.parametrize(("layers", "pp", "stages"), [(32, 4, [8, 8, 8, 8]), (22, 4, [5, 6, 6, 5]),
                                                      (61, 4, [15, 15, 16, 15]), (5, 3, [2, 2, 1]), (61, 2, [31, 30])])
def test_pipeline_stages_take_layers_as_vllm_splits_them(layers, pp, stages):
    assert layers_per_stage(layers, pp) == stages


def test_the_fullest_stage_sets_the_per_gpu_bytes():
    spec = model_spec("smollm2-135m")  # 30 layers, 3 KV heads, head_dim 64
    share = gpu_share(spec, 3, 4, kv_format=torch.float32, model_dtype=torch.float32)
    assert share.layers_per_stage == (7, 8, 8, 7)
    assert share.kv_bytes_per_token == 2 * 8 * 1 * 64 * 4


def test_quantized_formats_split_by_head_with_their_scales():
    whole, split = kv_bytes_per_token(LLAMA_70B, "int8", torch.bfloat16), gpu_share(LLAMA_70B, 8, kv_format="int8")
    assert split.kv_bytes_per_token * 8 == whole


@pytest.mark.parametrize(("tp", "pp", "message"), [
    (0, 1, "tensor-parallel degree must be a whole number >= 1, got 0"),
    (-2, 1, "got -2"),
    (3, 1, r"64 query heads do not divide into 3 ranks; allowed degrees: \[1, 2, 4, 8, 16, 32, 64\]"),
    (1, 0, "pipeline-parallel degree must be a whole number >= 1, got 0"),
    (1, 81, "pipeline-parallel degree 81 exceeds the 80 layers: allowed 1..80"),
])
def test_bad_degrees_name_the_value_and_the_allowed_ones(tp, pp, message):
    with pytest.raises(ValueError, match=message):
        gpu_share(LLAMA_70B, tp, pp)


def test_kv_heads_that_do_not_divide_are_refused():
    spec = model_spec("smollm2-135m")  # 9 query heads, 3 KV heads
    assert valid_tp_degrees(spec) == [1, 3, 9]
    with pytest.raises(ValueError, match="9 query heads do not divide into 6 ranks"):
        gpu_share(spec, 6)


def test_tokens_that_fit_per_gpu():
    share = gpu_share(LLAMA_70B, 8)
    memory = 80 * 2**30
    assert share.tokens_that_fit(memory) == (int(memory * 0.9) - share.weight_bytes_per_gpu) // 40_960
    assert gpu_share(LLAMA_70B, 1).tokens_that_fit(memory) == 0  # 140 GB of weights do not fit one 80 GB GPU
    with pytest.raises(ValueError, match="utilization"):
        share.tokens_that_fit(memory, 1.5)


def test_info_prints_exact_per_gpu_bytes(capsys):
    assert main(["info", "--model", "llama-3-70b", "--dtype", "bfloat16", "-tp", "16", "-pp", "2"]) == 0
    out = capsys.readouterr().out
    assert "TP 16 x PP 2 = 32 GPUs" in out and "1 of 8, each copied on 2 ranks" in out
    assert "KV bytes per token per GPU    20,480 B (whole model: 327,680 B)" in out
    share = gpu_share(LLAMA_70B, 16, 2)
    assert f"tokens that fit per GPU       {share.tokens_that_fit(80 * 2**30):,} (80 GiB x 0.9" in out


def test_info_refuses_a_bad_degree(capsys):
    assert main(["info", "--model", "llama-3-8b", "-tp", "3"]) == 2
    assert "32 query heads do not divide into 3 ranks" in capsys.readouterr().err
