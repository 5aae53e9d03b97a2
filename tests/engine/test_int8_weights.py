"""Int8 weights: the format, the CPU (fbgemm) and CUDA (Triton, interpreted here) products, sizing, the engine.

Tolerances come from the format, not from trial: a weight is off by at most half its channel's step ``s[n] / 2``,
and the CPU product's activation split by at most ``amax(|x_row|) / 15876`` per input (`fbgemm_error_bound`), so
an output may differ from the float layer by ``sum_k |x_k| * s[n] / 2`` plus that bound, plus float32 rounding
of a sum of in_features terms (a relative 1e-5 of ``sum_k |x_k * w_nk|`` covers it with room).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import workbench
from workbench.cache.sizing import weight_bytes
from workbench.cli import main as cli_main
from workbench.config import CacheConfig, SamplingParams
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.models.cpu_linear import Linear
from workbench.models.int8_linear import (
    RESCORE_TOP,
    Int8Linear,
    _split_product_scripted,
    fbgemm_available,
    fbgemm_error_bound,
    fbgemm_int8_linear,
    model_weight_bytes,
    quantize_model_weights,
    split_rows,
    weight_format_of,
)
from workbench_kernels.int8_matmul import (
    int8_matmul,
    int8_matmul_reference,
    int8_matmul_triton,
    quantize_per_channel,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _layer(out_features: int, in_features: int, *, bias: bool = False, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.05)
        layer.weight[3] *= 20  # one loud channel: its scale must not coarsen the others
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=gen))
    return layer


def _inputs(rows: int, in_features: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    x[0] *= 100  # a loud token, as the first token of a prompt often is
    x[:, 5] *= 30  # an outlier channel
    return x


def test_quantize_per_channel_rounds_each_weight_within_half_a_step():
    weight = _layer(48, 70).weight.detach()
    weight[7] = 0.0  # an all-zero channel still gets a finite scale
    q, scale = quantize_per_channel(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.isfinite(scale).all() and (scale > 0).all()
    error = (q.float() * scale[:, None] - weight).abs()
    assert (error <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert torch.equal(q[3].abs().max(), torch.tensor(127, dtype=torch.int8))  # the loud channel has its own scale
    with pytest.raises(ValueError, match="2-D"):
        quantize_per_channel(weight[0])


def test_split_rows_is_exact_integers_within_the_stated_bound():
    x = _inputs(9, 64)
    coarse, fine, amax = split_rows(x)
    for part in (coarse, fine):
        assert torch.equal(part, part.round()) and int(part.abs().max()) <= 63
    rebuilt = amax / 63 * (coarse + fine / 126)
    assert ((rebuilt - x).abs() <= amax / 15876 * (1 + 1e-5)).all()


@torch.inference_mode()
def test_fbgemm_product_is_within_its_bound_of_the_reference_and_of_the_float_layer():
    assert fbgemm_available(), "fbgemm is part of every x86 PyTorch build; without it the CPU path is the reference"
    for out_features, in_features, bias in ((96, 576, False), (576, 1536, True), (33, 40, True)):
        layer = _layer(out_features, in_features, bias=bias)
        quantized = Int8Linear.from_float(layer)
        quantized.pack()
        assert quantized.path == "fbgemm"
        x = _inputs(17, in_features)
        got = quantized(x)
        spec = int8_matmul_reference(x, quantized.qweight, quantized.scale, quantized.bias)
        magnitude = x.abs() @ layer.weight.detach().abs().T
        bound = fbgemm_error_bound(x, quantized.qweight, quantized.scale) + 1e-5 * magnitude
        assert ((got - spec).abs() <= bound).all()
        # Against the float layer: the weights' own rounding comes on top.
        weight_rounding = x.abs() @ (quantized.scale / 2)[None, :].expand(in_features, -1)
        assert ((got - F.linear(x, layer.weight, layer.bias)).abs() <= bound + weight_rounding * (1 + 1e-5)).all()
        print(f"{out_features}x{in_features}: max |int8 - float| {float((got - layer(x)).abs().max()):.3g} "
              f"(largest output {float(layer(x).abs().max()):.3g})")


@torch.inference_mode()
def test_fused_split_is_exactly_the_split_rows_product():
    # fbgemm_int8_linear writes split_rows' parts straight into fbgemm's input; it must be that product exactly.
    quantized = Int8Linear.from_float(_layer(96, 576))
    quantized.pack()
    x = _inputs(5, 576)
    coarse, fine, amax = split_rows(x)
    pin = quantized._rows1[2:]
    out = torch.ops.quantized.linear_dynamic(torch.cat((coarse, fine, pin)), quantized._packed, True)
    plain = out[:5].add(out[5:10], alpha=1 / 126).mul_(amax / 63)
    assert torch.equal(fbgemm_int8_linear(x, quantized._packed, quantized._rows1), plain)
    # One row uses the layer's own buffer (its pin row stays in place): the same product, call after call.
    for row in (x[:1], x[3:4], x[:1]):
        coarse, fine, amax = split_rows(row)
        out = torch.ops.quantized.linear_dynamic(torch.cat((coarse, fine, pin)), quantized._packed, True)
        assert torch.equal(quantized(row), out[:1].add(out[1:2], alpha=1 / 126).mul_(amax / 63))
    assert torch.equal(quantized._rows1[2:], pin)
    # The engine's speed depends on the split running in TorchScript (a silent fallback to Python is correct
    # but ~1.7x slower per product at batch 1): say so here if a torch upgrade drops it.
    assert isinstance(_split_product_scripted(), torch.jit.ScriptFunction)


@torch.inference_mode()
def test_int8_head_rescoring_makes_the_top_logits_exact_and_keeps_rows_independent():
    model = quantize_model_weights(workbench.random_model("smollm2-135m", num_layers=1), "int8_all")
    head, table = model.lm_head, model.embed_tokens.weight
    assert head.rescore_top == RESCORE_TOP and head.weight is table
    x = _inputs(6, table.shape[1]) * 0.05
    got, exact = head(x), F.linear(x, table)
    top = got.topk(RESCORE_TOP, dim=-1).indices
    # The rescored entries are the float head's (to float32 rounding); the argmax is the float head's argmax
    # whenever that is among the int8 head's top RESCORE_TOP, which these rows have by a wide margin.
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    for i in (0, 5):
        assert torch.equal(head(x[i: i + 1]), got[i: i + 1])
    # Without rescoring, the rest of the row is the plain int8 product.
    head.rescore_top = 0
    plain = head(x)
    rest = torch.ones_like(got, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(plain[rest], got[rest])


def test_a_row_gets_the_same_result_alone_or_in_any_batch():
    quantized = Int8Linear.from_float(_layer(300, 576))
    quantized.pack()
    x = _inputs(24, 576)
    batch = quantized(x)
    for i in (0, 1, 23):  # row 0 is 100x louder than the rest: per-tensor scaling would coarsen the others
        assert torch.equal(quantized(x[i: i + 1]), batch[i: i + 1])
    assert torch.equal(quantized(x[1:]), batch[1:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_kernel_matches_the_reference(device, dtype):
    layer = _layer(70, 45, bias=True)
    q, scale = quantize_per_channel(layer.weight)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    for rows in (1, 19):
        x = _inputs(rows, 45).to(dtype) / 10
        bias = layer.bias.detach().to(dtype)
        got = int8_matmul_triton(x.to(device), q.to(device), scale.to(device), bias.to(device)).cpu()
        want = int8_matmul_reference(x.float(), q, scale, bias.float())
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * float(want.abs().max()))


def test_kernel_launcher_rejects_bad_arguments_and_cpu_dispatch_runs_the_reference():
    q, scale = quantize_per_channel(torch.randn(8, 16))
    x = torch.randn(3, 16)
    with pytest.raises(ValueError, match="int8"):
        int8_matmul_triton(x, q.float(), scale)
    with pytest.raises(ValueError, match="shapes disagree"):
        int8_matmul_triton(torch.randn(3, 15), q, scale)
    with pytest.raises(ValueError, match="bias"):
        int8_matmul_triton(x, q, scale, torch.randn(7))
    assert torch.equal(int8_matmul(x[None], q, scale)[0], int8_matmul_reference(x, q, scale))


def test_weight_bytes_against_hand_arithmetic():
    smol = workbench.model_spec("smollm2-135m")
    # Per layer: q/k/v 576x(576+192+192), o 576x576, gate/up/down 3 x 576x1536 = 3,538,944 weights over
    # 960 + 576 + 2 x 1536 + 576 = 5,184 output channels; 30 layers; tied embedding 49,152 x 576.
    fp32 = 538_060_032
    assert weight_bytes(smol, torch.float32) == fp32
    assert weight_bytes(smol, torch.float32, "int8") == fp32 - 30 * 3_538_944 * 3 + 30 * 5_184 * 4 == 220_177_152
    # int8_all: the tied head's int8 copy and its 49,152 scales come on top (the embedding keeps its table).
    assert weight_bytes(smol, torch.float32, "int8_all") == 220_177_152 + 49_152 * 576 + 49_152 * 4
    # Llama-3-8B in bf16, untied head: 32 layers of 4096x(4096+1024+1024) + 4096x4096 + 3 x 4096x14336.
    llama = workbench.model_spec("llama-3-8b")
    per_layer = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336
    channels = 6144 + 4096 + 2 * 14336 + 4096
    int8 = weight_bytes(llama, torch.bfloat16) - 32 * per_layer + 32 * channels * 4  # 2 bytes -> 1, plus scales
    assert weight_bytes(llama, torch.bfloat16, "int8") == int8
    assert weight_bytes(llama, torch.bfloat16, "int8_all") == int8 - 128256 * 4096 + 128256 * 4
    with pytest.raises(ValueError, match="int4"):
        weight_bytes(smol, torch.float32, "int4")


@pytest.fixture(scope="module")
def int8_model():
    model, _ = workbench.load_model("smollm2-135m", device="cpu", weights="int8")
    return model


def test_loaded_int8_model_allocates_what_sizing_says(int8_model):
    spec = int8_model.spec
    assert weight_format_of(int8_model) == "int8"
    linears = [m for m in int8_model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 4 * spec.num_layers and {m.path for m in linears} == {"fbgemm"}
    assert isinstance(int8_model.lm_head, Linear) and int8_model.lm_head.weight is int8_model.embed_tokens.weight
    assert model_weight_bytes(int8_model) == weight_bytes(spec, torch.float32, "int8")
    every = quantize_model_weights(workbench.random_model("smollm2-135m", num_layers=2), "int8_all")
    assert isinstance(every.lm_head, Int8Linear) and every.lm_head.weight is every.embed_tokens.weight
    assert model_weight_bytes(every) == weight_bytes(spec.replace(num_layers=2), torch.float32, "int8_all")


def test_engine_greedy_output_with_int8_weights_against_fp32(real_model, tokenizer, int8_model):
    prompts = load_prompts("varied")[:4]
    params = SamplingParams(max_tokens=10)
    cache = CacheConfig(num_blocks=64)

    def run(model, batch):
        return [o.token_ids for o in LLMEngine(model, tokenizer, cache_config=cache).generate(batch, params,
                                                                                              progress=False)]

    fp32, int8 = run(real_model, prompts), run(int8_model, prompts)
    # Rows are independent on the int8 path too: a request alone gets the tokens it got in the batch.
    assert run(int8_model, prompts[1:2]) == int8[1:2]
    # Greedy outputs agree until the first flipped near-tie; report how far, require most of it.
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
              for x, y in zip(fp32, int8, strict=True)]
    agreement = sum(prefix) / sum(len(x) for x in fp32)
    print(f"int8 vs fp32 greedy: identical {sum(x == y for x, y in zip(fp32, int8, strict=True))}/{len(prompts)} "
          f"prompts; {agreement:.0%} of fp32's tokens before the first difference")
    assert all(p >= 1 for p in prefix), "the first token should survive int8 weights on every prompt"
    assert agreement >= 0.5


def test_bad_weight_format_is_rejected_with_the_choices(capsys):
    with pytest.raises(ValueError, match=r"'int3'.*\['auto', 'int8', 'int8_all', 'q4_1', 'q8_0'\]"):
        workbench.load_model("smollm2-135m", weights="int3")
    with pytest.raises(SystemExit):
        cli_main(["info", "--weights", "int3"])
    assert cli_main(["info", "--weights", "int8"]) == 0
    assert "210.0 MiB (weights int8)" in capsys.readouterr().out
