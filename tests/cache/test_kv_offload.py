"""The second KV tier (`workbench.cache.tier`): greedy outputs identical to the engine without it on every exact
path, restores that really happen, the restore rule, and a disk tier that survives a restart and refuses what it
must not load. All on a 2-layer random model of SmolLM2's shape (real shapes, seconds a run)."""

from __future__ import annotations

import logging
import random

import pytest
from tiny_models import tiny_model

from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.keys import block_digests
from workbench.cache.tier.rule import RestoreRule, TransferCost
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 16
SMALL_POOL = 8  # blocks: one 5-block request at a time, so every other session's prefix is evicted in between


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(num_layers=2)


def sessions(count: int = 4, turns: int = 3, seed: int = 0) -> list[list[int]]:
    """Multi-turn traffic: each of ``count`` sessions comes back ``turns`` times with its 64-token history and a
    new half block, round robin, so a small pool has evicted a session by the time it returns."""
    rng = random.Random(seed)
    history = [[rng.randrange(100, 40000) for _ in range(64)] for _ in range(count)]
    return [history[i % count] + [rng.randrange(100, 40000) for _ in range(8)] for i in range(count * turns)]


def run(model, prompts, *, blocks=SMALL_POOL, tier=None, kv_format="auto", batch_invariant=False, together=False):
    engine = LLMEngine(model, None, cache_config=CacheConfig(block_size=BLOCK, num_blocks=blocks,
                                                             kv_cache_dtype=kv_format),
                       scheduler_config=SchedulerConfig(max_num_seqs=4 if together else 1,
                                                        max_num_batched_tokens=256),
                       kv_offload=tier, batch_invariant=batch_invariant)
    params = SamplingParams(max_tokens=6)
    if together:
        outputs = engine.generate(prompts, params, progress=False, chat=False)
    else:
        outputs = [engine.generate([p], params, progress=False, chat=False)[0] for p in prompts]
    return [o.outputs[0].token_ids for o in outputs], engine


def host(**kw) -> KVOffloadConfig:
    """A host tier that restores whatever it holds (the measured rule is tested on its own: exactness must not
    depend on what a loaded machine's timings decide)."""
    return KVOffloadConfig("host", size_gib=0.05, **{"restore": "always", **kw})


def disk(path, **kw) -> KVOffloadConfig:
    return KVOffloadConfig("disk", size_gib=0.05, directory=path, **{"restore": "always", **kw})


@pytest.mark.parametrize("kv_format,kind", [("auto", "host"), ("auto", "disk"), ("int8", "host"), ("int4", "disk"),
                                            ("fp8_e4m3", "host")])
def test_restored_blocks_give_the_tokens_of_an_engine_that_never_evicts(tiny, tmp_path, kv_format, kind):
    prompts = sessions()
    reference, _ = run(tiny, prompts, blocks=256, kv_format=kv_format)
    tier = host() if kind == "host" else disk(tmp_path)
    got, engine = run(tiny, prompts, tier=tier, kv_format=kv_format)
    assert got == reference
    counters = engine.kv_offload.counters
    # every return of a session restores its 4 history blocks (the device pool kept none of them)
    assert counters.restored_blocks == 4 * (len(prompts) - 4) and engine.blocks.stats.hit_tokens == 0
    assert counters.restore_bytes == counters.restored_blocks * engine.kv_offload.codec.bytes_per_block


@pytest.mark.parametrize("together", [False, True])
def test_the_batch_invariant_mode_stays_bit_identical_with_restores(tiny, together):
    prompts = sessions(seed=1)
    recomputed, plain = run(tiny, prompts, batch_invariant=True, together=together)
    restored, tiered = run(tiny, prompts, tier=host(restore="auto"), batch_invariant=True, together=together)
    assert restored == recomputed
    assert tiered.kv_offload.counters.restored_blocks > 0 and plain.blocks.stats.hit_tokens == 0


def test_never_restoring_recomputes_and_counts_what_it_declined(tiny):
    prompts = sessions(turns=2)
    reference, _ = run(tiny, prompts)
    got, engine = run(tiny, prompts, tier=host(restore="never"))
    c = engine.kv_offload.counters
    assert got == reference and c.restored_blocks == 0 and c.declined_blocks == c.available_blocks > 0


