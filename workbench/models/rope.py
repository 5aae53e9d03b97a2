"""Rotary position embeddings (RoPE), as Llama applies them.

Kept apart from the model because every attention path (no cache, contiguous cache, paged cache, speculative
verification) must rotate keys by their *absolute* position: the cos/sin table is indexed by positions the
caller supplies, never by a token's index inside the current batch.

Llama 3.1 stretches its 8K-trained RoPE to 128K by rescaling frequencies (``rope_type: llama3``): wavelengths
longer than ``original / low_freq_factor`` are divided by ``factor``, those shorter than ``original /
high_freq_factor`` are kept, and the band between is interpolated smoothly (Meta's Llama 3.1 reference code;
transformers' ``_compute_llama3_parameters`` computes the same).
"""

from __future__ import annotations

import math

import torch


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_positions: int) -> torch.Tensor:
    """Llama 3.1's rescaled inverse frequencies (see the module docstring)."""
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original_max_positions / low_freq_factor, original_max_positions / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding:
    """cos/sin tables for positions ``0 .. max_positions-1``, computed once in float32 and grown on demand."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device | str = "cpu",
                 scaling: tuple[float, float, float, int] | None = None):
        """``scaling``: Llama 3.1's (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
        self.head_dim = head_dim
        self.theta = theta
        # Same formula as the reference implementation, so fp32 logits agree to rounding.
        # Explicit CPU devices: models are built under a meta-device context, which must not catch these tables.
        steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
        self.inv_freq = 1.0 / (theta ** (steps / head_dim))
        if scaling is not None:
            self.inv_freq = llama3_inv_freq(self.inv_freq, *scaling)
        self._cos = self._sin = torch.empty(0, device="cpu")
        self._build(max_positions, torch.device(device))

    def _build(self, n: int, device: torch.device) -> None:
        positions = torch.arange(n, dtype=torch.float32, device="cpu")
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = emb.cos().to(device), emb.sin().to(device)

    def to(self, device: torch.device | str) -> RotaryEmbedding:
        self._cos, self._sin = self._cos.to(device), self._sin.to(device)
        return self

    def reserve(self, max_positions: int) -> None:
        """Make the tables cover ``0 .. max_positions-1`` now (a captured CUDA graph cannot grow them later)."""
        if max_positions > self._cos.shape[0]:
            self._build(max_positions, self._cos.device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole float32 cos and sin tables ([positions, head_dim]), grown first to cover ``positions`` (the
        fused rotary kernel looks its rows up itself; see `cos_sin` on growing while a graph is captured)."""
        self._grow_for(positions)
        return self._cos, self._sin

    def _grow_for(self, positions: torch.Tensor) -> None:
        capturing = positions.is_cuda and torch.cuda.is_current_stream_capturing()
        if positions.numel() and not capturing and int(positions.max()) >= self._cos.shape[0]:
            self._build(max(int(positions.max()) + 1, 2 * self._cos.shape[0]), self._cos.device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin rows for ``positions`` ([T] int64), shaped [T, 1, head_dim] to broadcast over heads.

        Grows the tables when a position passes them, which reads the largest position back to the host; while
        a CUDA graph is being captured that read is not allowed, and the graph's owner has called `reserve`."""
        self._grow_for(positions)
        cos = self._cos.index_select(0, positions).unsqueeze(1)
        sin = self._sin.index_select(0, positions).unsqueeze(1)
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ([T, heads, head_dim]) by the "rotate half" convention Hugging Face Llama weights use."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
