"""Chapter 3's measurements and their result objects, without widgets: the prompt layouts (cache reads and TTFT),
the two breakpoint placements of one conversation, the minimum-length trap, and the usage fields through the real
HTTP server. The requests and the engine are `workbench.lab.ch03.bench`; the price-table side (daily cost,
break-even, the TTL timeline) is `workbench.lab.ch03.economics`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import httpx
import pandas as pd

from workbench.hosted import AnthropicCache
from workbench.lab.ch03.bench import (
    DEFAULT_MODEL,
    MULTI_TURN_VARIANTS,
    HostedBench,
    ProgressFn,
    conversation_bodies,
    layout_body,
)
from workbench.lab.kit.baseline import Baseline
from workbench.timing import describe_machine
from workbench.workloads import static_instructions


def hit_rate(frame: pd.DataFrame) -> float:
    """Cache reads over all prompt tokens: the book's measure, read from usage fields."""
    total = frame["prompt_tokens"].sum()
    return float(frame["cache_read"].sum() / total) if total else 0.0


def warm_hit_rate(frame: pd.DataFrame) -> float:
    """The same over the requests after the first, cold one (which has nothing to read): with a handful of
    requests the cold one moves the rate a long way."""
    return hit_rate(frame[frame["request"] > 0])


def ceiling(frame: pd.DataFrame) -> float:
    """The most a warm request can read: the prompt up to the breakpoint (static / (static + dynamic)); NaN when
    no warm request read anything (a dynamic line before the breakpoint: then nothing can be read)."""
    warm = frame[frame["request"] > 0]
    if not (warm["cache_read"] > 0).any():
        return float("nan")
    return float(((warm["prompt_tokens"] - warm["input_tokens"]) / warm["prompt_tokens"]).median())


# ------------------------------------------------------------------------------------------------ layouts
@dataclass(frozen=True, slots=True)
class LayoutRun:
    """Requests of one prompt layout sent one at a time from a fresh cache, after one unbilled warm-up request
    of the first prompt (its TTFT is kept apart: it is no cache miss, it is the run's one-off start-up)."""

    layout: str
    model: str
    frame: pd.DataFrame  # one row per measured request: usage fields, cost, engine_cached, ttft_ms
    warmup_ttft_ms: float

    @property
    def hit_rate(self) -> float:
        return hit_rate(self.frame)

    @property
    def warm_hit_rate(self) -> float:
        return warm_hit_rate(self.frame)

    @property
    def ceiling(self) -> float:
        return ceiling(self.frame)

    def ttfts(self, hits: bool) -> list[float]:
        """TTFT of every request that read the provider cache (``hits``) or did not."""
        return self.frame.loc[(self.frame.cache_read > 0) == hits, "ttft_ms"].tolist()

    @property
    def hit_ms(self) -> float:
        """Median TTFT of the requests that read the provider cache (NaN when none did)."""
        reads = self.frame.loc[self.frame.cache_read > 0, "ttft_ms"]
        return float(reads.median()) if len(reads) else float("nan")

    @property
    def miss_ms(self) -> float:
        """Median TTFT of the requests that read nothing from the provider cache (warm-up excluded)."""
        misses = self.frame.loc[self.frame.cache_read == 0, "ttft_ms"]
        return float(misses.median()) if len(misses) else float("nan")

    @property
    def cost_usd(self) -> float:
        return float(self.frame.cost_usd.sum())

    @property
    def writes_every_request(self) -> bool:
        return bool((self.frame.cache_write > 0).all())


def layout_run(bench: HostedBench, layout: str, *, num_requests: int = 4, model: str = DEFAULT_MODEL,
               progress: ProgressFn | None = None) -> LayoutRun:
    bodies = [layout_body(bench.static, layout, i, f"Which rule covers case {i + 1}?", model)
              for i in range(num_requests)]
    warmup = bench.warm_up(bodies[0])
    return LayoutRun(layout, model, bench.repeated(bodies, variant=layout, progress=progress), warmup)


