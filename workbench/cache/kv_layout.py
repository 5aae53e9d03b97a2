"""What the KV cache of any architecture holds, layer group by layer group, read from its ``config.json``.

The engine's sizing (`workbench.cache.sizing`) knows one family: every layer keeps K and V for every token. The
models deployed in 2025-26 mix layer kinds, and each kind caches something different:

- ``full``: K and V per token per KV head, for the whole context (Llama, the global layers of the hybrids);
- ``sliding``: the same, but only the last ``window`` tokens can ever be attended, so at most ``window`` tokens
  are kept (Gemma 3: 1,024 in five layers of six; gpt-oss: 128 in every other layer; Mistral-7B: 4,096);
- ``mla``: multi-head latent attention (DeepSeek-V3) caches one ``kv_lora_rank``-wide latent plus one
  ``qk_rope_head_dim``-wide rotary key per token per layer, shared by all query heads: one "head" of
  512 + 64 = 576 values, no separate V (vLLM's MLA backends store exactly this: ``vllm/attention/backends/mla/
  common.py``: "a single latent vector to represent the per-token entry of the KV cache");
- ``linear``: linear attention (Qwen3-Next's Gated DeltaNet) keeps a fixed state per sequence, whatever its
  length: a recurrent matrix of ``value heads x key_dim x value_dim`` plus a short convolution's last
  ``kernel - 1`` inputs (vLLM's ``MambaStateShapeCalculator.gated_delta_net_state_shape``).

Attention sinks come in two kinds. gpt-oss's are *learned*: one logit per query head added to the softmax's
denominator, parameters that cost no KV (``openai/gpt-oss`` ``gpt_oss/torch/model.py``, ``AttentionBlock.sinks``).
StreamingLLM's are *tokens*: the first few tokens are kept beside a sliding window; ``sink_tokens`` counts them.

Sizing from these groups at any context, batch, dtype and tensor-parallel degree is in
`workbench.cache.layout_sizing`. Nothing here builds a model: MLA, linear attention and MoE are sized, not run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import SUPPORTED_MODEL_TYPES, ModelSpec
from workbench.paths import CONFIGS_DIR

LAYER_KINDS = ("full", "sliding", "mla", "linear")


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers of one kind with the same shape: what each caches per token, or per sequence."""

    kind: str
    num_layers: int
    kv_heads: int = 0  # full / sliding: KV heads; mla: 1 (the latent is shared by every query head)
    head_dim: int = 0  # full / sliding: width of K (and of V); mla: latent + rotary key (576 for DeepSeek-V3)
    window: int | None = None  # sliding: the most recent tokens a query sees (itself included)
    sink_tokens: int = 0  # sliding: first tokens kept besides the window (StreamingLLM); 0 for gpt-oss
    state_elements: int = 0  # linear: values of the fixed per-sequence state of one layer
    tp_split: int = 0  # linear: heads the state splits across tensor-parallel ranks (value heads)
    conv_channels: int = 0  # linear: channels of the short convolution (its state splits with them)

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"kind must be one of {LAYER_KINDS}, got {self.kind!r}")
        if self.num_layers < 1:
            raise ValueError(f"a layer group needs >= 1 layer, got {self.num_layers}")
        if self.kind == "sliding" and (self.window is None or self.window < 1):
            raise ValueError(f"a sliding group needs a window >= 1, got {self.window!r}")
        if self.kind != "linear" and (self.kv_heads < 1 or self.head_dim < 1):
            raise ValueError(f"a {self.kind} group needs kv_heads and head_dim >= 1, got {self.kv_heads}, "
                             f"{self.head_dim}")

    @property
    def stores_value(self) -> bool:
        """Full and sliding layers cache V beside K; MLA's latent stands for both; linear layers cache no tokens."""
        return self.kind in ("full", "sliding")

    def cached_tokens(self, context_len: int) -> int:
        """Tokens of one sequence whose entries a layer of this group keeps at ``context_len``."""
        if context_len < 0:
            raise ValueError(f"context_len must be >= 0, got {context_len}")
        if self.kind == "linear":
            return 0
        if self.kind == "sliding":
            return min(context_len, self.window + self.sink_tokens)
        return context_len

    def describe(self) -> str:
        if self.kind == "mla":
            return f"MLA latent + rotary key: one {self.head_dim}-wide head"
        if self.kind == "linear":
            return f"linear attention: {self.state_elements:,} state values per sequence"
        span = f", window {self.window:,}" if self.kind == "sliding" else ""
        sinks = f" + {self.sink_tokens} sink tokens" if self.sink_tokens else ""
        return f"{self.kv_heads} KV heads x {self.head_dim} (K and V){span}{sinks}"


