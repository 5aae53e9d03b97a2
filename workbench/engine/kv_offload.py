"""The engine's side of a second KV tier (`workbench.cache.tier`): what it cannot combine with, and the prefill
cost the restore rule weighs a restore against, measured on the engine itself at start-up.

Calibration runs two scratch prompts of random token ids (one short, one long, twice each, the fastest kept)
through the engine with the tier switched off, and takes the prefill's marginal cost per token from the
difference, so the fixed cost of a step (scheduling, sampling, the LM head) cancels out; then it clears the
prefix cache, the counters and the metrics, so nothing of it shows in what follows. Transfers are timed by the
tier itself (`KVTier.measure_transfers`). About half a second for the real model on a quiet 2-core CPU (ten times
that on a loaded one).
"""

from __future__ import annotations

import logging
import random

from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.tier import KVTier, TierUnavailable
from workbench.config import SamplingParams, SpecConfig

REPEATS = 2
log = logging.getLogger("workbench.kv_offload")


def build_tier(config: KVOffloadConfig, model, cache, *, grouped: bool, spec_config: SpecConfig | None,
               prefix_caching: bool) -> KVTier:
    """The tier for ``cache``, after refusing what it cannot work with (each refusal says why)."""
    if not isinstance(config, KVOffloadConfig):
        raise ValueError(f"kv_offload must be a KVOffloadConfig (workbench.cache.tier), got {config!r}")
    if not prefix_caching:
        raise ValueError("a second KV tier holds what the prefix cache evicts: turn prefix caching on")
    if grouped:
        raise ValueError("the second KV tier names blocks by their full prefix, which sliding-window groups drop "
                         "from the cache: run models with layer_types without kv_offload")
    if spec_config is not None and spec_config.method == "draft":
        raise ValueError("a draft model keeps its own KV in the target's block ids, which a restore does not fill: "
                         "use the ngram method with kv_offload, or no tier")
    return KVTier.build(config, model, cache)


def prefill_lengths(engine) -> tuple[int, int]:
    """Two prompt lengths the pool holds whole: up to 4 blocks, and a quarter of that."""
    size = engine.cache_config.block_size
    longest = min(4 * size, (engine.blocks.num_blocks - 1) * size, engine.limits.max_context - 2)
    if longest < 2:
        raise ValueError(f"a KV pool of {engine.blocks.num_blocks} blocks of {size} is too small to calibrate the "
                         "second tier's rule: give it more blocks, or KVOffloadConfig(restore='always')")
    return max(1, longest // 4), longest


def measure_prefill_per_token(engine, seed: int = 0) -> float:
    """Seconds per prompt token of a prefill on ``engine``, from two lengths (the difference over the tokens)."""
    rng = random.Random(seed)
    short, long = prefill_lengths(engine)
    best = {}
    for length in (short, long) * REPEATS:
        prompt = [rng.randrange(100, engine.model.spec.vocab_size) for _ in range(length)]
        seen = len(engine.metrics.steps)
        request_id = engine.add_request(prompt, SamplingParams(max_tokens=1), chat=False,
                                        request_id=f"kv-offload-calibration-{rng.randrange(1 << 30)}")
        while request_id in engine.requests:
            engine.step()
        seconds = sum(s.duration_s for s in engine.metrics.steps[seen:] if s.num_prefill_tokens)
        best[length] = min(best.get(length, seconds), seconds)
        engine.blocks.clear_prefix_cache()
    per_token = (best[long] - best[short]) / (long - short)
    return per_token if per_token > 0 else best[long] / long


def calibrate(engine) -> None:
    """Measure the tier's transfers and the engine's prefill, and set the restore rule from them."""
    tier = engine.kv_offload
    if tier.config.restore != "auto":
        return
    blocks = engine.blocks
    blocks.enabled = False
    try:
        scratch = list(range(min(8, blocks.num_blocks)))
        store_cost, restore_cost = tier.measure_transfers(scratch)
        per_token = measure_prefill_per_token(engine)
    except TierUnavailable as why:  # e.g. a full disk: the engine runs as if it had no tier
        log.warning("the second KV tier cannot store blocks (%s): running without restores", why)
        tier.switch_off()
        return
    finally:
        blocks.enabled = True
        blocks.clear_prefix_cache()
        blocks.reset_stats()
        engine.metrics.reset()
    tier.calibrate(store_cost, restore_cost, per_token)
