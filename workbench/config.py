"""Validated settings shared by the whole workbench.

Every knob a user can turn lives in one of these slots dataclasses, and each checks itself in
``__post_init__``: a bad value raises ``ValueError`` naming the value and the allowed range, so a mistake in
a notebook cell fails at the line that made it instead of deep inside the engine.

``ModelSpec`` is the architecture of a Llama-family model as read from a Hugging Face ``config.json``. Sizing
code (KV bytes per token, block counts) works from a ``ModelSpec`` alone, without building any weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from workbench_kernels.kv_quant import KV_FORMATS

# Model families whose checkpoints this forward pass reads. They differ only in which projections carry a
# bias and whether attention uses a sliding window; everything else is the Llama block.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# Per-layer attention types, named as transformers' ``layer_types`` names them (Gemma 3, gpt-oss, Qwen2, ...).
LAYER_TYPES = ("full_attention", "sliding_attention")
# RoPE variants the forward pass implements: the plain one, and Llama 3.1's frequency scaling for 128K contexts.
ROPE_TYPES = ("default", "llama3")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# vLLM's temperature rules (its SamplingParams: _SAMPLING_EPS, _MAX_TEMP): below GREEDY_BELOW_TEMPERATURE sampling
# is greedy (the limit T -> 0); up to MIN_SAMPLING_TEMPERATURE it is raised to that, because logits / T overflow
# float32 for a tiny T and the request's row of the batch would be NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5
MIN_SAMPLING_TEMPERATURE = 1e-2


def effective_temperature(temperature: float) -> float:
    """The temperature the sampler uses for a requested one (0 = greedy); see the constants above."""
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return 0.0
    return max(temperature, MIN_SAMPLING_TEMPERATURE)


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


# The most top alternatives a request may ask log-probabilities for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    ``temperature == 0`` is greedy decoding, and so is any temperature below 1e-5; one in [1e-5, 1e-2) is raised
    to 1e-2 (vLLM's rules, `effective_temperature`). ``top_k == 0`` and ``top_p == 1`` switch those filters off.
    With a ``seed`` the draws are reproducible per request, whatever else shares the batch.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    # vLLM's extensions, with vLLM's meanings and defaults (each default switches it off):
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one (after temperature)
    min_tokens: int = 0  # EOS and stop token ids are masked, and stop strings ignored, until this many are out
    repetition_penalty: float = 1.0  # tokens seen in prompt or output: positive logits / p, negative ones x p
    frequency_penalty: float = 0.0  # logit -= f x (times the token was generated)
    presence_penalty: float = 0.0  # logit -= p if the token was generated at all
    include_stop_str_in_output: bool = False  # keep the stop string that ended the text
    logprobs: int | None = None  # return each token's log-probability and this many top alternatives (0: none)
    # each prompt token's log-probability (the first has none) and this many top alternatives; the prompt is then
    # prefilled whole, never read from the prefix cache (a cached block has no logits: vLLM skips the lookup too)
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
                 f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _require(isinstance(self.temperature, int | float) and math.isfinite(self.temperature)
                 and self.temperature >= 0,
                 f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        object.__setattr__(self, "temperature", effective_temperature(self.temperature))
        _require(isinstance(self.top_k, int) and self.top_k >= 0,
                 f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _require(isinstance(self.top_p, int | float) and 0 < self.top_p <= 1,
                 f"top_p must be in (0, 1], got {self.top_p!r}")
        _require(self.seed is None or isinstance(self.seed, int),
                 f"seed must be an integer or None, got {self.seed!r}")
        _require(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        _require(all(isinstance(s, str) and s for s in stop), f"stop must be non-empty strings, got {stop!r}")
        object.__setattr__(self, "stop", stop)
        ids = tuple(self.stop_token_ids)
        _require(all(isinstance(t, int) and t >= 0 for t in ids),
                 f"stop_token_ids must be non-negative integers, got {ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)
        _require(isinstance(self.min_p, int | float) and 0 <= self.min_p <= 1,
                 f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        _require(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
                 f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        _require(isinstance(self.repetition_penalty, int | float) and 0 < self.repetition_penalty <= 10,
                 f"repetition_penalty must be in (0, 10] (1 = off), got {self.repetition_penalty!r}")
        _require(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
                 f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        _require(self.prompt_logprobs is None
                 or (isinstance(self.prompt_logprobs, int) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
                 f"prompt_logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _require(isinstance(value, int | float) and -2 <= value <= 2,
                     f"{name} must be in [-2, 2] (0 = off), got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def stop_ids(self, eos_ids: set[int] | frozenset[int]) -> set[int]:
        """The token ids that end a sequence: ``stop_token_ids``, and the model's EOS unless ``ignore_eos``."""
        return set(self.stop_token_ids) | (set() if self.ignore_eos else set(eos_ids))

    @property
    def one_token_per_step(self) -> bool:
        """True when this sequence must not be drafted for speculative decoding: its logits depend on the tokens
        before (``reads_history``), or it reports each token's log-probabilities, read from the step that drew it."""
        return self.reads_history or self.logprobs is not None

    @property
    def reads_history(self) -> bool:
        """True when each next token's logits depend on the tokens before it (penalties, min_tokens)."""
        return bool(self.min_tokens or self.repetition_penalty != 1 or self.frequency_penalty
                    or self.presence_penalty)


