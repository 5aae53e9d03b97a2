"""``ModelSpec``: the architecture of a Llama-family model as read from a Hugging Face ``config.json``.

Sizing code (KV bytes per token, block counts) works from a ``ModelSpec`` alone, without building any weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.config.checks import require as _require

# Model families whose checkpoints this forward pass reads. They differ only in which projections carry a
# bias and whether attention uses a sliding window; everything else is the Llama block.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# Per-layer attention types, named as transformers' ``layer_types`` names them (Gemma 3, gpt-oss, Qwen2, ...).
LAYER_TYPES = ("full_attention", "sliding_attention")
# RoPE variants the forward pass implements: the plain one, and Llama 3.1's frequency scaling for 128K contexts.
ROPE_TYPES = ("default", "llama3")


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """Architecture of a Llama-family decoder, enough to size its KV cache or build it with random weights."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    sliding_window: int | None = None
    model_type: str = "llama"
    checkpoint_dtype: str = "bfloat16"
    # Which layers attend within ``sliding_window`` and which over everything (LAYER_TYPES, one per layer). None
    # keeps the older whole-model reading: every layer slides when ``sliding_window`` is set.
    layer_types: tuple[str, ...] | None = None
    # Llama 3.1's RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    rope_scaling: tuple[float, float, float, int] | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{name} must be a positive integer, got {value!r}")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                 f"({self.num_kv_heads})")
        _require(self.head_dim % 2 == 0, f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        _require(self.rms_norm_eps > 0, f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        _require(self.rope_theta > 0, f"rope_theta must be > 0, got {self.rope_theta}")
        _require(self.model_type in SUPPORTED_MODEL_TYPES,
                 f"model_type {self.model_type!r} is not supported; choose one of {SUPPORTED_MODEL_TYPES}")
        if self.sliding_window is not None:
            _require(self.sliding_window >= 1, f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        self._check_layer_types()
        if self.rope_scaling is not None:
            factor, low, high, original = self.rope_scaling
            _require(factor >= 1 and 0 < low < high and original >= 1,
                     f"rope_scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) "
                     f"needs factor >= 1, 0 < low < high and original >= 1, got {self.rope_scaling}")

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        types = tuple(self.layer_types)
        object.__setattr__(self, "layer_types", types)
        _require(len(types) == self.num_layers and all(t in LAYER_TYPES for t in types),
                 f"layer_types must name one of {LAYER_TYPES} for each of the {self.num_layers} layers, got {types!r}")
        _require("sliding_attention" not in types or self.sliding_window is not None,
                 "layer_types has sliding_attention layers but sliding_window is None: give the window's length")

    # ----------------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` dictionary (Llama, Mistral or Qwen2)."""
        model_type = config.get("model_type", "llama")
        _require(model_type in SUPPORTED_MODEL_TYPES,
                 f"model_type {model_type!r} is not supported; choose one of {SUPPORTED_MODEL_TYPES}")
        rope_scaling = config.get("rope_scaling")
        rope_params = config.get("rope_parameters") or {}
        scaling = rope_scaling or rope_params
        rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
        _require(rope_type in ROPE_TYPES,
                 f"rope type {rope_type!r} is not supported by this forward pass; choose one of {ROPE_TYPES}")
        num_heads = config["num_attention_heads"]
        sliding = config.get("sliding_window")
        if model_type == "qwen2" and not config.get("use_sliding_window", False):
            sliding = None
        layer_types = config.get("layer_types")
        if sliding is None or not layer_types or "sliding_attention" not in layer_types:
            layer_types = None  # no layer slides: the plain whole-model path
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            name=name or config.get("_name_or_path") or model_type,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            max_position_embeddings=config["max_position_embeddings"],
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=float(config.get("rope_theta") or rope_params.get("rope_theta") or 10000.0),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            # Qwen2 always biases q/k/v and never o; Llama's attention_bias covers all four projections.
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            sliding_window=sliding,
            model_type=model_type,
            checkpoint_dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            layer_types=None if layer_types is None else tuple(layer_types),
            rope_scaling=None if rope_type != "llama3" else (
                float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"]),
                int(scaling["original_max_position_embeddings"])),
        )

    @classmethod
    def from_json(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        path = Path(path)
        return cls.from_hf_config(json.loads(path.read_text()), name=name or path.stem)

    def to_hf_config(self) -> dict[str, Any]:
        """A ``config.json`` dictionary transformers accepts for the same architecture."""
        config: dict[str, Any] = {
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }
        if self.model_type == "llama":
            config["attention_bias"] = self.qkv_bias
        if self.sliding_window is not None:
            config["sliding_window"] = self.sliding_window
            config["use_sliding_window"] = True
        if self.layer_types is not None:
            config["layer_types"] = list(self.layer_types)
        if self.rope_scaling is not None:
            factor, low, high, original = self.rope_scaling
            config["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                      "high_freq_factor": high, "original_max_position_embeddings": original}
        return config

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (validated again), e.g. fewer layers for a timing run."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ModelSpec(**values)

    # ----------------------------------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (1 = multi-head, num_heads = multi-query)."""
        return self.num_heads // self.num_kv_heads

    @property
    def attention_kind(self) -> str:
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: the layer attends over the whole context)."""
        if self.layer_types is None:
            return (self.sliding_window,) * self.num_layers
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in self.layer_types)

    @property
    def max_context(self) -> int:
        """Longest context every forward path here serves exactly: the position limit, and the window for
        sliding-window models.

        The contiguous and no-cache paths keep every token's KV and attend over all of it, which is only the
        model's own attention while the context fits inside its window. With per-layer ``layer_types`` the paged
        engine masks each window itself (`workbench.cache.kv_groups`) and serves ``max_position_embeddings``."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    def num_parameters(self) -> int:
        """Parameter count computed from the shapes (embedding counted once when tied)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.o_bias:
            attention += h
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * per_layer + embed + head + h
