"""Anthropic's prompt caching rules, emulated over token blocks on a clock.

What the documentation (see ``datasets/hosted/pricing.json``) says, and what this module does:
- The prompt is rendered tools → system → messages; a ``cache_control`` marker on a block is a *breakpoint*:
  the whole prefix up to and including that block can be cached. At most 4 breakpoints (a fifth is an error);
  1-hour breakpoints must come before 5-minute ones.
- A prefix shorter than the model's minimum is simply not cached: no error, zero cache tokens in ``usage``.
- Reads: at each breakpoint the cache is checked at that block boundary and up to ~20 boundaries before it
  (the lookback); the longest live entry found is read, and reading refreshes its TTL.
- Writes: every cacheable breakpoint past the read point writes an entry (5-minute or 1-hour TTL, priced at
  1.25x or 2x the input price; reads cost 0.1x).
- An entry becomes readable only once the response that wrote it has started, so identical requests sent at
  the same moment all miss and all pay the write.
``usage`` splits the prompt exactly: input_tokens + cache_creation_input_tokens + cache_read_input_tokens.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.hosted.pricing import PER_TOKEN, load_pricing, model_price

TTLS = ("5m", "1h")


@dataclass(frozen=True, slots=True)
class Block:
    """One content block's tokens; ``cache_control`` is None or a TTL ("5m", "1h") when it is a breakpoint."""

    tokens: tuple[int, ...]
    cache_control: str | None = None

    def __post_init__(self) -> None:
        if self.cache_control is not None and self.cache_control not in TTLS:
            raise ValueError(f"cache_control ttl must be one of {TTLS}, got {self.cache_control!r}")


