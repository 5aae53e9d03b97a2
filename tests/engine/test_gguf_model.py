"""GGUF weight formats on whole models: the real model's q4_1 blocks are the file's and its logits the float
model's to float32 rounding (prefill through the C++ products, decode through the fused C++ layers), the fused
layers against the plain forward in generate and in the paged engine, sizes, q8_0's rounding, the CLI, and on a
GPU the Triton path under CUDA graphs. The blocks and products themselves: tests/engine/test_gguf_weights.py.

Logits through 30 layers differ from the float model's by a few 1e-5 (largest logit ~30): float32 rounding of
sums taken in another order, layer after layer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench
from workbench.cache.contiguous import ContiguousKVCache
from workbench.cache.sizing import weight_bytes
from workbench.models.gguf_linear import GGUFLinear, gguf_model_weights, quantize_blocks
from workbench.models.int8_linear import model_weight_bytes, weight_format_of
from workbench_kernels.gguf_matmul import block_fields

FORMATS = ["q4_1", "q8_0"]


@pytest.fixture(scope="module")
def q4_model():
    model, tokenizer = workbench.load_model("smollm2-135m", device="cpu", weights="q4_1")
    return model, tokenizer


@torch.inference_mode()
def test_q4_1_keeps_the_files_blocks_which_are_the_checkpoints_weights(q4_model, real_model):
    model, _ = q4_model
    assert weight_format_of(model) == "q4_1"
    for float_layer, layer in zip(real_model.layers, model.layers, strict=True):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            linear = getattr(layer, name)
            assert isinstance(linear, GGUFLinear) and linear.fmt == "q4_1" and linear.path == "cpp"
            assert torch.equal(linear.dequantized_weight(), getattr(float_layer, name).weight)  # bit for bit
    assert model.lm_head.fmt == "q8_0" and torch.equal(model.lm_head.dequantized_weight(), real_model.lm_head.weight)
    assert model.lm_head.weight is model.embed_tokens.weight  # tied: the float table stays for lookups
    assert model_weight_bytes(model) == weight_bytes(model.spec, torch.float32, "q4_1")
    decoder_blocks = sum(getattr(layer, n).blocks.numel() for layer in model.layers
                         for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    assert decoder_blocks == 66_355_200  # the file's Q4_1 bytes (the gguf package's n_bytes, summed)


def _prefill_and_decode(model, ids: list[int], steps: list[int]) -> torch.Tensor:
    """Logits of a prefill over ``ids`` (every row), then of one-token decode steps feeding ``steps``."""
    cache = ContiguousKVCache(model.spec, max_batch=1, max_len=len(ids) + len(steps))
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), cache.attention([0], [0], [len(ids)]))
    rows = [model.compute_logits(hidden)]
    for step, token in enumerate(steps):
        pos = len(ids) + step
        rows.append(model.compute_logits(model(torch.tensor([token]), torch.tensor([pos]),
                                               cache.attention([0], [pos], [1]))))
    return torch.cat(rows)


@torch.inference_mode()
def test_q4_1_logits_equal_the_float_models_to_rounding_in_prefill_and_fused_decode(q4_model, real_model):
    model, tokenizer = q4_model
    ids = tokenizer.encode("The capital of France is Paris, and the capital of Germany is")
    steps = [5, 1000, 17, 22, 9000, 3]  # fixed tokens, so both models see the same inputs
    real_model.prepare(pack=False)  # the plainest float forward
    try:
        want = _prefill_and_decode(real_model, ids, steps)
    finally:
        real_model.prepare()
    model.cpu_block_layers = None
    got = _prefill_and_decode(model, ids, steps)
    assert model.cpu_block_layers is True  # the decode steps took the fused C++ layers
    diff = (got - want).abs().max()
    assert diff <= 3e-4, f"max |q4_1 - float| logit {float(diff):.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@torch.inference_mode()
def test_fused_cpu_layers_match_the_plain_forward_in_generate_and_in_the_paged_engine(one_torch_thread):
    from workbench.config import CacheConfig, SamplingParams
    from workbench.engine.llm_engine import LLMEngine
    from workbench.generation import stream_token_ids

    model = workbench.random_model("smollm2-135m", num_layers=3, device="cpu", weights="q4_1")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [[1, 5, 9, 200, 31], [7, 7, 7], [400, 3, 2, 1, 90, 12, 8]]
    runs = {}
    for fused in (True, False):
        model.cpu_block_layers = None if fused else False
        alone = [[e.token_id for e in stream_token_ids(model, p, params)] for p in prompts]
        engine = LLMEngine(model, cache_config=CacheConfig(block_size=4, num_blocks=64))
        batched = [out.token_ids for out in engine.generate(prompts, params, progress=False)]
        runs[fused] = (alone, batched, model.cpu_block_layers)
    assert runs[True][2] is True and runs[False][2] is False  # the fused run did take the C++ layers
    assert runs[True][:2] == runs[False][:2]
    # Taps (what EAGLE-style drafts read) come out of the fused path as from the plain one.
    model.cpu_block_layers = None
    ids, pos = torch.tensor([3]), torch.tensor([0])
    fused = model.forward_with_taps(ids, pos, ContiguousKVCache(model.spec, max_batch=1, max_len=4).attention(
        [0], [0], [1]), (0, 2))
    model.cpu_block_layers = False
    plain = model.forward_with_taps(ids, pos, ContiguousKVCache(model.spec, max_batch=1, max_len=4).attention(
        [0], [0], [1]), (0, 2))
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_models_in_gguf_formats_size_as_the_formula_says(fmt):
    tied = workbench.random_model("smollm2-135m", num_layers=2, device="cpu", weights=fmt)
    assert model_weight_bytes(tied) == weight_bytes(tied.spec, torch.float32, fmt)
    untied_spec = workbench.model_spec("qwen2.5-7b").replace(num_layers=1, hidden_size=128, intermediate_size=256,
                                                             num_heads=4, num_kv_heads=2, head_dim=32,
                                                             vocab_size=1000, tie_word_embeddings=False)
    untied = workbench.random_model(untied_spec, device="cpu", weights=fmt)
    assert model_weight_bytes(untied) == weight_bytes(untied_spec, torch.float32, fmt)
    assert untied.layers[0].qkv_proj.bias is not None and untied.cpu_block_layers is None
    x = torch.tensor([1, 2])
    untied(x, torch.arange(2), ContiguousKVCache(untied_spec, max_batch=1, max_len=4).attention([0], [0], [2]))
    assert untied.cpu_block_layers is False  # a bias keeps the plain forward


@torch.inference_mode()
def test_q8_0_blocks_round_each_weight_within_half_a_step_and_the_head_is_the_files(real_model):
    from workbench.models.registry import checkpoint_dir, gguf_source

    layer = real_model.layers[0].gate_up_proj
    q8 = GGUFLinear.from_float(layer, "q8_0")
    d, _, _ = block_fields(q8.blocks, "q8_0")
    step = d.repeat_interleave(32, dim=1)
    # llama.cpp's rounding uses the float32 step amax / 127, then stores it as fp16 (2^-11 relative off): a
    # weight is within half a step plus 127 codes times that difference.
    assert ((q8.dequantized_weight() - layer.weight).abs() <= step * (0.5 + 127 * 2 ** -11)).all()
    source = gguf_source(checkpoint_dir(), real_model.spec)
    fmt, head = source.head_blocks()
    assert fmt == "q8_0" and np.array_equal(head, quantize_blocks(real_model.embed_tokens.weight, "q8_0").numpy())


def test_cli_generate_with_q4_1_weights(capsys):
    from workbench.cli import main as cli_main

    cli_main(["generate", "Say hello.", "--device", "cpu", "--weights", "q4_1", "--max-tokens", "4", "--ignore-eos"])
    err = capsys.readouterr().err
    assert "[4 tokens" in err and "weights q4_1" in err and "tokens/s decode" in err


def test_gguf_model_weights_refuses_unknown_formats():
    model = workbench.random_model("smollm2-135m", num_layers=1, device="cpu")
    with pytest.raises(ValueError, match="unknown GGUF weight format 'q4_0'"):
        gguf_model_weights(model, "q4_0")
    with pytest.raises(ValueError, match="unknown weights format 'q5_1'"):
        workbench.random_model("smollm2-135m", num_layers=1, device="cpu", weights="q5_1")


@pytest.mark.gpu
@torch.inference_mode()
def test_q4_1_on_cuda_is_the_float_model_and_runs_under_cuda_graphs(real_model):
    from workbench.config import CacheConfig, SamplingParams
    from workbench.engine.llm_engine import LLMEngine

    model, tokenizer = workbench.load_model("smollm2-135m", device="cuda", weights="q4_1")
    assert model.layers[0].qkv_proj.path == "triton" and model.lm_head.path == "triton"
    ids = tokenizer.encode("The capital of France is Paris, and the capital of Germany is")
    steps = [5, 1000, 17]
    real_model.prepare(pack=False)
    try:
        want = _prefill_and_decode(real_model, ids, steps)
    finally:
        real_model.prepare()
    got = _prefill_and_decode(model, ids, steps).cpu()
    assert float((got - want).abs().max()) <= 1e-3 and torch.equal(got.argmax(-1), want.argmax(-1))
    bf16, _ = workbench.load_model("smollm2-135m", device="cuda", dtype=torch.bfloat16, weights="q4_1")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = [LLMEngine(bf16, tokenizer, cache_config=CacheConfig(num_blocks=64), cuda_graphs=graphs).generate(
        ["Say hello.", "Count to five."], params, progress=False)[0].token_ids for graphs in (False, True)]
    assert outs[0] == outs[1]
