"""Int8 weights for the engine's linear layers, and a product that is fast on each device.

Why it exists: at batch 1 a decode step reads every weight once, so weights in a quarter of fp32's bytes are the
largest speed-up available on a memory-bound CPU, and on a GPU they leave more memory for the KV cache.

The format (`workbench_kernels.int8_matmul`): int8 values, one float32 scale per output channel, symmetric;
``N * K + 4 * N`` bytes per layer. Weight formats (`WEIGHT_FORMATS`):

    auto      every weight in the model's dtype
    int8      every linear layer of the decoder (q/k/v, o, gate/up, down) in int8; the LM head stays in the
              model's dtype, as serving engines' int8 recipes leave it: its rows are the logits
    int8_all  the LM head too; a tied head recomputes its 16 largest logits per token from the float table the
              embedding keeps (`Int8Linear.rescore_top`): without that, top-1 agreement with fp32 on the held-out
              text fell from 0.961 to 0.941; the int8 head alone, on fp32 hidden states, kept the argmax on 96%
              of positions and had it within its top 3 on all of them

    q4_1      the shipped GGUF blocks (Q4_1 decoder, Q8_0 head): exact to the float32 checkpoint
    q8_0      Q8_0 blocks for every linear layer (`workbench.models.gguf_linear` for both)

Embeddings and norm gains always stay in the model's dtype: a lookup reads one row per token.

The products:

* **CPU**: fbgemm's int8 GEMM (``torch.ops.quantized.linear_dynamic``, the kernel behind ``quantize_dynamic``).
  It multiplies integers, so it would round the *activations* to 7 bits (one scale per tensor, on x86); measured,
  that alone dropped top-1 agreement to 0.78 (per-token scales) or 0.59 (per tensor). Instead each activation
  row enters as two exact integer rows, a coarse one and its remainder (`split_rows`): the weights are still
  read once per call, the integer products are exact, and the result is the weight-only product to about 14
  bits of each row's maximum. Rows never share a scale, so a row's result does not depend on its batch.
  The split and the call run inside TorchScript (`_scripted`): at batch 1 the ~12 small operators around each
  of a step's 120 fbgemm calls cost more from Python than the products' arithmetic.
* **CUDA**: a Triton kernel that converts int8 tiles in registers (`workbench_kernels.int8_matmul`).
* anywhere else, or when fbgemm is missing or fails its probe: the reference (dequantize, then ``F.linear``).

Why fbgemm (microseconds at SmolLM2 shapes, 2-core AVX2 CPU, one thread; `bench_weight_quant.py --micro`):
``torch._weight_int8pack_mm``, which torchao 0.18's int8 weight-only CPU path calls, has no fast kernel without
AVX-512 and ran 5-25x slower than the packed fp32 product; torchao's own path ran 0.5-0.9x of it (and 0.1x on
the LM head); fbgemm ran 1.8-3x faster at 1-32 rows. oneDNN's int8 product (``torch.ops.onednn.qlinear_pointwise``,
fed the same split rows as uint8) was exact too but 2-3x slower than fbgemm at 1-2 rows (3072x576). The
quantized-tensor API fbgemm's packing needs is deprecated in torch 2.13; when it goes, `Int8Linear.pack` falls
back to the reference and ``path`` says so; TorchScript is deprecated too, and without it the same split runs
as plain Python, slower.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import nn

from workbench_kernels.int8_matmul import SCALE_FLOOR, int8_matmul, int8_matmul_reference, quantize_per_channel

# q4_1 and q8_0 keep GGUF blocks (`workbench.models.gguf_linear`); this module owns the list and the dispatch.
WEIGHT_FORMATS = ("auto", "int8", "int8_all", "q4_1", "q8_0")
# An int8 LM head's largest logits per row recomputed from the float table (tied heads keep it for the lookup):
# on the held-out text the float argmax was among the int8 head's top 3 on every one of 1,024 positions.
RESCORE_TOP = 16
COARSE_LEVELS = 63  # |coarse| <= 63: with the pin row, fbgemm's grid is exactly the integers -64..63
FINE_LEVELS = 126  # the remainder, within half a coarse step, scaled to integers in [-63, 63]
_COARSE, _FINE = torch.tensor(float(COARSE_LEVELS)), torch.tensor(float(FINE_LEVELS))  # see _split_product


def check_weight_format(weights: str) -> str:
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weights format {weights!r}: choose one of {list(WEIGHT_FORMATS)}")
    return weights


def split_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row of x [M, K] as ``amax / 63 * (coarse + fine / 126)`` with integer-valued coarse and fine rows in
    [-63, 63]. Returns ``(coarse, fine, amax)``; the two-part form is within ``amax / 15876`` of x."""
    amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min_(SCALE_FLOOR)
    scaled = x / (amax / COARSE_LEVELS)  # this order of operations is `fbgemm_int8_linear`'s, bit for bit
    coarse = scaled.round()
    fine = scaled.sub_(coarse).mul_(FINE_LEVELS).round_()
    return coarse, fine, amax