@dataclass(slots=True)
class CacheUsage:
    """The ``usage`` Anthropic would report for one request's prompt (output tokens are the caller's)."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    creation_5m: int = 0
    creation_1h: int = 0
    written_digests: list[bytes] = field(default_factory=list, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    def to_dict(self, output_tokens: int = 0) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": output_tokens,
                "cache_creation_input_tokens": self.cache_creation_input_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens,
                "cache_creation": {"ephemeral_5m_input_tokens": self.creation_5m,
                                   "ephemeral_1h_input_tokens": self.creation_1h}}

    def cost_usd(self, model: str, output_tokens: int = 0) -> float:
        """What this request's tokens cost at ``model``'s prices."""
        price = model_price("anthropic", model)
        return PER_TOKEN * (self.input_tokens * price.input + self.creation_5m * price.write_5m
                            + self.creation_1h * price.write_1h + self.cache_read_input_tokens * price.cached_input
                            + output_tokens * price.output)


@dataclass(slots=True)
class _Entry:
    length: int
    ttl: str
    expires_at: float
    ready_at: float  # when the writing response started; math.inf until then


class AnthropicCache:
    """One organization's prompt cache for one model, on ``clock`` (seconds; ``SimClock`` in the notebook)."""

    def __init__(self, model: str = "claude-sonnet-4-5", *, clock: Callable[[], float] = time.monotonic,
                 min_cacheable_tokens: int | None = None) -> None:
        self.model = model
        self.rules = load_pricing()["anthropic"]
        price = model_price("anthropic", model)
        self.min_tokens = price.min_cacheable_tokens if min_cacheable_tokens is None else min_cacheable_tokens
        if self.min_tokens < 0:
            raise ValueError(f"min_cacheable_tokens must be >= 0, got {self.min_tokens}")
        self.clock = clock
        self._entries: dict[bytes, _Entry] = {}

    def ttl_seconds(self, ttl: str) -> float:
        return float(self.rules["ttl_seconds"][ttl])

    def check_breakpoints(self, blocks: Sequence[Block]) -> list[int]:
        """Indices of the breakpoints; raises ValueError as the API does for too many or misordered TTLs."""
        marks = [i for i, block in enumerate(blocks) if block.cache_control is not None]
        limit = self.rules["max_breakpoints"]
        if len(marks) > limit:
            raise ValueError(f"A maximum of {limit} blocks with cache_control may be provided. Found {len(marks)}.")
        ttls = [blocks[i].cache_control for i in marks]
        if "5m" in ttls and "1h" in ttls[ttls.index("5m"):]:
            raise ValueError("1h cache_control breakpoints must come before 5m ones (tools → system → messages)")
        return marks

    def request(self, blocks: Sequence[Block], *, response_delay_s: float = 0.0) -> CacheUsage:
        """Look up and write as one request does; its entries become readable ``response_delay_s`` later."""
        usage = self.begin(blocks)
        self.mark_started(usage, self.clock() + response_delay_s)
        return usage

    def begin(self, blocks: Sequence[Block]) -> CacheUsage:
        """Read and write for a request arriving now; its writes stay unreadable until ``mark_started``."""
        marks = self.check_breakpoints(blocks)
        now = self.clock()
        self._expire(now)
        ends, digests = _prefix_digests(blocks)
        hit_len = self._read(marks, ends, digests, now)
        usage = CacheUsage(0, 0, hit_len)
        written_end = hit_len
        for i in marks:
            length, ttl = ends[i], blocks[i].cache_control
            if length < self.min_tokens or length <= hit_len:
                continue  # below the minimum: silently not cached; at or before the read point: already there
            entry = self._entries.get(digests[i])
            if entry is None:  # a pending write from a concurrent request is shared: whichever starts first
                self._entries[digests[i]] = _Entry(length, ttl, now + self.ttl_seconds(ttl), math.inf)
            else:
                entry.expires_at = max(entry.expires_at, now + self.ttl_seconds(ttl))
            usage.written_digests.append(digests[i])
            new_tokens = length - written_end
            if new_tokens > 0:
                setattr(usage, f"creation_{ttl}", getattr(usage, f"creation_{ttl}") + new_tokens)
                written_end = length
        usage.cache_creation_input_tokens = written_end - hit_len
        usage.input_tokens = (ends[-1] if ends else 0) - written_end
        return usage

    def mark_started(self, usage: CacheUsage, when: float) -> None:
        """The response that wrote ``usage``'s entries started at ``when``: from then on they can be read."""
        for digest in usage.written_digests:
            entry = self._entries.get(digest)
            if entry is not None and entry.ready_at == math.inf:
                entry.ready_at = when

    def live_entries(self) -> list[tuple[int, str, float]]:
        """(prefix length, ttl, expires_at) of every entry alive now."""
        self._expire(self.clock())
        return sorted((e.length, e.ttl, e.expires_at) for e in self._entries.values())

    def _read(self, marks: list[int], ends: list[int], digests: list[bytes], now: float) -> int:
        lookback = self.rules["lookback_blocks"]
        best: _Entry | None = None
        for mark in marks:
            for i in range(mark, max(-1, mark - lookback), -1):
                entry = self._entries.get(digests[i])
                if entry is not None and entry.ready_at <= now and (best is None or entry.length > best.length):
                    best = entry
        if best is None:
            return 0
        if self.rules["ttl_refreshed_on_read"]:
            best.expires_at = now + self.ttl_seconds(best.ttl)
        return best.length

    def _expire(self, now: float) -> None:
        for digest in [d for d, e in self._entries.items() if e.expires_at <= now]:
            del self._entries[digest]


def _prefix_digests(blocks: Sequence[Block]) -> tuple[list[int], list[bytes]]:
    """Cumulative token counts and a digest of the whole prefix at every block boundary."""
    hasher = hashlib.blake2b(digest_size=16)
    ends, digests, total = [], [], 0
    for block in blocks:
        for token in block.tokens:
            hasher.update(token.to_bytes(4, "little"))
        hasher.update(b"|")  # block boundaries are part of the key: the same tokens split differently differ
        total += len(block.tokens)
        ends.append(total)
        digests.append(hasher.copy().digest())
    return ends, digests
