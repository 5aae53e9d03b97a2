"""FLOPs and bytes of one engine step, counted from the architecture and the step's batch.

A step runs one forward over a flat batch: some sequences bring one new token (decode), others a chunk of their
prompt (prefill). For each sequence the count needs only two numbers, the tokens it feeds this step and its
context length once they are in. From those and a ``ModelSpec``:

FLOPs (a multiply-add counts 2; elementwise work such as norms, RoPE and SiLU is under 1% and left out)
    linear     2 x T x L x (q/k/v/o and MLP weights per layer)       T = tokens fed in the step
    attention  4 x (query, key) pairs x query heads x head_dim x L   a fed token at position p sees p + 1 keys
    LM head    2 x R x hidden x vocab                                R = sequences that get a next token

bytes moved (the least traffic the step can get away with: every tensor crosses memory once)
    weights      every layer's weights and the LM head read once per step, whatever T is (that is the point of
                 batching), plus the T embedding rows gathered
    KV read      each sequence's cached K and V, once: context x KV bytes per token
    KV written   T x KV bytes per token
    activations  each matrix product reads its input and writes its output once; logits are written in fp32

Arithmetic intensity = FLOPs / bytes. On a device whose peaks give a ridge point of P / B FLOP per byte, a
step with lower intensity cannot go faster than bytes / B (bandwidth-bound) and one with higher intensity than
FLOPs / P (compute-bound). A decode step at batch b does about 2 FLOPs per weight per sequence while reading each
weight once, so its intensity is about 2b / (bytes per weight): tiny at batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.sizing import cached_tokens, dtype_bytes, kv_bytes_per_token
from workbench.config import ModelSpec

LOGIT_BYTES = 4  # the runner returns logits in float32 whatever the model's dtype


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: ``new_tokens`` fed, ``context`` tokens in the sequence once they are in."""

    new_tokens: int
    context: int
    logits: bool = True  # False for a prefill chunk that does not finish its prompt (no next token yet)

    def __post_init__(self) -> None:
        if not isinstance(self.new_tokens, int) or self.new_tokens < 1:
            raise ValueError(f"new_tokens must be an integer >= 1, got {self.new_tokens!r}")
        if not isinstance(self.context, int) or self.context < self.new_tokens:
            raise ValueError(f"context must be an integer >= new_tokens ({self.new_tokens}), got {self.context!r}")


def decode_work(batch: int, context: int) -> tuple[SeqWork, ...]:
    """A decode step: ``batch`` sequences each feeding one token, ``context`` tokens long afterwards."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    return (SeqWork(1, context),) * batch


def prefill_work(tokens: int, cached: int = 0) -> tuple[SeqWork, ...]:
    """A whole-prompt prefill of ``tokens`` new tokens after ``cached`` tokens already in the cache."""
    if not isinstance(cached, int) or cached < 0:
        raise ValueError(f"cached must be an integer >= 0, got {cached!r}")
    return (SeqWork(tokens, cached + tokens),)


@dataclass(frozen=True, slots=True)
class StepCount:
    """FLOPs and bytes of one step, by part."""

    flops_linear: float
    flops_attention: float
    flops_lm_head: float
    bytes_weights: float
    bytes_kv_read: float
    bytes_kv_written: float
    bytes_activations: float

    @property
    def flops(self) -> float:
        return self.flops_linear + self.flops_attention + self.flops_lm_head

    @property
    def bytes(self) -> float:
        return self.bytes_weights + self.bytes_kv_read + self.bytes_kv_written + self.bytes_activations

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__} | {
            "flops": self.flops, "bytes": self.bytes, "intensity": self.intensity}


def linear_weights_per_layer(spec: ModelSpec) -> int:
    """Weights one token is multiplied by in a layer: q/k/v, output, gate/up and down projections."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return h * (q + 2 * kv) + q * h + 3 * h * spec.intermediate_size


def attended_pairs(new_tokens: int, context: int, window: int | None = None) -> int:
    """(query, key) pairs of a causal step: the fed tokens sit at positions context - new_tokens .. context - 1
    and the one at position p sees p + 1 keys, or at most ``window`` of them."""
    first, last = context - new_tokens + 1, context  # keys seen by the first and the last fed token
    if window is None or last <= window:
        return (first + last) * new_tokens // 2
    if first >= window:
        return window * new_tokens
    return (first + window) * (window - first + 1) // 2 + window * (last - window)


def _activation_elements_per_token(spec: ModelSpec) -> int:
    """Elements each matrix product of one layer reads and writes for one token (input + output)."""
    h, q, kv, inter = (spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                       spec.intermediate_size)
    return ((h + q + 2 * kv)  # qkv projection
            + (q + q)  # attention: queries in, mixed values out (K and V are counted as KV traffic)
            + (q + h)  # output projection
            + (h + 2 * inter)  # gate and up projections
            + (inter + h))  # down projection


def count_step(spec: ModelSpec, work: tuple[SeqWork, ...] | list[SeqWork], *,
               dtype: torch.dtype | str = torch.float32, kv_format: str | torch.dtype = "auto") -> StepCount:
    """FLOPs and bytes of one forward over ``work`` (see the module docstring for what is counted).

    ``dtype`` is the model's (weights and activations); ``kv_format`` the cache's (``auto`` = ``dtype``)."""
    if not work:
        raise ValueError("a step needs at least one sequence")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    b = dtype_bytes(dtype)
    kv_per_token = kv_bytes_per_token(spec, kv_format, dtype)
    h, layers = spec.hidden_size, spec.num_layers
    tokens = sum(w.new_tokens for w in work)
    rows = sum(w.logits for w in work)
    pairs = sum(attended_pairs(w.new_tokens, w.context, spec.sliding_window) for w in work)
    per_layer_weights = linear_weights_per_layer(spec) + 2 * h  # + the two norms' gains
    lm_head = spec.vocab_size * h if rows else 0
    return StepCount(
        flops_linear=2.0 * tokens * layers * linear_weights_per_layer(spec),
        flops_attention=4.0 * pairs * spec.num_heads * spec.head_dim * layers,
        flops_lm_head=2.0 * rows * h * spec.vocab_size,
        bytes_weights=float(b * (layers * per_layer_weights + h + lm_head + tokens * h)),
        bytes_kv_read=float(sum(cached_tokens(spec, w.context) for w in work) * kv_per_token),
        bytes_kv_written=float(tokens * kv_per_token),
        bytes_activations=float(b * (tokens * layers * _activation_elements_per_token(spec) + rows * h)
                                + LOGIT_BYTES * rows * spec.vocab_size),
    )