# --------------------------------------------------------------------------------------------- multi-turn
@dataclass(frozen=True, slots=True)
class MultiTurnRun:
    """One conversation, run once on the engine and billed with each breakpoint placement."""

    frame: pd.DataFrame  # one row per turn and variant
    gap_s: float = 30.0  # simulated seconds between a turn's first token and the next turn

    @property
    def shares(self) -> dict[str, float]:
        """Cache reads over prompt tokens on the turns after the first, per breakpoint placement."""
        later = self.frame[self.frame.request > 0]
        return {name: hit_rate(later[later.variant == name]) for name in MULTI_TURN_VARIANTS}

    @property
    def costs(self) -> dict[str, float]:
        return {name: float(self.frame.loc[self.frame.variant == name, "cost_usd"].sum())
                for name in MULTI_TURN_VARIANTS}

    @property
    def moving_share(self) -> float:
        return self.shares[MULTI_TURN_VARIANTS[0]]

    @property
    def fixed_share(self) -> float:
        return self.shares[MULTI_TURN_VARIANTS[1]]


def turn_reading(run: MultiTurnRun, turn: int = 1) -> str:
    """What one later turn wrote and read under each placement, read from the run (not typed)."""
    rows = run.frame[run.frame.request == turn].set_index("variant")
    moving, fixed = (rows.loc[name] for name in MULTI_TURN_VARIANTS)
    return (f"turn {turn} with the breakpoint on the last message wrote {int(moving.cache_write):,} tokens and read "
            f"{int(moving.cache_read):,}: one request reports both, because the lookback found the previous "
            f"turn's entry and only the new turn was written. With the breakpoint on the system prompt only it "
            f"read {int(fixed.cache_read):,} and paid full price for {int(fixed.input_tokens):,}")


def multi_turn_run(bench: HostedBench, *, turns: int = 4, gap_s: float = 30.0,
                   progress: ProgressFn | None = None) -> MultiTurnRun:
    bench.fresh()
    per_turn = conversation_bodies(bench.static, turns)
    caches = {name: AnthropicCache(DEFAULT_MODEL, clock=bench.clock) for name in MULTI_TURN_VARIANTS}
    rows = []
    for turn, variants in enumerate(per_turn):
        if progress:
            progress(turn, turns, f"turn {turn + 1} of {turns}")
        rows += bench.send(variants, caches, turn)
        bench.clock.advance(gap_s)
    return MultiTurnRun(pd.DataFrame(rows), gap_s)


# ------------------------------------------------------------------------------------------------ minimum
@dataclass(frozen=True, slots=True)
class MinimumRun:
    """Two identical requests: what the engine reused vs what the provider billed as cached on the second."""

    model: str
    minimum: int  # the model's minimum cacheable prompt, in tokens
    frame: pd.DataFrame

    @property
    def prompt_tokens(self) -> int:
        return int(self.frame.prompt_tokens.iloc[1])

    @property
    def billed_cached(self) -> int:
        return int(self.frame.cache_read.iloc[1])

    @property
    def engine_reused(self) -> int:
        return int(self.frame.engine_cached.iloc[1])


def minimum_run(bench: HostedBench, *, static_tokens: int = 300, model: str = DEFAULT_MODEL) -> MinimumRun:
    static = static_instructions(bench.tokenizer, static_tokens)
    body = layout_body(static, "static first", 0, "Which rule covers lost cards?", model)
    return MinimumRun(model, AnthropicCache(model).min_tokens, bench.repeated([body, body]))


# ------------------------------------------------------------------------------------------------ HTTP
@dataclass(frozen=True, slots=True)
class HttpUsage:
    """Usage fields per request through the real HTTP server, per API, and the engine's own count."""

    frame: pd.DataFrame  # api, request, input_tokens, cache_write, cache_read, engine_cached, prompt_tokens

    @property
    def hit_rates(self) -> dict[str, float]:
        return {api: hit_rate(part) for api, part in self.frame.groupby("api")}

    @property
    def warm_hit_rates(self) -> dict[str, float]:
        """Per API, over the requests after the first, cold one."""
        return {api: warm_hit_rate(part) for api, part in self.frame.groupby("api")}

    @property
    def anthropic_hit_rate(self) -> float:
        return hit_rate(self.frame[self.frame.api.str.startswith("anthropic")])

    @property
    def fields_add_up(self) -> bool:
        """input + cache write + cache read = the whole prompt, on every request (what makes usage a measure)."""
        f = self.frame
        return bool((f.prompt_tokens == f.input_tokens + f.cache_write + f.cache_read).all())

    @property
    def engine_differs(self) -> bool:
        """Whether the engine's own cached count differs from what usage reports on some request."""
        return bool((self.frame.engine_cached != self.frame.cache_read).any())


