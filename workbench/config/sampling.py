"""``SamplingParams``: how a request picks each next token and when it stops, with vLLM's rules and defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench.config.checks import require as _require

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


# The most top alternatives a request may ask log-probabilities for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    ``temperature == 0`` is greedy decoding, and so is any temperature below 1e-5; one in [1e-5, 1e-2) is raised
    to 1e-2 (vLLM's rules, `effective_temperature`). ``top_k == 0`` and ``top_p == 1`` switch those filters off.
    With a ``seed`` the draws are reproducible per request, whatever else shares the batch.
    """

    max_tokens: int | None = 64  # None: as many as the context and the KV pool leave (vLLM's server default)
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
        _require(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
                 f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
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
        _require(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= (self.max_tokens or self.min_tokens),
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