def pin_rows(in_features: int) -> torch.Tensor:
    """fbgemm's input for a one-row product [3, K]: a coarse and a fine row, then the *pin* row.

    fbgemm picks its activation grid from the tensor's min and max over 7 bits (``reduce_range``): a row holding
    -64 and 63 makes the step exactly 1 and the zero point exactly 64, so integer inputs are quantized exactly.
    The first two rows are overwritten by every one-row product (`fbgemm_int8_linear`)."""
    rows = torch.zeros(3, in_features)
    rows[2, 0], rows[2, 1] = float(COARSE_LEVELS), -float(COARSE_LEVELS + 1)
    return rows


def _split_product(x: torch.Tensor, packed: torch.classes.quantized.LinearPackedParamsBase, rows1: torch.Tensor,
                   bias: torch.Tensor | None, coarse_levels: torch.Tensor, fine_levels: torch.Tensor,
                   floor: float = SCALE_FLOOR, inverse_fine: float = 1.0 / FINE_LEVELS) -> torch.Tensor:
    # The levels come as 0-dim tensors: a Python number in a tensor operator is first wrapped into a tensor and
    # converted, three extra operators each time. The floats are arguments because TorchScript reads no globals.
    m = x.shape[0]
    amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min_(floor)
    step = amax / coarse_levels  # [m, 1]: the coarse row's unit
    if m == 1:  # decode at batch 1: the layer's own buffer, pin row already in place
        rows = rows1
    else:
        rows = torch.empty(2 * m + 1, x.shape[1])
        rows[2 * m:] = rows1[2:]
    coarse, fine = rows[:m], rows[m: 2 * m]
    torch.div(x, step, out=fine)  # the scaled row, until the coarse part is taken out
    torch.round(fine, out=coarse)
    fine.sub_(coarse).mul_(fine_levels).round_()
    out = torch.ops.quantized.linear_dynamic(rows, packed, True)
    out = torch.add(out[:m], out[m: 2 * m], alpha=inverse_fine).mul_(step)
    if bias is not None:
        out.add_(bias)
    return out


def _scripted(fn):
    """``fn`` compiled by TorchScript, or ``fn`` itself where TorchScript is gone or fails.

    Why TorchScript, though torch 2.13 marks it deprecated: the split is ~16 operators on tensors of a few hundred
    numbers, so what it costs is the per-operator Python dispatch, ~4 us each on this CPU; the TorchScript
    interpreter runs the same operators without it. Measured at 1 x 576 -> 576 (2 threads): 98 us per product
    in Python, 54 us scripted, 36 us for fbgemm's call alone; 120 products per decode step make that ~5 ms per
    step. ``torch.compile`` was slower still (154 us: its guards and wrapper per call). Same operators, same
    results, bit for bit (`tests/engine/test_int8_weights.py`)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.jit.script.*deprecated.*")
            return torch.jit.script(fn)
    except Exception:  # noqa: BLE001 - any failure to compile leaves the plain Python function, which is correct
        return fn


@functools.cache
def _split_product_scripted():
    return _scripted(_split_product)


def fbgemm_int8_linear(x: torch.Tensor, packed, rows1: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (q * s).T + bias`` through fbgemm for float32 x [M, K]: 2M + 1 integer rows in one call, recombined.

    `split_rows`, written straight into the rows fbgemm reads (no intermediate tensors, no concatenation), the
    whole of it run by TorchScript (`_scripted`): at batch 1 a decode step makes 120 of these calls, and in
    Python each small operator costs more than its arithmetic. ``rows1`` is the layer's `pin_rows` buffer: a
    one-row product writes into it (so one layer must not run in two threads at once), a larger one copies its
    pin row."""
    return _split_product_scripted()(x, packed, rows1, bias, _COARSE, _FINE)