def http_usage_run(bench: HostedBench, *, num_requests: int = 3) -> HttpUsage:
    """The same shared-prefix requests through the real HTTP server: Anthropic's /v1/messages (httpx) and
    the OpenAI emulation with ``prompt_cache_key`` (the official ``openai`` client). The server always stops."""
    import openai

    from workbench.serve.launch import ServerThread

    bench.fresh()
    rows = []
    with ServerThread(bench.engine, model_name="smollm2-135m") as server:
        client = openai.OpenAI(base_url=f"{server.url}/hosted/openai/v1", api_key="unused", max_retries=0)
        for i in range(num_requests):
            body = layout_body(bench.static, "static first", i, f"Which rule covers case {i + 1}?")
            reply = httpx.post(f"{server.url}/v1/messages", json=body.model_dump(exclude_none=True), timeout=300)
            reply.raise_for_status()
            usage = reply.json()["usage"]
            rows.append({"api": "anthropic /v1/messages", "request": i, "input_tokens": usage["input_tokens"],
                         "cache_write": usage["cache_creation_input_tokens"],
                         "cache_read": usage["cache_read_input_tokens"],
                         "engine_cached": int(reply.headers["x-workbench-engine-cached-tokens"])})
        for i in range(num_requests):
            chat = client.chat.completions.with_raw_response.create(
                model="gpt-4o", max_tokens=1, temperature=0, extra_body={"prompt_cache_key": "chapter-3"},
                messages=[{"role": "system", "content": bench.static},
                          {"role": "user", "content": f"Which rule covers case {i + 1}?"}])
            usage = chat.parse().usage
            cached = usage.prompt_tokens_details.cached_tokens
            rows.append({"api": "openai chat + prompt_cache_key", "request": i,
                         "input_tokens": usage.prompt_tokens - cached, "cache_write": 0, "cache_read": cached,
                         "engine_cached": int(chat.headers["x-workbench-engine-cached-tokens"])})
    frame = pd.DataFrame(rows)
    frame["prompt_tokens"] = frame["input_tokens"] + frame["cache_write"] + frame["cache_read"]
    return HttpUsage(frame)


def chapter_baseline(runs: dict[str, LayoutRun], model) -> Baseline:
    """The figures this chapter timed, for the cross-chapter registry: the misses of section 4 (the first
    request of each layout: nothing cached) and the timestamp-first requests after it, whose engine found 16
    cached tokens and computed the rest."""
    misses = [(r.frame.ttft_ms.iloc[0], r.frame.prompt_tokens.iloc[0]) for r in runs.values()]
    ttft, tokens = statistics.median(t for t, _ in misses), int(statistics.median(n for _, n in misses))
    fields: dict = {"prefill_ms_per_token": ttft / tokens, "prefill_tokens": tokens, "ttft_miss_ms": ttft,
                    "ttft_tokens": tokens}
    partial = [r for r in runs.values() if r.hit_rate == 0 and (r.frame.engine_cached.iloc[1:] > 0).any()]
    if partial:
        later = partial[0].frame.iloc[1:]
        new = later.prompt_tokens - later.engine_cached
        fields |= {"prefill_cached_ms_per_token": float((later.ttft_ms / new).median()),
                   "prefill_cached_tokens": int(new.median())}
    longer = ("one request per layout at ~1,100-1,150 tokens (past Anthropic's 1,024-token caching minimum), "
              "where chapters 1, 4 and 8 time 1,024-token prompts; the gap (about a third per token) is not "
              "explained here")
    return Baseline(chapter="ch03", machine=describe_machine(model.device),
                    dtype=str(model.dtype).removeprefix("torch."),
                    explanations={"prefill_ms_per_token": longer, "ttft_miss_ms": "the same requests"},
                    source="section 4's engine runs, one request at a time after an unbilled warm-up: the first "
                           "request of each layout (nothing cached: TTFT / prompt tokens) and the timestamp-first "
                           "requests after it (16 tokens from the engine's cache: TTFT / the tokens computed)",
                    **fields)
