"""The workbench's own Llama-architecture forward pass.

Written here rather than borrowed from transformers so that every step of inference is visible and
replaceable: tokens of many sequences are processed as one flat batch, and attention is delegated to a backend
(`workbench.models.attention`) that owns the KV cache. The same module serves the real SmolLM2 weights and
random weights built from any config in ``datasets/configs``.

Weights are stored fused where that saves kernel launches on the hot path: q, k and v projections form one
matrix, and so do the MLP's gate and up projections (`workbench.models.weights` maps Hugging Face names).

On CUDA in 16-bit the same layer runs with fused kernels (``LlamaModel.fused_layer_ops``): the residual add and
the norm after it in one launch, the rotation of q and k in place in the projection's output, SiLU and the
product with ``up`` in one launch (`workbench_kernels.rms_norm`, ``rotary``, ``silu_mul``). They round every
intermediate as the plain operations do; what they remove is launches, which is what a decode step of a small
model costs on a GPU. Float32 and the CPU keep the plain operations, which are compared with transformers,
except a few-row step over GGUF block weights, whose layers run as two C++ calls each (`gguf_layers`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelSpec
from workbench.models import gguf_layers
from workbench.models.attention import AttentionBackend
from workbench.models.cpu_linear import Linear
from workbench.models.rope import RotaryEmbedding, apply_rope
from workbench_kernels.rms_norm import rms_norm
from workbench_kernels.rotary import rotary
from workbench_kernels.silu_mul import silu_mul


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, d
        self.q_size, self.kv_size = spec.num_heads * d, spec.num_kv_heads * d
        self.eps = spec.rms_norm_eps
        self.input_norm = nn.Parameter(torch.ones(h))
        self.qkv_proj = Linear(h, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = Linear(self.q_size, h, bias=spec.o_bias)
        self.post_attention_norm = nn.Parameter(torch.ones(h))
        self.gate_up_proj = Linear(h, 2 * spec.intermediate_size, bias=False)
        self.down_proj = Linear(spec.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                attention: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        h = F.rms_norm(x, (x.shape[-1],), self.input_norm, self.eps)
        qkv = self.qkv_proj(h)
        # Rotate q and k in one call: they are adjacent columns of the fused projection.
        qk = apply_rope(qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        attn = attention(layer, q, k, v)
        x = x + self.o_proj(attn.reshape(t, self.q_size))
        h = F.rms_norm(x, (x.shape[-1],), self.post_attention_norm, self.eps)
        gate, up = self.gate_up_proj(h).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)

    def forward_fused(self, delta: torch.Tensor, residual: torch.Tensor | None, tables: tuple[torch.Tensor, ...],
                      layer: int, attention: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` with the fused kernels, in the residual-stream form they need: takes the previous layer's
        output ``delta`` not yet added to ``residual`` (None for the first layer, whose input is ``delta``) and
        returns this layer's (delta, residual); the residual stream after the layer is their sum."""
        t = delta.shape[0]
        if residual is None:
            residual, h = delta, rms_norm(delta, self.input_norm, self.eps)
        else:
            h = rms_norm(delta, self.input_norm, self.eps, residual)  # residual += delta, in place
        qkv = self.qkv_proj(h)
        positions, cos, sin = tables
        rotary(qkv, positions, cos, sin, num_heads=self.num_heads + self.num_kv_heads, head_dim=self.head_dim)
        q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size: self.q_size + self.kv_size].view(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        attn = attention(layer, q, k, v)
        h = rms_norm(self.o_proj(attn.reshape(t, self.q_size)), self.post_attention_norm, self.eps, residual)
        return self.down_proj(silu_mul(self.gate_up_proj(h))), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head over a flat batch of tokens."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.ones(spec.hidden_size))
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            del self.lm_head.weight
            self.lm_head.weight = self.embed_tokens.weight  # tied: one tensor, two uses
        self.rope = RotaryEmbedding(spec.head_dim, spec.rope_theta, min(spec.max_context, 4096),
                                    scaling=spec.rope_scaling)
        self.attention_scale = spec.head_dim ** -0.5
        # The fused kernels on CUDA in 16-bit (see the module docstring); False runs the plain operations there
        # too, which is how a benchmark measures what fusing saves.
        self.fused_layer_ops = True

    # nn.Module.to() knows neither the rope tables (plain float32 tensors on purpose: they are not weights)
    # nor the packed CPU weights (derived data), so moving the model refreshes both.
    def _apply(self, fn, recurse=True):  # type: ignore[override]
        result = super()._apply(fn, recurse)
        if self.spec.tie_word_embeddings:  # conversions may hand each module its own copy: tie again
            self.lm_head.weight = self.embed_tokens.weight
        self.rope.to(self.embed_tokens.weight.device)
        if any(m.packed is not None for m in self.modules() if isinstance(m, Linear)):
            self.prepare()
        if hasattr(self, "cpu_block_layers"):  # GGUF blocks: whether the C++ layer path applies is decided anew
            self.cpu_block_layers = None
        return result

    def prepare(self, *, pack: bool = True) -> LlamaModel:
        """Ready the weights for inference after loading or changing them: on the CPU, pack them for oneDNN
        (`workbench.models.cpu_linear`); elsewhere, or with ``pack=False``, use plain ``F.linear``.

        Both compute the same products in float32 with different summation orders; ``pack=False`` is the
        plainest form of the forward pass, the one compared with transformers to 1e-4."""
        pack = pack and self.device.type == "cpu"
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack() if pack else module.unpack()
        return self

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] int64 (flat over sequences). Returns final hidden states [T, hidden]."""
        return self.forward_with_taps(input_ids, positions, attention, ())[0]

    def forward_with_taps(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                          taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward`, also returning the residual stream after each layer in ``taps``, RMS-normalised (no gain)
        and concatenated per token ([T, len(taps) * hidden]; None without taps).

        An EAGLE-3-style draft reads these: the final hidden state is tuned to name the next token and says
        little else, while low and middle layers still carry the context a draft needs to look further."""
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must "
                             "be equal 1-D shapes (one row per token)")
        if any(not 0 <= t < self.spec.num_layers for t in taps) or list(taps) != sorted(set(taps)):
            raise ValueError(f"taps {taps} must name distinct layers 0..{self.spec.num_layers - 1} in order")
        x = self.embed_tokens(input_ids)
        if self.runs_fused(x):
            return self._forward_fused(x, positions, attention, taps)
        if gguf_layers.runs_here(self, x):  # GGUF blocks, a few rows, on the CPU: two C++ calls per layer
            return gguf_layers.forward_layers(self, x, positions, attention, taps)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        tapped = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attention)
            if i in taps:
                tapped.append(F.rms_norm(x, (x.shape[-1],), None, self.spec.rms_norm_eps))
        hidden = F.rms_norm(x, (x.shape[-1],), self.norm, self.spec.rms_norm_eps)
        return hidden, torch.cat(tapped, dim=-1) if tapped else None

    def runs_fused(self, x: torch.Tensor) -> bool:
        """Whether a forward over activations like ``x`` takes the fused kernels."""
        return self.fused_layer_ops and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)

    def _forward_fused(self, x: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                       taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        eps = self.spec.rms_norm_eps
        tables = (positions, *self.rope.tables(positions))
        delta, residual, tapped = x, None, []
        for i, layer in enumerate(self.layers):
            delta, residual = layer.forward_fused(delta, residual, tables, i, attention)
            if i in taps:
                tapped.append(F.rms_norm(residual + delta, (x.shape[-1],), None, eps))
        hidden = rms_norm(delta, self.norm, eps, residual)
        return hidden, torch.cat(tapped, dim=-1) if tapped else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in float32 for the given hidden rows (only the rows that need a next token)."""
        return self.lm_head(hidden).float()