def test_the_rule_restores_from_its_crossover_on():
    restore = TransferCost(fixed_s=0.010, per_block_s=0.001, bytes_per_block=1000)
    rule = RestoreRule(restore, restore, prefill_s_per_token=0.001, block_size=16)  # recompute: 16 ms a block
    assert rule.crossover_blocks == 1 and rule.blocks_to_restore(1) == 1  # 11 ms < 16 ms
    slow = RestoreRule(TransferCost(0.050, 0.001, 1000), restore, prefill_s_per_token=0.001, block_size=16)
    assert slow.crossover_blocks == 4  # 50 + 4 = 54 ms < 64 ms; 3 blocks: 53 > 48
    assert [slow.blocks_to_restore(k) for k in (3, 4)] == [0, 4]
    never = RestoreRule(TransferCost(0.0, 0.020, 1000), restore, prefill_s_per_token=0.001, block_size=16)
    assert never.crossover_blocks == float("inf") and never.blocks_to_restore(100) == 0
    fit = TransferCost.fit(one_s=0.012, many_s=0.019, many=8, bytes_per_block=1000)
    assert fit.per_block_s == pytest.approx(0.001) and fit.fixed_s == pytest.approx(0.011)


def test_the_engine_measures_its_rule_at_start_up(tiny):
    _, engine = run(tiny, sessions(count=1, turns=1), tier=host(restore="auto"))
    rule = engine.kv_offload.rule
    assert rule.mode == "auto" and rule.restore.per_block_s > 0 and rule.prefill_s_per_token > 0
    assert engine.blocks.stats.queried_tokens == 72  # the calibration's prompts left no trace
    assert "restore" in engine.kv_offload.describe()


def test_a_restarted_engine_restores_from_the_disk_tier(tiny, tmp_path):
    prompts = sessions(count=2, turns=1, seed=2)
    first, writer = run(tiny, prompts, tier=disk(tmp_path))
    assert writer.kv_offload.counters.stored_blocks >= 8  # write-through: both histories are on disk
    again, reader = run(tiny, prompts, tier=disk(tmp_path))
    assert again == first and reader.kv_offload.counters.restored_blocks == 8


def test_write_back_stores_on_eviction_and_the_rest_at_close(tiny, tmp_path):
    prompts = sessions(count=2, turns=1, seed=3)
    _, engine = run(tiny, prompts, tier=disk(tmp_path, write_policy="write_back"))
    spilled = engine.kv_offload.counters.stored_blocks
    assert 0 < spilled < 8  # only the first history was evicted (to make room for the second)
    engine.close()
    assert engine.kv_offload.counters.stored_blocks == 8  # the rest at close: 4 full blocks of each request


def _first_block_file(engine, prompt):
    """The file of the prompt's first block (by its name, not by time: one save writes several in a millisecond)."""
    tier = engine.kv_offload
    return tier.store.path_of(block_digests(tier.root, prompt, BLOCK, 1)[0])


def _corrupt(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[:len(data) // 2]))
    elif how == "corrupt":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "corrupt", "foreign"])
def test_a_bad_block_file_is_skipped_with_a_warning_and_recomputed(tiny, tmp_path, caplog, how):
    prompts = sessions(count=1, turns=1, seed=4)
    first, writer = run(tiny, prompts, tier=disk(tmp_path))
    path = _first_block_file(writer, prompts[0])
    if how == "foreign":  # the same block, written by an engine with another KV format, under this tier's name
        other = run(tiny, prompts, tier=disk(tmp_path / "other"), kv_format="int8")[1]
        path.write_bytes(_first_block_file(other, prompts[0]).read_bytes())
    else:
        _corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger="workbench.kv_offload"):
        again, reader = run(tiny, prompts, tier=disk(tmp_path))
    assert again == first and reader.kv_offload.counters.restored_blocks == 0  # block 0 refused: the chain stops
    assert any(how in r.getMessage() and str(path) in r.getMessage() for r in caplog.records), caplog.text
    assert reader.kv_offload.store.skipped == {how: 1}
