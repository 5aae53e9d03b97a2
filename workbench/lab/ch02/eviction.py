"""Chapter 2's eviction measurements: prefix-cache hit rate against the cache budget, measured on the engine
(LRU), with LFU set beside it by replaying the same request stream through `workbench.lab.ch02.policy_sim`.

``EvictionSweep`` is one stream on the engine and the simulator (whose LRU must land on the engine's points:
that is the check that its LFU is comparable); ``PolicyComparison`` runs both policies over longer streams,
where the simulator alone is fast enough. No widgets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd

from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.ch02.policy_sim import policy_sweep
from workbench.lab.ch02.runs import ProgressFn, _progress, _sequential_ttft

PATTERNS = ("round robin", "skewed (Zipf)", "shifting hot set")
LONG_PATTERNS = ("skewed (Zipf)", "shifting hot set")
ZIPF_S = 1.2
PREFIX_TOKENS, BLOCK_SIZE = 64, 16


def access_order(num_prefixes: int, num_requests: int, pattern: str, seed: int = 0) -> list[int]:
    """Which shared prefix each request uses: cycling through all; a few hot ones (Zipf, s = 1.2); or Zipf whose
    ranking reverses halfway, so the prefixes that were hot go cold (a new system prompt ships, say)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if pattern == "round robin":
        return [i % num_prefixes for i in range(num_requests)]
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(num_prefixes)]
    order = rng.choices(range(num_prefixes), weights=weights, k=num_requests)
    if pattern == "shifting hot set":
        half = num_requests // 2
        order[half:] = [num_prefixes - 1 - k for k in order[half:]]
    return order


