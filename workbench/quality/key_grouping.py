"""Should int4 keys be quantized per token or per channel (as KIVI does)? Measured, not assumed.

KIVI observed that key caches have a few outlier *channels* whose magnitude is large for every token, so
grouping a key's values along the token axis (one scale per channel over a run of tokens) wastes fewer levels
than grouping along the channel axis (one scale per token over 32 channels). Values have no such structure and
stay per token. This study quantizes keys both ways on real text (values per token in both cases), runs the
model with the fake-quantized K/V, and compares next-token distributions with the unquantized run: whichever
grouping loses less is the one worth building into the paged cache.

Per-channel grouping needs a block of tokens before it can quantize, so in a paged cache it would quantize a
block when it fills and keep the newest tokens in full precision meanwhile (KIVI's residual): the study uses
groups of ``KIVI_TOKEN_GROUP`` tokens with the trailing partial group left unquantized, as that design would.
"""

from __future__ import annotations

import torch

from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench.quality.teacher_forcing import compare_logits
from workbench_kernels.kv_quant import INT4_GROUP, INT4_LEVELS

KIVI_TOKEN_GROUP = 32


def _fake_int4(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Asymmetric 4-bit round trip with groups of 32 along ``dim`` of x [tokens, heads, head_dim]."""
    moved = x.float().movedim(dim, -1)
    size = moved.shape[-1]
    full = size - size % INT4_GROUP
    groups = moved[..., :full].unflatten(-1, (-1, INT4_GROUP))
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((hi - lo) / INT4_LEVELS).clamp_min(2.0**-14)
    rounded = ((groups - lo) / scale).round().clamp(0, INT4_LEVELS) * scale + lo
    out = torch.cat([rounded.flatten(-2), moved[..., full:]], dim=-1)  # the partial group stays exact
    return out.movedim(-1, dim).to(x.dtype)


class _FakeQuantAttention:
    def __init__(self, n: int, scale: float, key_axis: int | None):
        self.inner, self.key_axis = NoCacheAttention([n], scale), key_axis

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.key_axis is not None:
            k = _fake_int4(k, self.key_axis)
            v = _fake_int4(v, 2)
        return self.inner(layer, q, k, v)


@torch.inference_mode()
def key_grouping_study(model: LlamaModel, token_ids: list[int]) -> dict[str, dict[str, float]]:
    """KL / top-1 / perplexity vs unquantized for int4 keys grouped per token and per channel."""
    ids = torch.tensor(token_ids, device=model.device)
    positions = torch.arange(len(token_ids), device=model.device)

    def run(key_axis: int | None) -> torch.Tensor:
        hidden = model(ids, positions, _FakeQuantAttention(len(token_ids), model.attention_scale, key_axis))
        return model.compute_logits(hidden)

    reference = run(None)
    targets = ids[1:]
    return {name: compare_logits(reference[:-1], run(axis)[:-1], targets)
            for name, axis in (("per_token_groups", 2), ("per_channel_groups", 0))}