# What a KV cache may store: the kernels' formats (`workbench_kernels.kv_quant`: auto and the quantized ones), or
# a float dtype named outright, which must then be the model's own (the same as auto).
FLOAT_KV_DTYPES = ("float32", "float16", "bfloat16")
KV_CACHE_DTYPES = (*KV_FORMATS, *FLOAT_KV_DTYPES)

# On the CPU the "device" is the machine's RAM, shared with everything else; a default budget of 1 GiB holds
# ~23k tokens of SmolLM2-135M's fp32 KV (46 KB/token), far more than any notebook workload needs.
DEFAULT_CPU_KV_BUDGET_BYTES = 1 << 30


@dataclass(slots=True, frozen=True)
class CacheConfig:
    """How the paged KV cache is laid out and how big it is.

    ``num_blocks`` fixes the pool size directly; otherwise it follows from ``memory_budget_bytes`` (KV bytes
    to spend) or, on a GPU, from ``memory_utilization`` of the device minus weights and the measured
    activation peak (`workbench.cache.sizing.block_budget`).
    """

    block_size: int = 16
    num_blocks: int | None = None
    memory_budget_bytes: int | None = None
    memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _require(isinstance(self.block_size, int) and 1 <= self.block_size <= 1024,
                 f"block_size must be an integer in [1, 1024], got {self.block_size!r}")
        _require(self.num_blocks is None or (isinstance(self.num_blocks, int) and self.num_blocks >= 1),
                 f"num_blocks must be an integer >= 1 or None, got {self.num_blocks!r}")
        _require(self.memory_budget_bytes is None or self.memory_budget_bytes > 0,
                 f"memory_budget_bytes must be > 0 or None, got {self.memory_budget_bytes!r}")
        _require(0 < self.memory_utilization <= 1,
                 f"memory_utilization must be in (0, 1], got {self.memory_utilization!r}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"unknown kv_cache_dtype {self.kv_cache_dtype!r}: choose one of {list(KV_CACHE_DTYPES)}")


BATCHING_MODES = ("continuous", "static", "dynamic")
SCHEDULING_POLICIES = ("fcfs", "priority")
# A step group's tokens reach the caller together: past a few dozen, what the host saves per token is noise and a
# waiting request's delay is not.
MAX_SCHEDULER_STEPS = 64


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """What one engine step may contain, and how requests join the running batch.

    ``batching`` is for teaching: ``continuous`` lets requests join and leave every step; ``static`` runs a
    fixed batch to completion before admitting more; ``dynamic`` also runs batches to completion, but starts
    one once ``dynamic_batch_size`` requests wait or the oldest has waited ``dynamic_max_wait_s``.
    ``scheduling_policy`` and ``cache_aware_admission`` choose who is admitted and preempted first
    (`workbench.engine.admission_policy`). ``num_scheduler_steps`` > 1 runs that many decode steps back to back on
    the device per engine step whenever every running sequence is decoding greedily and nothing waits: each step's
    tokens feed the next on the device, and the host schedules, reads tokens back and does its bookkeeping once
    per group instead of once per token (vLLM 0.6's ``--num-scheduler-steps``). Tokens then reach the caller in
    groups, and a request that arrives waits for the group to end.
    """

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    enable_chunked_prefill: bool = True
    max_prefill_chunk: int | None = None  # tokens of one prompt per step (None: whatever budget is left)
    batching: str = "continuous"
    dynamic_batch_size: int = 8
    dynamic_max_wait_s: float = 0.05
    scheduling_policy: str = "fcfs"
    cache_aware_admission: bool = False
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        _require(isinstance(self.num_scheduler_steps, int) and 1 <= self.num_scheduler_steps <= MAX_SCHEDULER_STEPS,
                 f"num_scheduler_steps must be an integer in [1, {MAX_SCHEDULER_STEPS}], got "
                 f"{self.num_scheduler_steps!r}")
        _require(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
                 f"max_num_seqs must be an integer >= 1, got {self.max_num_seqs!r}")
        _require(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= self.max_num_seqs,
                 f"max_num_batched_tokens must be an integer >= max_num_seqs ({self.max_num_seqs}) so every "
                 f"running sequence can decode each step, got {self.max_num_batched_tokens!r}")
        _require(self.max_prefill_chunk is None or (isinstance(self.max_prefill_chunk, int)
                                                    and self.max_prefill_chunk >= 1),
                 f"max_prefill_chunk must be an integer >= 1 or None, got {self.max_prefill_chunk!r}")
        _require(self.batching in BATCHING_MODES,
                 f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        _require(isinstance(self.dynamic_batch_size, int) and self.dynamic_batch_size >= 1,
                 f"dynamic_batch_size must be an integer >= 1, got {self.dynamic_batch_size!r}")
        _require(self.dynamic_max_wait_s >= 0, f"dynamic_max_wait_s must be >= 0, got {self.dynamic_max_wait_s!r}")
        _require(self.scheduling_policy in SCHEDULING_POLICIES,
                 f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        _require(isinstance(self.cache_aware_admission, bool),
                 f"cache_aware_admission must be True or False, got {self.cache_aware_admission!r}")

    @property
    def chunk_limit(self) -> int:
        """Most prompt tokens one sequence may bring to a single step."""
        return self.max_prefill_chunk or self.max_num_batched_tokens


SPEC_METHODS = ("ngram", "draft")
# A tree pass verifies at most this many drafted nodes (a 65-position forward; EAGLE-2's default budget is 60).
MAX_TREE_NODES = 64
MAX_TREE_DEPTH = 16  # like the chain's K


def static_tree_size(branching: tuple[int, ...]) -> int:
    """Drafted nodes of the full tree with these branching factors (children per node at each depth)."""
    total, width = 0, 1
    for b in branching:
        width *= b
        total += width
    return total


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """Speculative decoding: a cheap proposer drafts tokens, the target verifies them all in one forward.

    ``ngram`` (prompt lookup) proposes the continuation of the longest recent n-gram (``ngram_max`` down to
    ``ngram_min`` tokens) that already occurred in the sequence. ``draft`` runs a draft model on its own paged
    KV cache (by default the trained SmolLM2 draft in ``datasets/drafts``). ``num_speculative_tokens`` is K,
    the drafts per step; a request may ask for a different K (`LLMEngine.add_request`).

    Token trees (`workbench.spec.tree`) instead of a chain, one of:

    - ``tree_branching``: a static tree, children per node at each depth: ``(3, 2, 1)`` drafts 3 + 6 + 6 = 15
      nodes, 3 deep (``draft`` only; its depth replaces K);
    - ``tree_budget``: a dynamic tree of that many nodes, K deep: the draft grows it from its ``tree_top_k``
      most probable nodes per depth (EAGLE-2); prompt lookup merges up to ``tree_top_k`` earlier matches.

    A pass then verifies the tree's nodes plus the newest token in one forward (the verification budget).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    tree_branching: tuple[int, ...] = ()
    tree_budget: int = 0
    tree_top_k: int = 4

    def __post_init__(self) -> None:
        _require(self.method in SPEC_METHODS, f"method must be one of {SPEC_METHODS}, got {self.method!r}")
        _require(isinstance(self.num_speculative_tokens, int) and 1 <= self.num_speculative_tokens <= 16,
                 f"num_speculative_tokens must be an integer in [1, 16], got {self.num_speculative_tokens!r}")
        _require(isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                 and 1 <= self.ngram_min <= self.ngram_max,
                 f"need integers 1 <= ngram_min <= ngram_max, got {self.ngram_min!r} and {self.ngram_max!r}")
        self._check_tree()

    def _check_tree(self) -> None:
        branching = self.tree_branching
        _require(isinstance(branching, tuple | list),
                 f"tree_branching must be a tuple of children per depth, e.g. (3, 2, 1), got {branching!r}")
        branching = tuple(branching)
        object.__setattr__(self, "tree_branching", branching)
        if branching:
            _require(len(branching) <= MAX_TREE_DEPTH and all(_is_int(b) and 1 <= b <= 16 for b in branching),
                     f"tree_branching must hold 1..{MAX_TREE_DEPTH} integers in [1, 16] (children per node at each "
                     f"depth), got {branching!r}")
            nodes = static_tree_size(branching)
            _require(nodes <= MAX_TREE_NODES, f"tree_branching {branching} makes {nodes} nodes; a pass verifies at "
                                              f"most {MAX_TREE_NODES}")
            _require(self.method == "draft", "tree_branching needs method 'draft': prompt lookup proposes the "
                                             "continuations it finds, use tree_budget for it")
        _require(_is_int(self.tree_budget) and 0 <= self.tree_budget <= MAX_TREE_NODES,
                 f"tree_budget must be an integer in [0, {MAX_TREE_NODES}] (0: no dynamic tree), "
                 f"got {self.tree_budget!r}")
        _require(not (branching and self.tree_budget),
                 f"choose a static tree (tree_branching={branching}) or a dynamic one (tree_budget="
                 f"{self.tree_budget}), not both")
        _require(_is_int(self.tree_top_k) and 1 <= self.tree_top_k <= 16,
                 f"tree_top_k must be an integer in [1, 16], got {self.tree_top_k!r}")

    @property
    def is_tree(self) -> bool:
        return bool(self.tree_branching or self.tree_budget)

    @property
    def depth(self) -> int:
        """Most drafted tokens a pass can accept: K, or a static tree's number of levels."""
        return len(self.tree_branching) if self.tree_branching else self.num_speculative_tokens

    @property
    def verify_positions(self) -> int:
        """Positions per target pass for one sequence (the verification budget): the newest token and every
        drafted node."""
        if self.tree_branching:
            return 1 + static_tree_size(self.tree_branching)
        return 1 + (self.tree_budget or self.num_speculative_tokens)
