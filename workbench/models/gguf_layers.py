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
    spec, ops = model.spec, torch.ops.workbench_gguf
    t, eps = x.shape[0], spec.rms_norm_eps
    cos, sin = model.rope.cos_sin(positions, torch.float32)
    cos, sin = cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous()
    tapped = []
    x = x.contiguous()
    slot = attention.decode_slot() if hasattr(attention, "decode_slot") else None
    if slot is not None and not taps:  # one token over a contiguous cache: every layer in one call
        keys, values, position = slot
        layer = model.layers[0]
        x = ops.decode_layers(x, *_stacked(model), cos, sin, keys, values, position, layer.num_heads,
                              layer.num_kv_heads, layer.head_dim, eps, model.attention_scale)
        return F.rms_norm(x, (x.shape[-1],), model.norm, eps), None
    for i, layer in enumerate(model.layers):
        if slot is not None:  # one token over a contiguous cache: three calls, attention among them
            x = _decode_layer(model, layer, i, x, cos, sin, slot)
            if i in taps:
                tapped.append(F.rms_norm(x, (x.shape[-1],), None, eps))
            continue
        qkv = ops.attn_in(x, layer.input_norm, eps, layer.qkv_proj.blocks, layer.qkv_proj.kind, cos, sin,
                          layer.num_heads, layer.num_kv_heads, layer.head_dim)
        q = qkv[:, : layer.q_size].view(t, layer.num_heads, layer.head_dim)
        k = qkv[:, layer.q_size: layer.q_size + layer.kv_size].view(t, layer.num_kv_heads, layer.head_dim)
        v = qkv[:, layer.q_size + layer.kv_size:].view(t, layer.num_kv_heads, layer.head_dim)
        attn = attention(i, q, k, v).reshape(t, layer.q_size).contiguous()
        x = ops.attn_out(x, attn, layer.o_proj.blocks, layer.o_proj.kind, layer.post_attention_norm, eps,
                         layer.gate_up_proj.blocks, layer.gate_up_proj.kind, layer.down_proj.blocks,
                         layer.down_proj.kind)
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


def _decode_layer(model, layer, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  slot: tuple[torch.Tensor, torch.Tensor, int]) -> torch.Tensor:
    """One layer for one token whose keys and values live in a contiguous buffer (``slot``: keys, values,
    position), attention written and computed in C++ too."""
    ops, eps = torch.ops.workbench_gguf, model.spec.rms_norm_eps
    keys, values, position = slot
    qkv = ops.attn_in(x, layer.input_norm, eps, layer.qkv_proj.blocks, layer.qkv_proj.kind, cos, sin,
                      layer.num_heads, layer.num_kv_heads, layer.head_dim)
    attn = ops.decode_attention(qkv, keys, values, index, position, layer.num_heads, layer.num_kv_heads,
                                layer.head_dim, model.attention_scale)
    return ops.attn_out(x, attn, layer.o_proj.blocks, layer.o_proj.kind, layer.post_attention_norm, eps,
                        layer.gate_up_proj.blocks, layer.gate_up_proj.kind, layer.down_proj.blocks,
                        layer.down_proj.kind)
