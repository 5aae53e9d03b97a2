"""Why activations are harder to quantize than weights, measured on one linear layer of the real model.

Why it exists: the book says activations "have more dynamic range" than weights, and keys and values are
activations. Here the real inputs of a chosen layer (captured with a forward hook while the model reads the
held-out text) go through the same int8 weights four ways, and the output is compared with the float layer's:

    int8 weights only          the engine's format; activations exact
    + 7-bit activations/tensor one scale for all tokens, as fbgemm's dynamic quantization picks it
    + 7-bit activations/token  one scale per token
    + split rows (the engine)  each token as two exact integer rows (`workbench.models.int8_linear.split_rows`)

The error is relative: the norm of the output difference over the norm of the float output, over all tokens.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.models.attention import NoCacheAttention
from workbench.models.int8_linear import COARSE_LEVELS, FINE_LEVELS, split_rows
from workbench_kernels.int8_matmul import int8_matmul_reference, quantize_per_channel

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
LEVELS = 127  # x86 fbgemm rounds activations to 7 bits (reduce_range)
VARIANTS = ("int8 weights only", "+ 7-bit activations, per tensor", "+ 7-bit activations, per token",
            "+ split rows (the engine's CPU path)")


@torch.inference_mode()
def capture_inputs(model, token_ids: list[int], layer: int, projection: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float input rows [T, K] that ``layers[layer].<projection>`` sees on ``token_ids``, and its weight."""
    if projection not in PROJECTIONS:
        raise ValueError(f"projection {projection!r} must be one of {list(PROJECTIONS)}")
    if not 0 <= layer < model.spec.num_layers:
        raise ValueError(f"layer {layer} must be in 0..{model.spec.num_layers - 1}")
    module = getattr(model.layers[layer], projection)
    if not hasattr(module, "weight"):
        raise ValueError("capture from a float model (weights 'auto'): its layers still hold float weights")
    captured = []
    hook = module.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach().float()))
    try:
        ids = torch.tensor(token_ids, device=model.device)
        model(ids, torch.arange(len(token_ids), device=model.device),
              NoCacheAttention([len(token_ids)], model.attention_scale))
    finally:
        hook.remove()
    return captured[0].cpu(), module.weight.detach().float().cpu()


def _fake_quant(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    """Asymmetric 7-bit round trip with the range stretched to include 0 (fbgemm's choice of parameters)."""
    dims = {"dim": -1, "keepdim": True} if per_token else {}
    lo, hi = x.amin(**dims).clamp(max=0.0), x.amax(**dims).clamp(min=0.0)
    scale = ((hi - lo) / LEVELS).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    return (torch.clamp(torch.round(x / scale) + zero, 0, LEVELS) - zero) * scale


def _split(x: torch.Tensor) -> torch.Tensor:
    coarse, fine, amax = split_rows(x.clone())
    return amax / COARSE_LEVELS * (coarse + fine / FINE_LEVELS)


def rounding_errors(x: torch.Tensor, weight: torch.Tensor) -> pd.DataFrame:
    """Relative output error of each variant (`VARIANTS`) against the float layer on inputs x."""
    exact = x @ weight.T
    q, scale = quantize_per_channel(weight)
    inputs = (x, _fake_quant(x, False), _fake_quant(x, True), _split(x))
    rows = []
    for name, xi in zip(VARIANTS, inputs, strict=True):
        out = int8_matmul_reference(xi, q, scale)
        rows.append({"variant": name, "relative_error": float((out - exact).norm() / exact.norm()),
                     "input_error": float((xi - x).norm() / x.norm())})
    return pd.DataFrame(rows).set_index("variant")


def spread(x: torch.Tensor, weight: torch.Tensor) -> dict[str, float]:
    """How uneven the activations are, next to the weights: per-token and per-channel max |x| against the median,
    and the same for the weight's output channels."""
    tokens, channels = x.abs().amax(dim=1), x.abs().amax(dim=0)
    rows = weight.abs().amax(dim=1)
    return {"token_max_over_median": float(tokens.max() / tokens.median()),
            "first_token_over_median": float(tokens[0] / tokens.median()),
            "channel_max_over_median": float(channels.max() / channels.median()),
            "weight_row_max_over_median": float(rows.max() / rows.median())}
