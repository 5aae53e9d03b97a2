"""The disk tier's file handling (`workbench.cache.tier.disk_store`): two stores on one directory never read a torn
or mixed file, a full disk turns writes off without failing a request, the byte budget holds across restarts, and
the options that configure a tier refuse what they cannot do."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import threading
from contextlib import contextmanager

import pytest
import torch
from tiny_models import tiny_model

from workbench.cache.paged import PagedKVCache
from workbench.cache.tier.codec import BlockCodec
from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.disk_store import DiskStore
from workbench.cache.tier.keys import block_digests, fingerprint
from workbench.config import SpecConfig
from workbench.serve.options import add_offload_arguments, offload_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(num_layers=2)


def filled_cache(model, seed: int, blocks: int = 8) -> PagedKVCache:
    cache = PagedKVCache(model.spec, blocks, 16)
    generator = torch.Generator().manual_seed(seed)
    for tensor in cache.block_tensors():
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return cache


def store_for(model, cache, path, capacity_blocks: int = 64) -> tuple[DiskStore, BlockCodec]:
    codec = BlockCodec(cache)
    store = DiskStore(codec, capacity_blocks * (codec.bytes_per_block + 1024), path,
                      fingerprint(model, cache, codec.bytes_per_block))
    return store, codec


def test_two_stores_on_one_directory_never_read_a_torn_file(tiny, tmp_path):
    """Two writers of the same eight block names with different bytes, and a tight budget evicting under both: a
    read returns one writer's block whole, or nothing."""
    caches = [filled_cache(tiny, seed) for seed in (1, 2)]
    stores = [store_for(tiny, cache, tmp_path, capacity_blocks=5) for cache in caches]
    names = block_digests(stores[0][0].fingerprint, list(range(128)), 16, 8)
    tokens = [tuple(range(i * 16, (i + 1) * 16)) for i in range(8)]
    expected = [{bytes(c.block_tensors()[0][b].view(torch.uint8).reshape(-1).numpy()) for c in caches}
                for b in range(8)]
    seen, errors = [], []

    def hammer(store: DiskStore, codec: BlockCodec) -> None:
        try:
            for _ in range(40):
                store.save(codec, [(b, names[b], tokens[b]) for b in range(8)])
                for b in range(8):
                    for payload in store.reserve([names[b]], [tokens[b]]):
                        seen.append((b, bytes(payload[:codec.parts[0][2]])))
                    store._forget(names[b])  # forget the index, so the next round writes and reads the file again
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=hammer, args=pair) for pair in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and seen
    assert all(data in expected[b] for b, data in seen)
    assert all(store.skipped == {} for store, _ in stores)
    assert not list(tmp_path.rglob("*.tmp"))


