"""GGUF block weights (q4_1, q8_0): the format against the gguf package, the CPU products (C++ extension, torch's
packed int4 kernel, reference) and the extension's build and fallbacks, its decode attention, and the Triton
kernel (interpreted here). Whole models: tests/engine/test_gguf_model.py.

Tolerances come from the format: every weight is the float32 number the dequantized checkpoint holds, so a product
differs from ``F.linear`` on the dequantized weights only by float32 rounding of its sums, bounded here by a
relative 1e-5 of ``|x| @ |w|^T`` (576-1536 terms, each sum rounded ~K times by 2^-24 at worst: ~1e-4 in the
worst case, ~1e-6 in practice).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from workbench.models import gguf_cpu
from workbench.models.attention import causal_attention
from workbench.models.gguf_linear import GGUFLinear, quantize_blocks
from workbench.models.row_invariant import row_invariant_products
from workbench_kernels.gguf_matmul import (
    block_fields,
    dequantize_blocks,
    gguf_matmul,
    gguf_matmul_reference,
    gguf_matmul_triton,
)

FORMATS = ["q4_1", "q8_0"]
KIND = {"q4_1": gguf_cpu.GGML_Q4_1, "q8_0": gguf_cpu.GGML_Q8_0}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _weights(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[1] = 0.25  # a constant row: Q4_1's d is 0 there, every weight its minimum
    w[2, :32] = 0.0  # an all-zero block: Q8_0's d is 0
    w[3] *= 40  # a loud row
    w[4, ::7] = -3.0  # outliers inside blocks
    return w


def _blocks(fmt: str, rows: int = 40, cols: int = 96, seed: int = 0) -> torch.Tensor:
    return quantize_blocks(_weights(rows, cols, seed), fmt)


def _inputs(rows: int, cols: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    x[0] *= 50
    return x


def _assert_rounding_close(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rel: float = 1e-5) -> None:
    want = F.linear(x.float(), weight.float())
    bound = rel * (x.float().abs() @ weight.float().abs().T) + 1e-30
    assert ((got.float() - want).abs() <= bound).all(), float(((got.float() - want).abs() / bound).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_dequantize_exactly_as_the_gguf_package_does(fmt):
    from gguf import GGMLQuantizationType, quants

    blocks = _blocks(fmt)
    qtype = GGMLQuantizationType[fmt.upper()]
    want = torch.from_numpy(quants.dequantize(blocks.numpy(), qtype))
    assert torch.equal(dequantize_blocks(blocks, fmt), want)
    d, m, codes = block_fields(blocks, fmt)
    assert d.shape == (40, 3) and codes.shape == (40, 96)
    assert (m is None) == (fmt == "q8_0")
    if gguf_cpu.extension().loaded:  # the extension's own conversion: the same numbers
        assert torch.equal(gguf_cpu.cpp_dequantize(blocks, KIND[fmt], 96), want)
    with pytest.raises(ValueError, match="whole number"):
        dequantize_blocks(blocks[:, :-1], fmt)
    with pytest.raises(ValueError, match="unknown GGUF block format 'q4_0'"):
        dequantize_blocks(blocks, "q4_0")


def test_the_cpp_extension_builds_here_and_says_which_vector_path():
    # The project's machines have a C++ compiler (and ninja, a dependency); a failed build here is a bug.
    status = gguf_cpu.extension()
    if shutil.which("c++") is None:
        pytest.fail(f"no C++ compiler on this machine: the GGUF CPU product falls back ({status.reason})")
    assert status.loaded, status.reason
    assert status.vector_path in ("avx512", "avx2", "portable")
    assert gguf_cpu.build_directory().is_dir()


@pytest.mark.parametrize("fmt", FORMATS)
@torch.inference_mode()
def test_cpp_product_is_the_dequantized_product_and_rows_never_depend_on_their_batch(fmt):
    assert gguf_cpu.extension().loaded
    for cols in (32, 96, 576):  # one block, an odd number of blocks (the unpaired tail), the model's width
        blocks = _blocks(fmt, rows=37, cols=cols)
        weight = dequantize_blocks(blocks, fmt)
        x = _inputs(9, cols)
        for rows in range(1, 10):  # 1-4 rows share one pass over the weights; 5-9 take two passes
            got = gguf_cpu.cpp_linear(x[:rows].contiguous(), blocks, KIND[fmt])
            _assert_rounding_close(got, x[:rows], weight)
            for r in range(rows):  # each row computed exactly as alone: what batch-invariant mode relies on
                assert torch.equal(got[r], gguf_cpu.cpp_linear(x[r:r + 1].contiguous(), blocks, KIND[fmt])[0])


def test_cpp_product_refuses_bad_arguments():
    assert gguf_cpu.extension().loaded
    blocks = _blocks("q4_1")
    with pytest.raises(RuntimeError, match="kind must be 3"):
        gguf_cpu.cpp_linear(torch.randn(1, 96), blocks, 2)
    with pytest.raises(RuntimeError, match="96 inputs need 60"):
        gguf_cpu.cpp_linear(torch.randn(1, 96), blocks[:, :40].contiguous(), 3)
    with pytest.raises(RuntimeError, match="float32"):
        gguf_cpu.cpp_linear(torch.randn(1, 96, dtype=torch.float64), blocks, 3)


@torch.inference_mode()
def test_int4pack_mapping_is_exact_where_it_claims_and_refuses_where_it_is_not():
    blocks = _blocks("q4_1", rows=64, cols=128)
    d, m, codes = block_fields(blocks, "q4_1")
    packed = gguf_cpu.int4pack_weights(codes, d, m)
    assert packed is not None, "m + 8 d is a float32 number for these blocks"
    x = _inputs(3, 128)
    _assert_rounding_close(gguf_cpu.int4pack_linear(x, packed), x, dequantize_blocks(blocks, "q4_1"))
    # m = 32768 and d = 2^-14 (fp16 numbers): m + 8 d needs 26 significant bits, float32 has 24.
    d[5, 1], m[5, 1] = 2.0 ** -14, 32768.0
    assert gguf_cpu.int4pack_weights(codes, d, m) is None


@pytest.mark.parametrize("product", ["int4pack", "reference"])
@torch.inference_mode()
def test_fallback_products_when_the_extension_is_missing(monkeypatch, product):
    missing = gguf_cpu.ExtensionStatus(False, "test: pretend the build failed")
    monkeypatch.setattr(gguf_cpu, "extension", lambda: missing)
    if product == "reference":
        monkeypatch.setattr(gguf_cpu, "int4pack_available", lambda: False)
    layer = GGUFLinear(_blocks("q4_1", rows=64, cols=128), "q4_1", 128)
    layer.pack()
    assert layer.path == product
    head = GGUFLinear(_blocks("q8_0", rows=64, cols=128), "q8_0", 128)
    assert head.path == "reference"  # torch has no 8-bit block kernel
    x = _inputs(3, 128)
    for module in (layer, head):
        _assert_rounding_close(module(x), x, module.dequantized_weight())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
@torch.inference_mode()
def test_triton_kernel_matches_the_reference(fmt, dtype, device):
    blocks = _blocks(fmt, rows=70, cols=160).to(device)
    bias = torch.randn(70, dtype=dtype).to(device)
    for rows in (1, 5, 20):
        x = _inputs(rows, 160).to(dtype).to(device)
        got = gguf_matmul_triton(x, blocks, fmt, bias)
        want = gguf_matmul_reference(x.float(), blocks, fmt, bias.float())
        if dtype == torch.float32:
            _assert_rounding_close(got - bias, x, dequantize_blocks(blocks, fmt))
        else:  # bf16 activations and weights rounded to bf16 (the reference's semantics): 2^-8 relative
            bound = 2 ** -7 * (x.float().abs() @ dequantize_blocks(blocks, fmt).abs().T) + 1e-2
            assert ((got.float() - want).abs() <= bound).all()
        assert got.dtype == dtype and got.shape == (rows, 70)
    if device == "cuda":  # the dispatcher takes the kernel for any leading shape
        assert torch.equal(gguf_matmul(x[None], blocks, fmt, bias)[0], gguf_matmul_triton(x, blocks, fmt, bias))


def test_triton_launcher_refuses_bad_arguments():
    blocks = _blocks("q4_1")
    x = _inputs(2, 96)
    with pytest.raises(ValueError, match="60 bytes per row but x's 64 inputs need 40"):
        gguf_matmul_triton(x[:, :64].contiguous(), blocks, "q4_1")
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_matmul_triton(x[:, :50].contiguous(), blocks, "q4_1")
    with pytest.raises(ValueError, match="stride 1 along K"):
        gguf_matmul_triton(torch.randn(96, 2).T, blocks, "q4_1")
    with pytest.raises(ValueError, match="bias has 3 entries"):
        gguf_matmul_triton(x, blocks, "q4_1", torch.zeros(3))
    with pytest.raises(ValueError, match="unknown GGUF block format"):
        gguf_matmul_triton(x, blocks, "q5_0")


def test_a_failed_build_falls_back_with_one_warning(tmp_path):
    # In a fresh process: the source is replaced by one that does not compile; the layer must still multiply.
    script = textwrap.dedent(f"""
        import warnings, torch
        from workbench.models import gguf_cpu
        from workbench.models.gguf_linear import GGUFLinear, quantize_blocks
        broken = {str(tmp_path / "broken.cpp")!r}
        open(broken, "w").write("this is not C++")
        gguf_cpu.SOURCES = (gguf_cpu.Path(broken),)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer = GGUFLinear(quantize_blocks(torch.randn(8, 64), "q8_0"), "q8_0", 64)
            x = torch.randn(2, 64)
            y = layer(x)
        assert layer.path == "reference", layer.path
        assert torch.allclose(y, x @ layer.dequantized_weight().T, atol=1e-5)
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(messages) == 1 and "could not build the GGUF CPU extension" in messages[0], messages
        print("fallback ok")
    """)
    env = {**os.environ, "WORKBENCH_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "fallback ok" in proc.stdout, proc.stderr[-2000:]


@torch.inference_mode()
def test_decode_attention_writes_the_cache_and_matches_sdpa():
    assert gguf_cpu.extension().loaded
    heads, kv_heads, dim, layers, max_len = 6, 2, 32, 3, 200
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(layers, kv_heads, max_len, dim, generator=gen), torch.randn(layers, kv_heads, max_len,
                                                                                          dim, generator=gen)
    for pos in (0, 5, 130):
        qkv = torch.randn(1, (heads + 2 * kv_heads) * dim, generator=gen)
        out = torch.ops.workbench_gguf.decode_attention(qkv, keys, values, 1, pos, heads, kv_heads, dim, 0.17)
        k_new = qkv[0, heads * dim:(heads + kv_heads) * dim].view(kv_heads, dim)
        assert torch.equal(keys[1, :, pos], k_new)
        assert torch.equal(values[1, :, pos], qkv[0, (heads + kv_heads) * dim:].view(kv_heads, dim))
        want = causal_attention(qkv[:, :heads * dim].view(1, heads, dim), keys[1, :, :pos + 1].transpose(0, 1),
                                values[1, :, :pos + 1].transpose(0, 1), 0.17)
        torch.testing.assert_close(out.view(1, heads, dim), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="position 200 outside"):
        torch.ops.workbench_gguf.decode_attention(qkv, keys, values, 0, 200, heads, kv_heads, dim, 0.17)
    with pytest.raises(RuntimeError, match="layer 3 outside"):
        torch.ops.workbench_gguf.decode_attention(qkv, keys, values, 3, 0, heads, kv_heads, dim, 0.17)


@torch.inference_mode()
def test_row_invariant_mode_multiplies_every_row_alone():
    layer = GGUFLinear(_blocks("q4_1", rows=48, cols=96), "q4_1", 96)
    x = _inputs(20, 96)
    with row_invariant_products():
        together = layer(x)
    for r in range(x.shape[0]):
        assert torch.equal(together[r], layer(x[r:r + 1])[0])
