"""The fused layer kernels (add + RMSNorm, rotary, SiLU-and-multiply) against their PyTorch references.

Under the interpreter on the CPU, or on CUDA. In 16-bit the kernels round every intermediate as the unfused
PyTorch operations do, so rotary and silu_mul must match to the last bit or one rounding step; the norm sums
its row in another order, so it is held to one unit in the last place of the output dtype.
"""

from __future__ import annotations

import pytest
import torch

from workbench_kernels.rms_norm import rms_norm, rms_norm_reference, rms_norm_triton
from workbench_kernels.rotary import rotary_reference, rotary_triton
from workbench_kernels.silu_mul import silu_mul_reference, silu_mul_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# one rounding step of each dtype, relative (the kernels' float32 sums differ from PyTorch's in order only)
ULP = {torch.float32: 2e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def _rounds_like_a_gpu(device: str, dtype: torch.dtype) -> bool:
    """Triton's interpreter (3.9 here) truncates float32 to bfloat16 instead of rounding to nearest even (checked:
    484 of 1,024 random values differ from torch's conversion), so bit-exactness in bfloat16 is a GPU check."""
    return device == "cuda" or dtype != torch.bfloat16


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, ulps: float = 1.0,
           scale: float = 1e-3) -> None:
    """Within ``ulps`` rounding steps of ``dtype`` of each value (of ``scale``, for values that cancelled)."""
    got, expected = got.cpu().float(), expected.cpu().float()
    bound = ulps * ULP[dtype] * expected.abs().clamp_min(scale) + 1e-6
    bad = (got - expected).abs() > bound
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} differ; max abs error "
                           f"{(got - expected).abs().max():.3g}; first at {bad.nonzero()[0].tolist()}")


def _randn(*shape, dtype, device, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576, 100])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_reference_and_updates_the_residual(device, dtype, hidden, with_residual):
    x = _randn(7, hidden, dtype=dtype, device=device)
    weight = _randn(hidden, dtype=dtype, device=device, seed=1) * 0.1 + 1
    residual = _randn(7, hidden, dtype=dtype, device=device, seed=2) if with_residual else None
    expected_residual = residual.cpu().clone() if with_residual else None
    expected = rms_norm_reference(x.cpu(), weight.cpu(), 1e-5, expected_residual)
    got = rms_norm_triton(x, weight, 1e-5, residual)
    exact = _rounds_like_a_gpu(device, dtype)
    _close(got, expected, dtype, ulps=1.0 if exact else 3.0)
    if with_residual and exact:  # the add is one rounding of the exact sum: bit-for-bit PyTorch's
        assert torch.equal(residual.cpu(), expected_residual)
    elif with_residual:
        _close(residual, expected_residual, dtype)


def test_rms_norm_reads_rows_with_a_stride_and_refuses_bad_input():
    full = _randn(5, 128, dtype=torch.float32, device="cpu")
    x = full[:, :64]  # every other 64 columns: a row stride of 128
    weight = torch.ones(64)
    _close(rms_norm_triton(x, weight, 1e-6), rms_norm_reference(x.contiguous(), weight, 1e-6), torch.float32)
    with pytest.raises(ValueError, match="weight has 32 entries"):
        rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="residual has shape"):
        rms_norm(x, weight, 1e-6, residual=torch.zeros(5, 32))


def _tables(max_pos: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 128), (5, 5, 80)])
def test_rotary_rotates_q_and_k_in_place_like_the_reference(device, dtype, heads, kv_heads, head_dim):
    """Against the unfused operations on the same device; the kernel rounds once where they round three times, so
    they agree to two rounding steps of the values' scale (the sum of two products may cancel)."""
    width = (heads + 2 * kv_heads) * head_dim
    qkv = _randn(11, width, dtype=dtype, device=device) * 3
    positions = torch.tensor([0, 1, 2, 500, 7, 7, 1023, 64, 3, 900, 12], device=device)
    cos, sin = _tables(1024, head_dim, device)
    expected = qkv.clone()
    rotary_reference(expected, positions, cos, sin, num_heads=heads + kv_heads, head_dim=head_dim)
    got = qkv.clone()
    rotary_triton(got, positions, cos, sin, num_heads=heads + kv_heads, head_dim=head_dim)
    rotated = (heads + kv_heads) * head_dim
    assert torch.equal(got.cpu()[:, rotated:], qkv.cpu()[:, rotated:]), "v was touched"
    assert torch.equal(got.cpu()[0], expected.cpu()[0]), "position 0 (cos 1, sin 0) must be the identity"
    ulps = 2 if _rounds_like_a_gpu(device, dtype) else 4
    _close(got[:, :rotated], expected[:, :rotated], dtype, ulps=ulps, scale=float(qkv.abs().max()) / 4)


def test_rotary_refuses_a_table_of_the_wrong_width():
    qkv = torch.zeros(2, 3 * 64)
    cos, sin = _tables(16, 32, "cpu")
    with pytest.raises(ValueError, match="head_dim=64"):
        rotary_reference(qkv, torch.zeros(2, dtype=torch.int64), cos, sin, num_heads=2, head_dim=64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 100])
def test_silu_mul_matches_the_reference(device, dtype, width):
    gate_up = _randn(6, 2 * width, dtype=dtype, device=device) * 4
    expected = silu_mul_reference(gate_up.cpu())
    got = silu_mul_triton(gate_up)
    # exp differs from PyTorch's in the last float32 bit now and then, which can move silu's rounding by a step
    # (seen on an H200 in float16: 1 of 9,216 values); the product then rounds again
    _close(got, expected, dtype, ulps=2.0 if _rounds_like_a_gpu(device, dtype) else 3.0)
    with pytest.raises(ValueError, match="must be even"):
        silu_mul_reference(torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_layer_path_gives_the_plain_forward_bit_for_bit(dtype, monkeypatch):
    """The residual-stream form of the layer (`DecoderLayer.forward_fused`) run with the kernels' references on
    the CPU: the same operations in another arrangement, so the same bits; taps included."""
    import workbench
    from workbench.models.attention import NoCacheAttention

    spec = workbench.model_spec("smollm2-135m").replace(num_layers=3, hidden_size=96, intermediate_size=160,
                                                        num_heads=3, num_kv_heads=1, vocab_size=300)
    model = workbench.random_model(spec, dtype=dtype, device="cpu", seed=1, std=0.1).prepare(pack=False)
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(20)
    attention = NoCacheAttention([12, 8], model.attention_scale)
    plain = model.forward_with_taps(ids, positions, attention, (0, 2))
    monkeypatch.setattr(model, "runs_fused", lambda x: True)
    fused = model.forward_with_taps(ids, positions, attention, (0, 2))
    assert torch.equal(plain[0], fused[0]) and torch.equal(plain[1], fused[1])