@contextmanager
def file_size_limit(limit: int):
    """A real write failure: past RLIMIT_FSIZE the kernel refuses with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_turns_the_tier_off_and_no_request_fails(tiny, tmp_path, caplog):
    """Full before the engine starts (it cannot store its start-up measurement: no restores at all), and full
    while it serves (spills fail mid-run: writes stop, requests go on)."""
    from test_kv_offload import BLOCK, SMALL_POOL, run, sessions

    from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
    from workbench.engine.llm_engine import LLMEngine

    prompts = sessions(seed=5)
    reference, _ = run(tiny, prompts, blocks=256)
    config = KVOffloadConfig("disk", size_gib=0.05, directory=tmp_path / "a", write_policy="write_back")
    with caplog.at_level(logging.WARNING, logger="workbench.kv_offload"), file_size_limit(4096):
        got, engine = run(tiny, prompts, tier=config)
    assert got == reference and engine.kv_offload.rule.mode == "never"
    assert engine.kv_offload.store.degraded.startswith("EFBIG")
    caplog.clear()
    serving = LLMEngine(tiny, None, cache_config=CacheConfig(block_size=BLOCK, num_blocks=SMALL_POOL),
                        scheduler_config=SchedulerConfig(max_num_seqs=1),
                        kv_offload=KVOffloadConfig("disk", size_gib=0.05, directory=tmp_path / "b"))
    assert serving.kv_offload.rule.mode == "auto" and serving.kv_offload.store.degraded is None
    with caplog.at_level(logging.WARNING, logger="workbench.kv_offload"), file_size_limit(4096):
        got = [serving.generate([p], SamplingParams(max_tokens=6), progress=False, chat=False)[0].outputs[0].token_ids
               for p in prompts]
    store = serving.kv_offload.store
    assert got == reference and store.degraded.startswith("EFBIG") and store.dropped_blocks > 0
    assert sum("stopped storing" in r.getMessage() for r in caplog.records) == 1
    assert not list(tmp_path.rglob("*.kvb")) and not list(tmp_path.rglob("*.tmp"))


def test_the_budget_keeps_the_most_recent_blocks_across_a_restart(tiny, tmp_path):
    cache = filled_cache(tiny, 3)
    store, codec = store_for(tiny, cache, tmp_path, capacity_blocks=3)
    names = block_digests(store.fingerprint, list(range(128)), 16, 8)
    for b in range(8):
        store.save(codec, [(b, names[b], tuple(range(b * 16, (b + 1) * 16)))])
        if b >= 5:  # file times tick by the kernel's clock (a few ms): make the restart's order unambiguous
            os.utime(store.path_of(names[b]), (1000 + b, 1000 + b))
    assert len(store) == 3 and store.used_bytes <= store.capacity_bytes and store.evicted_blocks == 5
    stale = store.root / ".leftover.1.abcd.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    again, _ = store_for(tiny, cache, tmp_path, capacity_blocks=2)
    assert [names.index(d) for d in again._index] == [6, 7] and not stale.exists()


def test_a_tier_refuses_what_it_cannot_do(tiny, tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        KVOffloadConfig("ssd")
    with pytest.raises(ValueError, match=r"size_gib must be a number in \(0, 4096\]"):
        KVOffloadConfig("host", size_gib=0)
    with pytest.raises(ValueError, match="needs a directory"):
        KVOffloadConfig("disk")
    with pytest.raises(ValueError, match="keeps no files"):
        KVOffloadConfig("host", directory=tmp_path)
    with pytest.raises(ValueError, match="write_policy must be one of"):
        KVOffloadConfig("host", write_policy="lazy")
    from test_kv_offload import run
    with pytest.raises(ValueError, match="cannot hold one block"):
        run(tiny, [[1, 2, 3]], tier=KVOffloadConfig("host", size_gib=1e-6))
    from workbench.config import CacheConfig
    from workbench.engine.llm_engine import LLMEngine
    with pytest.raises(ValueError, match="turn prefix caching on"):
        LLMEngine(tiny, None, cache_config=CacheConfig(num_blocks=16, enable_prefix_caching=False),
                  kv_offload=KVOffloadConfig("host", size_gib=0.01))
    with pytest.raises(ValueError, match="draft model"):
        LLMEngine(tiny, None, cache_config=CacheConfig(num_blocks=16), draft_model=tiny,
                  spec_config=SpecConfig(method="draft"), kv_offload=KVOffloadConfig("host", size_gib=0.01))


def test_the_serve_options_build_the_tier_with_vllms_size_flag(tmp_path):
    parser = argparse.ArgumentParser()
    add_offload_arguments(parser)
    args = parser.parse_args(["--kv-offload", "disk", "--kv-offload-dir", str(tmp_path), "--kv-offloading-size", "2"])
    config = offload_config(args)
    assert (config.kind, config.size_gib, config.write_policy) == ("disk", 2.0, "write_through")
    assert offload_config(parser.parse_args([])) is None
    with pytest.raises(ValueError, match="--kv-offload-dir need --kv-offload"):
        offload_config(parser.parse_args(["--kv-offload-dir", str(tmp_path)]))