@dataclass(frozen=True, slots=True)
class KVLayout:
    """An architecture's cache as layer groups, with what the sizing needs besides them."""

    name: str
    model_type: str
    groups: tuple[LayerGroup, ...]
    num_query_heads: int
    max_position_embeddings: int
    checkpoint_dtype: str = "bfloat16"
    sinks: str = ""  # how the model uses attention sinks, when it does (none of them cost KV here)

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    def group(self, kind: str) -> LayerGroup | None:
        return next((g for g in self.groups if g.kind == kind), None)


def _groups_by_window(windows: list[int | None], kv_heads: int, head_dim: int) -> tuple[LayerGroup, ...]:
    groups = []
    for window in dict.fromkeys(windows):  # first-seen order
        count = windows.count(window)
        kind = "full" if window is None else "sliding"
        groups.append(LayerGroup(kind, count, kv_heads, head_dim, window))
    return tuple(groups)


def layout_from_spec(spec: ModelSpec) -> KVLayout:
    """A Llama-family model's layout: full and sliding groups from its per-layer windows."""
    return KVLayout(spec.name, spec.model_type, _groups_by_window(list(spec.layer_windows), spec.num_kv_heads,
                                                                  spec.head_dim),
                    spec.num_heads, spec.max_position_embeddings, spec.checkpoint_dtype)


def _windowed(name: str, c: dict[str, Any], types: list[str], sinks: str = "") -> KVLayout:
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    windows = [c["sliding_window"] if t == "sliding_attention" else None for t in types]
    return KVLayout(name, c["model_type"], _groups_by_window(windows, c["num_key_value_heads"], head_dim), heads,
                    c["max_position_embeddings"], str(c.get("torch_dtype", "bfloat16")), sinks)


def _gpt_oss(name: str, c: dict[str, Any]) -> KVLayout:
    return _windowed(name, c, c["layer_types"], sinks="learned: one logit per query head per layer joins the "
                                                       "softmax (parameters, no cached tokens)")


def _gemma3(name: str, c: dict[str, Any]) -> KVLayout:
    text = {**c.get("text_config", c)}
    text.setdefault("torch_dtype", c.get("torch_dtype", "bfloat16"))
    pattern = text.get("sliding_window_pattern", 6)
    types = text.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                        for i in range(text["num_hidden_layers"])]
    return _windowed(name, text, types)


def _deepseek(name: str, c: dict[str, Any]) -> KVLayout:
    width = c["kv_lora_rank"] + c["qk_rope_head_dim"]
    group = LayerGroup("mla", c["num_hidden_layers"], kv_heads=1, head_dim=width)
    return KVLayout(name, c["model_type"], (group,), c["num_attention_heads"], c["max_position_embeddings"],
                    str(c.get("torch_dtype", "bfloat16")))


def _qwen3_next(name: str, c: dict[str, Any]) -> KVLayout:
    interval = c.get("full_attention_interval", 4)
    types = c.get("layer_types") or ["linear_attention" if (i + 1) % interval else "full_attention"
                                     for i in range(c["num_hidden_layers"])]
    k_heads, v_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
    k_dim, v_dim = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv_channels = 2 * k_heads * k_dim + v_heads * v_dim  # q, k and v pass the short convolution
    state = v_heads * k_dim * v_dim + (c["linear_conv_kernel_dim"] - 1) * conv_channels
    linear = LayerGroup("linear", types.count("linear_attention"), state_elements=state, tp_split=v_heads,
                        conv_channels=conv_channels)
    full = LayerGroup("full", types.count("full_attention"), c["num_key_value_heads"], c["head_dim"])
    return KVLayout(name, c["model_type"], (linear, full), c["num_attention_heads"], c["max_position_embeddings"],
                    str(c.get("torch_dtype", "bfloat16")))


_PARSERS = {"gpt_oss": _gpt_oss, "gemma3": _gemma3, "gemma3_text": _gemma3, "deepseek_v3": _deepseek,
            "qwen3_next": _qwen3_next}


def layout_from_config(config: dict[str, Any], name: str) -> KVLayout:
    """The layout of a Hugging Face ``config.json`` dictionary (Llama family, gpt-oss, Gemma 3, DeepSeek-V3,
    Qwen3-Next)."""
    model_type = config.get("model_type", "llama")
    if model_type in SUPPORTED_MODEL_TYPES:
        return layout_from_spec(ModelSpec.from_hf_config(config, name=name))
    if model_type not in _PARSERS:
        raise ValueError(f"no KV layout for model_type {model_type!r}: known are "
                         f"{sorted((*SUPPORTED_MODEL_TYPES, *_PARSERS))}")
    return _PARSERS[model_type](name, config)


def kv_layout(arch: str | ModelSpec) -> KVLayout:
    """The layout of an architecture in ``datasets/configs`` (by name) or of a ``ModelSpec``."""
    if isinstance(arch, ModelSpec):
        return layout_from_spec(arch)
    path = CONFIGS_DIR / f"{arch}.json"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))
        raise ValueError(f"unknown architecture {arch!r}: choose one of {known}")
    return layout_from_config(json.loads(Path(path).read_text()), arch)
