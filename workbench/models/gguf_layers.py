"""A decode step over GGUF blocks on the CPU: each decoder layer as two C++ calls around attention.

Why it exists: with the weights in 4-bit blocks, a batch-1 step of SmolLM2-135M on two cores reads ~96 MB of
weights (a few milliseconds), while the plain forward spends as much again on the ~25 small PyTorch operators
of each of the 30 layers (norms, rotary, slices, SiLU, residual adds), each costing microseconds of dispatch for
a few hundred numbers. `gguf_cpu_layer.cpp` does each half of a layer in one call (norm, product and rotary
before attention; output product, residual, norm, gate/up product, SiLU, down product and residual after it),
so a layer is two calls and the attention backend's own work. Attention stays the backend's: the KV cache, paged
or contiguous, is not this module's business.

Used by `LlamaModel.forward_with_taps` for float32 CPU batches of at most `FUSED_ROWS` rows when
every decoder layer is a `GGUFLinear` on the C++ product without biases (`eligible`), and never in batch-invariant
mode (a decode row must round as it would inside a prefill there). Larger batches take the plain forward, whose
products dequantize once per call and run a GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.models.attention import AttentionBackend
from workbench.models.gguf_linear import GGUFLinear
from workbench.models.row_invariant import products_are_row_invariant

_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# Rows up to which a forward takes the C++ layers. Past a few rows what the fused halves save (the ~25 operators'
# dispatch per layer, a fixed cost) is smaller than what their scalar SiLU costs (an exponential per element,
# where PyTorch's is vectorised): the plain forward, with the same C++ products, serves prefill chunks.
FUSED_ROWS = 6


def eligible(model) -> bool:
    """Whether every decoder layer can run as the two C++ halves (GGUF blocks, C++ product, no biases)."""
    for layer in model.layers:
        for name in _PROJECTIONS:
            linear = getattr(layer, name)
            if not isinstance(linear, GGUFLinear) or linear.path != "cpp" or linear.bias is not None:
                return False
    return True


def runs_here(model, x: torch.Tensor) -> bool:
    """Whether a forward over activations ``x`` (after the embedding) takes this path."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[0] > FUSED_ROWS:
        return False
    if getattr(model, "cpu_block_layers", False) is None:  # GGUF weights, not yet checked on this device
        model.cpu_block_layers, model._block_layer_lists = eligible(model), None
    return bool(getattr(model, "cpu_block_layers", False)) and not products_are_row_invariant()


def forward_layers(model, x: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                   taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`LlamaModel.forward_with_taps` after the embedding, through the C++ halves: (hidden, tapped)."""
    ops, eps, first = torch.ops.workbench_gguf, model.spec.rms_norm_eps, model.layers[0]
    t, heads, kv_heads, dim = x.shape[0], first.num_heads, first.num_kv_heads, first.head_dim
    q_size, kv_size = first.q_size, first.kv_size
    cos, sin = model.rope.cos_sin(positions, torch.float32)
    cos, sin = cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous()
    x = x.contiguous()
    # Module attributes cost a lookup through nn.Module each (~14 per layer): the per-layer lists are read instead.
    in_norm, qkv, qkv_kind, o, o_kind, post_norm, gate_up, gate_up_kind, down, down_kind = lists = _stacked(model)
    slot = attention.decode_slot() if hasattr(attention, "decode_slot") else None
    if slot is not None and not taps:  # one token over a contiguous cache: every layer in one call
        keys, values, position = slot
        x = ops.decode_layers(x, *lists, cos, sin, keys, values, position, heads, kv_heads, dim, eps,
                              model.attention_scale)
        return F.rms_norm(x, (x.shape[-1],), model.norm, eps), None
    tapped = []
    for i in range(len(in_norm)):
        step = ops.attn_in(x, in_norm[i], eps, qkv[i], qkv_kind[i], cos, sin, heads, kv_heads, dim)
        if slot is not None:  # one token over a contiguous cache, taps wanted: attention in C++ too
            keys, values, position = slot
            attn = ops.decode_attention(step, keys, values, i, position, heads, kv_heads, dim, model.attention_scale)
        else:
            q = step[:, :q_size].view(t, heads, dim)
            k = step[:, q_size: q_size + kv_size].view(t, kv_heads, dim)
            v = step[:, q_size + kv_size:].view(t, kv_heads, dim)
            attn = attention(i, q, k, v).reshape(t, q_size).contiguous()
        x = ops.attn_out(x, attn, o[i], o_kind[i], post_norm[i], eps, gate_up[i], gate_up_kind[i], down[i],
                         down_kind[i])
        if i in taps:
            tapped.append(F.rms_norm(x, (x.shape[-1],), None, eps))
    hidden = F.rms_norm(x, (x.shape[-1],), model.norm, eps)
    return hidden, torch.cat(tapped, dim=-1) if tapped else None


def _stacked(model) -> tuple:
    """Every layer's norms, blocks and block kinds as the per-layer lists ``decode_layers`` takes; built once per
    eligibility decision (`runs_here` rebuilds them when the model is moved or converted)."""
    if getattr(model, "_block_layer_lists", None) is None:
        lists = []
        for name in ("input_norm", *_PROJECTIONS[:2], "post_attention_norm", *_PROJECTIONS[2:]):
            if name.endswith("norm"):
                lists.append([getattr(layer, name) for layer in model.layers])
            else:
                lists.append([getattr(layer, name).blocks for layer in model.layers])
                lists.append([getattr(layer, name).kind for layer in model.layers])
        model._block_layer_lists = tuple(lists)
    return model._block_layer_lists
