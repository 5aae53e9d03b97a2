"""A second KV tier under the prefix cache: blocks the device's cache evicts are kept in host memory or on disk,
and restored instead of recomputed when the costs measured at start-up say it pays.

    config.py       KVOffloadConfig: kind (host / disk), size in GiB, directory, write policy, restore mode
    keys.py         the tier's block names (a SHA-256 chain rooted in a fingerprint of model, weights and format)
    codec.py        whole blocks <-> rows of bytes, in the cache's own format (quantized blocks move as they are)
    host_store.py   a pool of rows in (pinned) host memory with its own LRU
    disk_store.py   one checked file per block, atomic writes, a byte budget and LRU, survives a restart
    file_format.py  a block file's header (model, weights, KV format, block size, checksum) and its checks
    rule.py         restore or recompute: measured transfer and prefill costs, and where they cross
    manager.py      the block manager's hooks: spill on eviction, restore at admission, write-through
    tier.py         KVTier: the store, the codec, the rule and the counters, as the engine holds them
"""

from workbench.cache.tier.config import KVOffloadConfig

__all__ = ["KVOffloadConfig"]
