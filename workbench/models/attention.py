"""The seam between the model and the KV cache.

The model computes q, k and v for the tokens of one forward pass and hands them to an *attention backend*;
the backend decides where those keys and values live (nowhere, a contiguous buffer, paged blocks) and returns
the attention output. Swapping the cache therefore never touches the model code.

Tokens of all sequences in a forward are laid out flat, one row per token ([T, heads, head_dim]); the backend
knows from its own metadata which rows belong to which sequence and where each sits in its sequence.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] (already rotated).

        Returns [T, num_heads, head_dim]: each query attends to every earlier key of its own sequence."""
        ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of the last ``n`` positions of one sequence over all ``m >= n`` of its keys.

    q: [n, H, D]; k, v: [m, Hkv, D] with H a multiple of Hkv (grouped-query attention). Query i sits at
    position ``m - n + i`` and sees keys ``0 .. m - n + i``. Returns [n, H, D].
    """
    return causal_attention_heads_first(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                        scale).transpose(0, 1)


def causal_attention_heads_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """`causal_attention` for head-major tensors: q [H, n, D]; k, v [Hkv, m, D]. Returns [H, n, D]."""
    n, m = q.shape[1], k.shape[1]
    gqa = q.shape[0] != k.shape[0]
    # SDPA only takes its fused CPU kernel for 4-D inputs; 3-D ones fall to the unfused math path, which
    # measured 6x slower for a 1134-token causal prefill here (81 ms vs 14 ms per layer).
    q, k, v = q[None], k[None], v[None]
    if n == 1:  # one query sees every key: no mask needed
        out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    elif n == m:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:  # the queries are the tail of the sequence: the causal diagonal is shifted by m - n
        mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(diagonal=m - n)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0]


class NoCacheAttention:
    """Recompute-everything attention: keys and values exist only for the tokens of this forward.

    The chapter-2 baseline: every decode step feeds the whole sequence again. ``seq_lens`` splits the flat
    batch into sequences, each attending causally to itself only.
    """

    def __init__(self, seq_lens: list[int], scale: float):
        self.seq_lens = seq_lens
        self.scale = scale

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if len(self.seq_lens) == 1:
            return causal_attention(q, k, v, self.scale)
        outs, start = [], 0
        for n in self.seq_lens:
            end = start + n
            outs.append(causal_attention(q[start:end], k[start:end], v[start:end], self.scale))
            start = end
        return torch.cat(outs)
