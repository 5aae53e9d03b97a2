"""OpenAI's automatic prompt caching, emulated on a clock.

From the prompt caching guide (see ``datasets/hosted/pricing.json``): no markers; prompts of 1,024 tokens or
more are cached automatically; a hit covers the longest cached prefix in 128-token steps past 1,024 (so
``cached_tokens`` is 0 or 1024 + 128k); requests are routed by a hash of the prompt's start combined with
``prompt_cache_key``, so prompts under different keys land on different machines and do not share entries;
writes cost nothing extra and cached tokens are billed at the model's cached-input price. Retention is
``in_memory`` (evicted after 5-10 minutes idle, the lower bound is used here, and always within an hour) or
``24h``. ``usage.prompt_tokens_details.cached_tokens`` is what the API reports.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workbench.hosted.pricing import PER_TOKEN, load_pricing, model_price


@dataclass(frozen=True, slots=True)
class OpenAIUsage:
    prompt_tokens: int
    cached_tokens: int

    def to_dict(self, completion_tokens: int = 0) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def cost_usd(self, model: str, completion_tokens: int = 0) -> float:
        price = model_price("openai", model)
        return PER_TOKEN * ((self.prompt_tokens - self.cached_tokens) * price.input
                            + self.cached_tokens * price.cached_input + completion_tokens * price.output)


class OpenAICache:
    """Cached prefixes for one organization, keyed by ``prompt_cache_key`` and prefix, on ``clock``."""

    def __init__(self, *, retention: str = "in_memory", clock: Callable[[], float] = time.monotonic) -> None:
        rules = load_pricing()["openai"]
        if retention not in ("in_memory", "24h"):
            raise ValueError(f"retention must be 'in_memory' or '24h', got {retention!r}")
        self.minimum, self.step = rules["min_cacheable_tokens"], rules["increment_tokens"]
        self.idle_s = rules["retention_seconds"]["in_memory" if retention == "in_memory" else "24h"]
        self.max_age_s = rules["retention_seconds"]["in_memory_max" if retention == "in_memory" else "24h"]
        self.clock = clock
        self._entries: dict[bytes, tuple[float, float]] = {}  # digest -> (created, last used)

    def cacheable_lengths(self, num_tokens: int) -> list[int]:
        """The prefix lengths an entry can cover: 1024, 1152, ... up to the prompt's length."""
        if num_tokens < self.minimum:
            return []
        return list(range(self.minimum, num_tokens + 1, self.step))

    def request(self, tokens: Sequence[int], prompt_cache_key: str | None = None) -> OpenAIUsage:
        now = self.clock()
        self._expire(now)
        lengths = self.cacheable_lengths(len(tokens))
        digests = _digests(tokens, lengths, prompt_cache_key)
        cached = 0
        for length, digest in zip(lengths, digests, strict=True):
            if digest in self._entries:
                cached = length
        for digest in digests:
            created = self._entries.get(digest, (now, now))[0]
            self._entries[digest] = (created, now)
        return OpenAIUsage(len(tokens), cached)

    def _expire(self, now: float) -> None:
        dead = [d for d, (created, used) in self._entries.items()
                if now - used >= self.idle_s or now - created >= self.max_age_s]
        for digest in dead:
            del self._entries[digest]


def _digests(tokens: Sequence[int], lengths: list[int], key: str | None) -> list[bytes]:
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update((key or "").encode() + b"\x00")
    out, done = [], 0
    for length in lengths:
        for token in tokens[done:length]:
            hasher.update(int(token).to_bytes(4, "little"))
        done = length
        out.append(hasher.copy().digest())
    return out


def cached_price_discount(model: str) -> float:
    """The fraction of the input price a cached token saves at ``model`` (0.5 for gpt-4o, 0.9 for gpt-5)."""
    price = model_price("openai", model)
    return 1.0 - price.cached_input / price.input

