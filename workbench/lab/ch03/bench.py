"""Chapter 3's bench: one warmed-up engine and a simulated clock, and the requests the chapter sends, in
Anthropic's format (a prompt layout, a growing conversation). Each request runs on the real engine, whose prefix
cache really skips the shared prefill, and is billed by the emulated provider (`workbench.hosted`); one row per
request and billing variant: the usage fields, the cost, the engine's own cached-token count and the TTFT.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.hosted import AnthropicCache, SimClock
from workbench.hosted.anthropic_cache import CacheUsage
from workbench.serve.anthropic_messages import MessagesRequest, render_blocks
from workbench.workloads import static_instructions

ProgressFn = Callable[[int, int, str], None]
LAYOUTS = ("static first", "timestamp first", "user id first")
DEFAULT_MODEL = "claude-sonnet-4-5"  # minimum 1,024 tokens: the workbench's prompts can reach it cheaply
STATIC_TOKENS = 1100
# 640 blocks of 16 tokens hold ~10k tokens of KV: every prompt of a run stays cached (no eviction muddles hits).
NUM_BLOCKS = 640


def _system(text: str, cache: bool, ttl: str = "5m") -> dict:
    block: dict = {"type": "text", "text": text}
    if cache:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return block


def layout_body(static: str, layout: str, index: int, question: str, model: str = DEFAULT_MODEL) -> MessagesRequest:
    """A request whose system prompt is the shared ``static`` text plus a per-request line (a timestamp or a
    user id), placed after the breakpoint ("static first") or before the static text (the other layouts)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    stamp = f"Current time: 2026-11-23 09:{index // 60:02d}:{index % 60:02d} UTC."
    user = f"User id: u-{7919 * (index + 1) % 100_000:05d}."
    dynamic = user if layout == "user id first" else stamp
    system = ([_system(static, True), _system(dynamic, False)] if layout == "static first"
              else [_system(f"{dynamic}\n{static}", True)])
    return MessagesRequest(model=model, max_tokens=1, system=system,
                           messages=[{"role": "user", "content": question}])


class HostedBench:
    """One warmed-up engine and a simulated clock for every run of the chapter."""

    def __init__(self, model, tokenizer, *, num_blocks: int = NUM_BLOCKS) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks),
                                scheduler_config=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=4))
        self.static = static_instructions(tokenizer, STATIC_TOKENS)
        # The first forwards allocate; run one unrelated prompt of the same size so request 1 is a fair miss.
        warm = self.tokenizer.encode(self.static[::-1], add_special_tokens=False)[:STATIC_TOKENS]
        self.engine.generate([warm], SamplingParams(max_tokens=1), progress=False)
        self.clock = SimClock()

    def fresh(self) -> None:
        """Forget every cached prefix (the engine's and the clock's), as a new deployment would."""
        self.engine.blocks.clear_prefix_cache()
        self.engine.blocks.reset_stats()
        self.clock = SimClock()

    def run_engine(self, ids: list[int]) -> tuple[float, int]:
        """(TTFT in ms, prompt tokens the engine's prefix cache supplied) of one request sent alone."""
        self.engine.generate([ids], SamplingParams(max_tokens=1), progress=False)
        row = self.engine.metrics.request_frame().iloc[-1]
        return float(row["ttft_s"]) * 1e3, int(row["cached_prompt_tokens"])

    def send(self, variants: dict[str, MessagesRequest], caches: dict[str, AnthropicCache],
             index: int) -> list[dict]:
        """Run one request on the engine and bill it under each variant (same tokens, different breakpoints)."""
        rendered = {name: render_blocks(self.tokenizer, body) for name, body in variants.items()}
        token_lists = {name: [t for b in blocks for t in b.tokens] for name, blocks in rendered.items()}
        ids = next(iter(token_lists.values()))
        if any(t != ids for t in token_lists.values()):
            raise ValueError("billing variants must render to the same tokens (only cache_control may differ)")
        usages = {name: caches[name].begin(blocks) for name, blocks in rendered.items()}
        sent_at = self.clock()
        ttft_ms, engine_cached = self.run_engine(ids)
        self.clock.advance(ttft_ms / 1e3)  # simulated time passes as the real prefill does
        rows = []
        for name, usage in usages.items():
            caches[name].mark_started(usage, self.clock())
            rows.append(_row(index, sent_at, name, usage, variants[name].model, ttft_ms, engine_cached))
        return rows

    def repeated(self, bodies: list[MessagesRequest], *, gap_s: float = 10.0, variant: str = "",
                 progress: ProgressFn | None = None) -> pd.DataFrame:
        """Send ``bodies`` one after another (each ``gap_s`` simulated seconds after the previous one's first
        token), from a fresh cache."""
        self.fresh()
        cache = AnthropicCache(bodies[0].model, clock=self.clock)
        rows = []
        for i, body in enumerate(bodies):
            if progress:
                progress(i, len(bodies), f"request {i + 1} of {len(bodies)}")
            rows += self.send({variant: body}, {variant: cache}, i)
            self.clock.advance(gap_s)
        return pd.DataFrame(rows)

    def warm_up(self, body: MessagesRequest) -> float:
        """Run ``body`` once on the engine, unbilled, and forget its prefix; returns its TTFT in ms.

        The first request of a run pays one-off costs (allocations, first-touch of the KV blocks) that are no
        part of a cache miss: a run sends its first prompt once as a warm-up, so its request 1 is a fair miss."""
        ttft_ms, _ = self.run_engine([t for b in render_blocks(self.tokenizer, body) for t in b.tokens])
        self.fresh()
        return ttft_ms


def _row(index: int, when: float, variant: str, usage: CacheUsage, model: str, ttft_ms: float,
         engine_cached: int) -> dict:
    return {"request": index, "time_s": when, "variant": variant, "prompt_tokens": usage.prompt_tokens,
            "input_tokens": usage.input_tokens, "cache_write": usage.cache_creation_input_tokens,
            "cache_read": usage.cache_read_input_tokens, "cost_usd": usage.cost_usd(model),
            "engine_cached": engine_cached, "ttft_ms": ttft_ms}


# ------------------------------------------------------------------------------------------- multi-turn
MULTI_TURN_VARIANTS = ("breakpoint on the last message", "breakpoint on the system prompt only")


def conversation_bodies(static: str, turns: int, model: str = DEFAULT_MODEL) -> list[dict[str, MessagesRequest]]:
    """Per turn, the same growing conversation with its breakpoint in each of the two places."""
    history: list[dict] = []
    out = []
    for turn in range(turns):
        detail = " ".join(f"Order {turn * 100 + k} weighs {3 + (turn * 7 + k) % 11} kg and goes to depot "
                          f"{(turn + k) % 13}." for k in range(8))
        history.append({"role": "user", "content": f"{detail} Which depot handles the heaviest order?"})
        variants = {}
        for name in MULTI_TURN_VARIANTS:
            moving = name == MULTI_TURN_VARIANTS[0]
            messages = [dict(m) for m in history]
            if moving:
                messages[-1] = {"role": "user", "content": [_system(messages[-1]["content"], True)]}
            variants[name] = MessagesRequest(model=model, max_tokens=1, system=[_system(static, True)],
                                             messages=messages)
        out.append(variants)
        history.append({"role": "assistant", "content": f"Depot {turn % 13} handles it, by rule {turn + 2}."})
    return out