def fbgemm_error_bound(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Largest difference [M, N] from the reference that the split allows: each input is off by at most half a
    fine step, ``amax(|x_row|) / (2 * 63 * 126)``, times the output channel's sum of |weights|. Float32 rounding
    of the sums comes on top."""
    step = x.abs().amax(dim=-1, keepdim=True) / (2 * COARSE_LEVELS * FINE_LEVELS)
    return step * (q.float().abs() * scale[:, None]).sum(dim=1)[None, :]


def _prepack(q: torch.Tensor, scale: torch.Tensor):
    # torch 2.13 warns once that quantized tensors are deprecated (see the module docstring); a notebook must not
    # print that to stderr, so exactly that warning is silenced here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        zero_points = torch.zeros(q.shape[0], dtype=torch.long)
        qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(qweight, None)


@functools.cache
def fbgemm_available() -> bool:
    """Whether fbgemm is here and agrees with the reference (within `fbgemm_error_bound`) on a random probe."""
    if "fbgemm" not in getattr(torch.backends.quantized, "supported_engines", []):
        return False
    gen = torch.Generator().manual_seed(0)
    q, scale = quantize_per_channel(torch.randn(24, 40, generator=gen))
    probe = torch.randn(5, 40, generator=gen) * torch.logspace(-2, 2, 5)[:, None]  # rows of very different size
    try:
        got = fbgemm_int8_linear(probe, _prepack(q, scale), pin_rows(40))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    want = int8_matmul_reference(probe, q, scale)
    rounding = 1e-5 * (probe.abs() @ (q.float().abs() * scale[:, None]).T)
    return bool(((got - want).abs() <= fbgemm_error_bound(probe, q, scale) + rounding).all())


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and per-output-channel scales. ``qweight`` and ``scale`` are the weights;
    the fbgemm packing is derived from them by `pack`. ``path`` names the product a call on the weights' device
    uses: ``fbgemm``, ``triton`` or ``reference``.

    An LM head that also holds its float ``weight`` (a tied head: the embedding lookup keeps the table) and has
    ``rescore_top = k`` recomputes each row's k largest int8 outputs from the float rows: the int8 product picks
    the candidates (reading a quarter of the bytes), the float rows decide among them, so the argmax is the float
    head's whenever it is among the k, at the cost of k rows per token."""

    rescore_top = 0  # > 0: a head whose largest outputs are recomputed in float (`quantize_model_weights`)

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale.float())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self._packed = self._rows1 = None

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        q, scale = quantize_per_channel(linear.weight)
        device = linear.weight.device
        return cls(q.to(device), scale.to(device), linear.bias)

    @property
    def path(self) -> str:
        if self.qweight.device.type == "cuda":
            return "triton"
        return "fbgemm" if self._packed is not None else "reference"

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, path={self.path}"

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scale[:, None]).to(dtype)

    def pack(self) -> None:
        """Pack for fbgemm on the CPU when fbgemm passes its probe (`fbgemm_available`), else use the reference."""
        self._packed = self._rows1 = None
        if self.qweight.device.type == "cpu" and self.in_features >= 2 and fbgemm_available():
            self._packed, self._rows1 = _prepack(self.qweight, self.scale), pin_rows(self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The engine's case first and with as few checks as possible: 120 calls per decode step.
        if self._packed is not None and x.dim() == 2 and x.dtype == torch.float32 and not x.is_cuda:
            out = fbgemm_int8_linear(x, self._packed, self._rows1, self.bias)
        elif self._packed is None or x.device.type != "cpu":
            out = int8_matmul(x, self.qweight, self.scale, self.bias)  # Triton on CUDA, else the reference
        else:  # fbgemm, for other shapes and dtypes
            rows = x.reshape(-1, self.in_features).float()
            out = fbgemm_int8_linear(rows, self._packed, self._rows1, self.bias)
            out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.rescore_top and "weight" in self._parameters:
            out = self._rescore(x, out)
        return out

    def _rescore(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Recompute each row's ``rescore_top`` largest outputs exactly from the float ``weight`` (see the class)."""
        rows, flat = x.reshape(-1, self.in_features), out.view(-1, self.out_features)
        top = flat.topk(min(self.rescore_top, self.out_features), dim=-1).indices  # [M, top]
        # A product and a sum over the last dimension, not bmm: bmm's summation order depends on the batch size,
        # and a row's logits must not depend on which rows share its batch.
        exact = (self.weight[top].to(rows.dtype) * rows[:, None, :]).sum(-1)  # [M, top]
        if self.bias is not None:
            exact = exact + self.bias[top]
        flat.scatter_(-1, top, exact.to(flat.dtype))
        return out


def quantize_model_weights(model: nn.Module, weights: str = "int8", source=None) -> nn.Module:
    """Replace the linear layers that ``weights`` names (`WEIGHT_FORMATS`) by `Int8Linear`s, in place; returns it.

    A tied LM head quantized here (``int8_all``) gets its own int8 copy of the table and keeps referring to the
    float one as ``lm_head.weight`` (code such as the draft head reads it); its products use the int8 copy.
    The GGUF formats go to `workbench.models.gguf_linear.gguf_model_weights`, with ``source`` (a GGUF file's
    blocks) when the model came from one.
    """
    if check_weight_format(weights) == "auto":
        return model
    if weights in ("q4_1", "q8_0"):
        from workbench.models.gguf_linear import gguf_model_weights

        return gguf_model_weights(model, weights, source)
    head = getattr(model, "lm_head", None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            # nn.Linear covers the engine's packed fp32 `cpu_linear.Linear`.
            if isinstance(child, nn.Linear) and (weights == "int8_all" or child is not head):
                quantized = Int8Linear.from_float(child)
                quantized.pack()
                setattr(parent, name, quantized)
    if weights == "int8_all" and head is not None and getattr(model.spec, "tie_word_embeddings", False):
        model.lm_head.weight = model.embed_tokens.weight
        model.lm_head.rescore_top = RESCORE_TOP
    model.weight_format = weights
    return model


def weight_format_of(model: nn.Module) -> str:
    """The `WEIGHT_FORMATS` name ``model``'s weights are in."""
    return getattr(model, "weight_format", "auto")


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct parameter and buffer: what the weights occupy, in whatever format they are in."""
    seen: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())

