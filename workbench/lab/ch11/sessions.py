"""Chapter 11's engine runs that check its simulator: one request stream through the engine and through the
two-tier simulator, device alone and with a tier. The sessions themselves are `workbench.bench.sessions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.bench.sessions import ARMS, SessionsRun, multi_turn
from workbench.cache.tier.config import KVOffloadConfig
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.ch02.eviction import eviction_prompts
from workbench.lab.ch11.tier_sim import TierSimResult, simulate_tiers

BLOCK_SIZE = 16
__all__ = ["ARMS", "EngineCheck", "SessionsRun", "engine_check", "multi_turn", "stream"]


# ------------------------------------------------------------------------------------- engine against simulator
@dataclass
class EngineCheck:
    """One request stream through the engine and the simulator, device alone and with a tier."""

    sessions: int
    device_blocks: int
    tier_blocks: int
    engine: dict[str, tuple[int, int, int]]  # "device only"/"device + tier" -> (queried, device hits, restored)
    sim: dict[str, TierSimResult]

    @property
    def matches(self) -> bool:
        return all(self.engine[k] == (s.queried_tokens, s.device_hit_tokens, s.restored_tokens)
                   for k, s in self.sim.items())


def stream(sessions: int, requests: int) -> list[list[int]]:
    """Chapter 2's eviction stream: ``sessions`` 64-token prefixes, round robin, each with half a block of its own."""
    return eviction_prompts(sessions, requests, "round robin")


def engine_check(model, *, sessions: int, device_blocks: int, tier_blocks: int, requests: int = 12) -> EngineCheck:
    prompts = stream(sessions, requests)
    engine_counts, sims = {}, {}
    for label, blocks in (("device only", 0), ("device + tier", tier_blocks)):
        tier = None
        if blocks:
            per_block = _bytes_per_block(model)
            tier = KVOffloadConfig("host", size_gib=(blocks + 0.5) * per_block / 2**30, restore="always")
        engine = LLMEngine(model, None, cache_config=CacheConfig(block_size=BLOCK_SIZE, num_blocks=device_blocks),
                           scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=512),
                           kv_offload=tier)
        for prompt in prompts:
            engine.generate([prompt], SamplingParams(max_tokens=1), progress=False, chat=False)
        restored = engine.kv_offload.counters.restored_blocks * BLOCK_SIZE if engine.kv_offload else 0
        stats = engine.blocks.stats
        engine_counts[label] = (stats.queried_tokens, stats.hit_tokens, restored)
        sims[label] = simulate_tiers(prompts, device_blocks, BLOCK_SIZE, blocks)
    return EngineCheck(sessions, device_blocks, tier_blocks, engine_counts, sims)


def _bytes_per_block(model) -> int:
    from workbench.cache.sizing import kv_bytes_per_token

    return kv_bytes_per_token(model.spec, "auto", model.dtype) * BLOCK_SIZE