def eviction_prompts(num_prefixes: int, num_requests: int, pattern: str, *, prefix_tokens: int = PREFIX_TOKENS,
                     block_size: int = BLOCK_SIZE) -> list[list[int]]:
    """The request stream of the eviction sweep: each prompt is one of ``num_prefixes`` shared prefixes of
    ``prefix_tokens`` token ids followed by half a block of its own."""
    rng = random.Random(7)
    prefixes = [[rng.randrange(100, 30000) for _ in range(prefix_tokens)] for _ in range(num_prefixes)]
    order = access_order(num_prefixes, num_requests, pattern)
    return [prefixes[k] + [rng.randrange(100, 30000) for _ in range(block_size // 2)] for k in order]


def budgets_for(num_prefixes: int, prefix_tokens: int = PREFIX_TOKENS, block_size: int = BLOCK_SIZE) -> list[int]:
    """Cache budgets (blocks) from barely one request to past the working set of ``num_prefixes`` prefixes."""
    working = num_prefixes * (prefix_tokens // block_size)
    smallest = -(-(prefix_tokens + block_size // 2 + 1) // block_size)
    steps = [smallest, working // 4, working // 2, 3 * working // 4, working - 1, working, working + 2,
             working * 3 // 2]
    return sorted({max(smallest, b) for b in steps})


def eviction_sweep(model, tokenizer, budgets: list[int], *, num_prefixes: int = 4, pattern: str = "round robin",
                   num_requests: int = 16, prefix_tokens: int = PREFIX_TOKENS, block_size: int = BLOCK_SIZE,
                   progress: ProgressFn | None = None) -> pd.DataFrame:
    """Prefix-cache hit rate for the same request stream under different cache budgets (in blocks).

    Each request is one of ``num_prefixes`` shared prefixes followed by its own few tokens; they run one at a
    time, so the only thing that differs between budgets is what the LRU cache had to evict."""
    prompts = eviction_prompts(num_prefixes, num_requests, pattern, prefix_tokens=prefix_tokens,
                               block_size=block_size)
    smallest = -(-(len(prompts[0]) + 1) // block_size)
    if min(budgets) < smallest:
        raise ValueError(f"every budget must hold one request ({smallest} blocks of {block_size}), got {min(budgets)}")
    rows = []
    for done, budget in enumerate(budgets):
        _progress(progress, done, len(budgets), f"budget {budget} blocks")
        engine = LLMEngine(model, tokenizer,
                           cache_config=CacheConfig(block_size=block_size, num_blocks=budget),
                           scheduler_config=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=1))
        frame = _sequential_ttft(engine, prompts, None)
        stats = engine.blocks.stats
        rows.append({"budget_blocks": budget, "budget_tokens": budget * block_size, "hit_rate": stats.hit_rate,
                     "requests_hit": int(frame["hit"].sum()), "evicted_blocks": stats.evicted_blocks,
                     "mean_ttft_ms": frame["ttft_ms"].mean()})
    _progress(progress, len(budgets), len(budgets), "done")
    frame = pd.DataFrame(rows)
    frame.attrs["working_set_blocks"] = num_prefixes * (prefix_tokens // block_size)
    return frame


def policy_frame(sim: pd.DataFrame) -> pd.DataFrame:
    """Hit rate per budget (rows) and policy (columns) of a `policy_sweep` result."""
    return sim.pivot(index="budget_blocks", columns="policy", values="hit_rate")


def largest_gap(sim: pd.DataFrame) -> float:
    """LFU's hit rate minus LRU's at the budget where the two differ most."""
    rates = policy_frame(sim)
    diff = rates["LFU"] - rates["LRU"]
    return float(diff.loc[diff.abs().idxmax()])


@dataclass
class EvictionSweep:
    """One request stream under several budgets: the engine's measured LRU and the simulator's LRU and LFU."""

    pattern: str
    num_prefixes: int
    num_requests: int
    frame: pd.DataFrame  # the engine, per budget: hit_rate, requests_hit, evicted_blocks, mean_ttft_ms
    sim: pd.DataFrame  # the simulator, per budget and policy

    @property
    def working_set(self) -> int:
        return int(self.frame.attrs["working_set_blocks"])

    @property
    def simulator_matches_engine(self) -> bool:
        lru = self.sim[self.sim["policy"] == "LRU"].reset_index(drop=True)
        engine = self.frame.reset_index(drop=True)
        return bool(lru["hit_rate"].equals(engine["hit_rate"])
                    and lru["evicted_blocks"].equals(engine["evicted_blocks"]))

    @property
    def policy_rates(self) -> pd.DataFrame:
        """The simulator's hit rate per budget (rows) and policy (columns) on this stream."""
        return policy_frame(self.sim)

    @property
    def policy_gaps(self) -> dict[str, float]:
        return {f"{self.pattern}, {self.num_requests} requests": largest_gap(self.sim)}

    @property
    def budget_spread(self) -> float:
        """How far the cache budget moves the engine's token hit rate (highest minus lowest)."""
        return float(self.frame["hit_rate"].max() - self.frame["hit_rate"].min())

    def below_working_set(self) -> str:
        """What the engine kept under budgets smaller than the working set, read from its own table."""
        short = self.frame[self.frame["budget_blocks"] < self.working_set]
        hit = short[short["hit_rate"] > 0]
        if hit.empty:
            return (f"under every budget below the working set ({self.working_set} blocks) the hit rate was zero: "
                    "each request's prefix had been evicted before it came round again")
        first = hit.iloc[0]
        missed = short[short["hit_rate"] == 0]
        none = (f" With {int(missed['budget_blocks'].max())} blocks or fewer nothing survived a cycle."
                if len(missed) else "")
        short_by = self.working_set - int(first["budget_blocks"])
        return (f"{int(first['budget_blocks'])} blocks, {short_by} fewer than the working set of {self.working_set}, "
                f"still gave a hit rate of {first['hit_rate']:.0%} ({int(first['requests_hit'])} "
                f"requests hit): the engine releases a finished request's blocks deepest first, so LRU evicts the "
                "deep end of an old prefix before its first blocks, and the next request with that prefix finds "
                "them. That is the prefix-aware order the book describes, measured." + none)


def eviction_run(model, tokenizer, *, num_prefixes: int = 4, num_requests: int = 24, pattern: str = PATTERNS[0],
                 progress: ProgressFn | None = None) -> EvictionSweep:
    budgets = budgets_for(num_prefixes)
    frame = eviction_sweep(model, tokenizer, budgets, num_prefixes=num_prefixes, pattern=pattern,
                           num_requests=num_requests, progress=progress)
    sim = policy_sweep(eviction_prompts(num_prefixes, num_requests, pattern), budgets, BLOCK_SIZE)
    return EvictionSweep(pattern, num_prefixes, num_requests, frame, sim)


@dataclass
class PolicyComparison:
    """LRU against LFU over longer simulated streams, one sweep of budgets per access pattern."""

    num_prefixes: int
    num_requests: int
    sims: dict[str, pd.DataFrame]  # pattern -> policy_sweep frame

    @property
    def policy_gaps(self) -> dict[str, float]:
        return {f"{p}, {self.num_requests} requests": largest_gap(s) for p, s in self.sims.items()}

    @property
    def budget_spreads(self) -> dict[str, float]:
        """Per pattern: how far the budget moves LRU's hit rate."""
        return {p: float(policy_frame(s)["LRU"].max() - policy_frame(s)["LRU"].min()) for p, s in self.sims.items()}


def policy_comparison(num_prefixes: int = 5, num_requests: int = 200) -> PolicyComparison:
    budgets = budgets_for(num_prefixes)
    return PolicyComparison(num_prefixes, num_requests, {
        p: policy_sweep(eviction_prompts(num_prefixes, num_requests, p), budgets, BLOCK_SIZE) for p in LONG_PATTERNS})
