"""GGUF block weights for the engine's linear layers: the shipped Q4_1 file kept as it is, and Q8_0.

Why it exists: the real model ships as a GGUF file of Q4_1 blocks (decoder) and Q8_0 blocks (the embedding, which
is also the LM head). Dequantized to float32 at set-up it is 540 MB that every decode step reads; kept as blocks
it is 92 MB. Two weight formats (`WEIGHT_FORMATS` in `workbench.models.int8_linear` lists them with the others):

    q4_1   the file as shipped: decoder linears in its Q4_1 blocks (5 bits per weight), the LM head in its Q8_0
           blocks (8.5 bits). Every weight is the float32 number the dequantized checkpoint holds, so logits
           equal the float32 model's to float32 rounding: the same numbers, multiplied in another order.
    q8_0   every linear layer in Q8_0 blocks: the head as shipped, the decoder quantized from the checkpoint by
           the gguf package's Q8_0 quantizer (what llama.cpp's ``llama-quantize`` computes), so it is close to
           the float model, not equal to it.

Random-weight models get both formats by the same quantizers from their float weights (Q4_1 decoder and Q8_0
head for ``q4_1``). Embedding lookups and norm gains stay in the model's dtype, as in the int8 formats, and a tied
head keeps referring to the float table as ``lm_head.weight``.

The product by device: CUDA runs the Triton kernel (`workbench_kernels.gguf_matmul`); the CPU runs the
C++ extension, torch's packed int4 kernel or the reference, whichever `workbench.models.gguf_cpu.cpu_product`
picks. The C++ product serves prefills too: converting each block once per 4 rows in registers, it ran faster
than dequantizing the layer and calling a float GEMM at every row count measured (`DIRECT_ROWS`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workbench.models import gguf_cpu
from workbench.models.row_invariant import products_are_row_invariant
from workbench_kernels.gguf_matmul import FORMATS, dequantize_blocks, gguf_matmul, row_bytes

GGUF_WEIGHT_FORMATS = ("q4_1", "q8_0")
# The block format of the decoder's linear layers and of the LM head in each weight format.
LAYOUT = {"q4_1": ("q4_1", "q8_0"), "q8_0": ("q8_0", "q8_0")}
# Rows up to which torch's int4 kernel (the fallback) multiplies the blocks; above, dequantize once and run a float
# GEMM. The C++ product needs no such limit: it beat dequantize + GEMM at every row count measured, 4 to 2,048
# (`benchmarks/bench_gguf_cpu.py`; one thread, AVX-512 host: 1.5 against 2.0-10 ms of CPU per row over the 120
# decoder products), since each block is converted once per 4 rows and multiplied at near the FMA peak.
DIRECT_ROWS = 6


def quantize_blocks(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight`` [N, K] as blocks of ``fmt`` by the gguf package's quantizer (llama.cpp's reference rounding)."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType(FORMATS[fmt][0])
    w = weight.detach().to("cpu", torch.float32).numpy()
    return torch.from_numpy(np.ascontiguousarray(quants.quantize(w, qtype)))


class GGUFLinear(nn.Module):
    """A linear layer whose weight is GGUF blocks (``blocks`` [out_features, in_features / 32 * bytes] uint8).

    ``path`` names the product a call on the blocks' device uses: ``triton``, ``cpp``, ``int4pack`` or
    ``reference``. A tied LM head may also hold the float ``weight`` (the embedding's table): it is not used
    by the product."""

    def __init__(self, blocks: torch.Tensor, fmt: str, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        if blocks.dim() != 2 or blocks.dtype != torch.uint8 or blocks.shape[1] != row_bytes(fmt, in_features):
            raise ValueError(f"blocks {tuple(blocks.shape)} {blocks.dtype} are not {fmt} rows of {in_features} "
                             f"weights ([N, {row_bytes(fmt, in_features)}] uint8)")
        self.fmt, self.kind = fmt, FORMATS[fmt][0]
        self.out_features, self.in_features = blocks.shape[0], in_features
        self.register_buffer("blocks", blocks.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self._int4pack = None

    @classmethod
    def from_float(cls, linear: nn.Linear, fmt: str) -> GGUFLinear:
        blocks = quantize_blocks(linear.weight, fmt).to(linear.weight.device)
        return cls(blocks, fmt, linear.in_features, linear.bias)

    @property
    def path(self) -> str:
        if self.blocks.device.type == "cuda":
            return "triton"
        if self.blocks.device.type != "cpu":
            return "reference"
        product = gguf_cpu.cpu_product(self.kind)
        return "reference" if product == "int4pack" and self._int4pack is None else product

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, path={self.path}"

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_blocks(self.blocks, self.fmt).to(dtype)

    def pack(self) -> None:
        """Derive what the CPU product needs beyond the blocks: torch's int4 packing when that is the product."""
        self._int4pack = None
        if self.blocks.device.type == "cpu" and gguf_cpu.cpu_product(self.kind) == "int4pack":
            from workbench_kernels.gguf_matmul import block_fields

            d, m, codes = block_fields(self.blocks, self.fmt)
            self._int4pack = gguf_cpu.int4pack_weights(codes, d, m)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        result = super()._apply(fn, recurse)
        self.pack()  # moved or converted: derived data follows the blocks
        return result

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return gguf_matmul(x, self.blocks, self.fmt, self.bias)
        rows = x.reshape(-1, self.in_features)
        out = self._cpu_product(rows.float().contiguous())
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _cpu_product(self, rows: torch.Tensor) -> torch.Tensor:
        path = self.path
        if path == "cpp":  # any number of rows; each row's arithmetic is the same whatever its batch
            return gguf_cpu.cpp_linear(rows, self.blocks, self.kind)
        if path == "int4pack" and rows.shape[0] <= DIRECT_ROWS and not products_are_row_invariant():
            return gguf_cpu.int4pack_linear(rows, self._int4pack)
        return F.linear(rows, self.dequantized_weight())


def _replace(parent: nn.Module, name: str, module: nn.Module) -> None:
    module.pack()
    setattr(parent, name, module)


def gguf_model_weights(model: nn.Module, fmt: str, source=None) -> nn.Module:
    """Replace ``model``'s linear layers by `GGUFLinear`s of weight format ``fmt`` (`LAYOUT`), in place.

    ``source``: a `workbench.models.gguf_file.GGUFBlocks` whose blocks are taken wherever the file stores a layer
    in the format wanted (the shipped weights as shipped); anything else is quantized from the float weights."""
    if fmt not in LAYOUT:
        raise ValueError(f"unknown GGUF weight format {fmt!r}: choose one of {list(LAYOUT)}")
    layer_fmt, head_fmt = LAYOUT[fmt]
    device = model.embed_tokens.weight.device
    for i, layer in enumerate(model.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            linear = getattr(layer, name)
            stored = source.layer_blocks(i, name) if source is not None else None
            if stored is not None and stored[0] == layer_fmt:
                blocks = torch.from_numpy(stored[1]).to(device)
                _replace(layer, name, GGUFLinear(blocks, layer_fmt, linear.in_features, linear.bias))
            else:
                _replace(layer, name, GGUFLinear.from_float(linear, layer_fmt))
    head = model.lm_head
    stored = source.head_blocks() if source is not None else None
    if stored is not None and stored[0] == head_fmt:
        new_head = GGUFLinear(torch.from_numpy(stored[1]).to(device), head_fmt, head.in_features, head.bias)
    else:
        new_head = GGUFLinear.from_float(head, head_fmt)
    _replace(model, "lm_head", new_head)
    if getattr(model.spec, "tie_word_embeddings", False):
        model.lm_head.weight = model.embed_tokens.weight  # the float table, for code that reads the head's rows
    model.weight_format = fmt
    model.cpu_block_layers = None  # decided on first use (`workbench.models.gguf_layers.runs_here`)
    return model
