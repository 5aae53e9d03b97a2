"""Static fp8 scales for the KV cache, per layer and KV head, measured on real text.

e4m3 keeps about 3 significant bits whatever the magnitude, so its scale only has to keep values inside the
format's range (|x| <= 448 x scale) without pushing small ones into subnormals. A static scale per (layer, KV
head) does that at no per-token cost and never forces stored blocks to be re-quantized, which per-token or
running ("dynamic") scales would. Per head rather than per tensor costs nothing and follows each head's own
range; for SmolLM2-135M the heads of a layer are close (``head_amax_spread``: the largest head's max |K| is
1.24x the smallest's, |V| 1.31x, medians over layers), so a per-tensor scale would do almost as well here.
The calibration run records each head's largest |K| and |V| over ``datasets/eval/calibration.txt`` and leaves
``FP8_HEADROOM`` of room above it for values the text did not show.
"""

from __future__ import annotations

import torch

from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench.paths import DATASETS_DIR
from workbench_kernels.kv_quant import FP8_MAX

# Values up to twice the calibration maximum still fit before clamping; costs 1 bit of the exponent's range.
FP8_HEADROOM = 2.0


class _AmaxRecorder:
    """Attention backend that records per-head max |k| and |v| of every layer, then attends without a cache."""

    def __init__(self, inner: NoCacheAttention, num_layers: int, num_kv_heads: int):
        self.inner = inner
        self.k_amax = torch.zeros(num_layers, num_kv_heads)
        self.v_amax = torch.zeros(num_layers, num_kv_heads)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k_amax[layer] = torch.maximum(self.k_amax[layer], k.abs().amax(dim=(0, 2)).float().cpu())
        self.v_amax[layer] = torch.maximum(self.v_amax[layer], v.abs().amax(dim=(0, 2)).float().cpu())
        return self.inner(layer, q, k, v)


@torch.inference_mode()
def kv_amax(model: LlamaModel, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest |K| and |V| per (layer, KV head) over a forward on ``token_ids``: two [layers, kv_heads] tensors."""
    if not token_ids:
        raise ValueError("calibration needs at least one token")
    ids = torch.tensor(token_ids, device=model.device)
    spec = model.spec
    recorder = _AmaxRecorder(NoCacheAttention([len(token_ids)], model.attention_scale), spec.num_layers,
                             spec.num_kv_heads)
    model(ids, torch.arange(len(token_ids), device=model.device), recorder)
    return recorder.k_amax, recorder.v_amax


def fp8_scales(model: LlamaModel, token_ids: list[int], headroom: float = FP8_HEADROOM
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer ``[kv_heads]`` float32 key and value scales: amax x headroom / 448."""
    k_amax, v_amax = kv_amax(model, token_ids)

    def to_scales(amax: torch.Tensor) -> list[torch.Tensor]:
        scales = (amax * headroom / FP8_MAX).clamp_min(2.0**-14)
        return [row.to(model.device) for row in scales]

    return to_scales(k_amax), to_scales(v_amax)


def head_amax_spread(model: LlamaModel, token_ids: list[int]) -> dict[str, float]:
    """How unequal the heads of a layer are: the median over layers of max/min head amax, for K and V."""
    k_amax, v_amax = kv_amax(model, token_ids)
    ratio = lambda a: float((a.amax(dim=1) / a.amin(dim=1).clamp_min(1e-6)).median())  # noqa: E731
    return {"key_max_over_min": ratio(k_amax), "value_max_over_min": ratio(v_amax)}


def calibration_ids(model: LlamaModel, tokenizer=None) -> list[int]:
    """Tokens to calibrate on: ``datasets/eval/calibration.txt`` (not used by any quality measurement), or
    seeded random ids for a model without a tokenizer (random-weight models, where only shapes matter)."""
    if tokenizer is None:
        gen = torch.Generator().manual_seed(0)
        return torch.randint(0, model.spec.vocab_size, (256,), generator=gen).tolist()
    text = (DATASETS_DIR / "eval" / "calibration.txt").read_text()
    return tokenizer(text, add_special_tokens=False)["input_ids"]
