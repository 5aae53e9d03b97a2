"""Prometheus series of a second KV tier (`workbench.cache.tier`), under vLLM's names where vLLM has them.

vLLM's OffloadingConnector (vLLM 0.11-0.14, ``offloading_connector.py``'s ``OffloadPromMetrics``) exports
``vllm:kv_offload_total_bytes``, ``vllm:kv_offload_total_time`` (seconds) and the histogram
``vllm:kv_offload_size`` (bytes per transfer), each labelled ``transfer_type`` with the media a copy goes between
(``GPU_to_CPU`` stores, ``CPU_to_GPU`` restores); the disk tier's are ``CPU_to_DISK`` / ``DISK_to_CPU`` (or
``GPU_to_DISK``), and a host tier under a CPU cache moves ``CPU_to_CPU``. Tokens a KV connector provides count as
``vllm:external_prefix_cache_queries`` / ``_hits``, and per tier in ``vllm:prompt_tokens_cached_by_source``
(``host`` or ``disk``). vLLM's histogram starts at 1 MB; this one adds 10 KB and 100 KB below it, where a
small model's blocks fall. Two series vLLM has no name for: the disk tier's usage, and whether its writes stopped
(a full disk), as ``workbench:`` series.

Only registered when the engine has a tier: a server without one exports none of these (as vLLM without a
connector), which tests/monitoring/test_prometheus_real.py checks.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# vLLM's transfer-size buckets (1 MB - 200 MB), with two smaller ones in front.
SIZE_BUCKETS = (1e4, 1e5, 1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)


class OffloadSeries:
    """The tier's series, fed from its counters' growth since the last ``export``."""

    def __init__(self, registry, labels: tuple[str, str], tier, cached_by_tier: dict) -> None:
        names, values = ["model_name", "engine"], list(labels)
        self.kinds = tier.transfer_types  # {"store": "GPU_to_CPU", "restore": "CPU_to_GPU"}
        by_type = names + ["transfer_type"]
        total_bytes = Counter("vllm:kv_offload_total_bytes", "Bytes moved by KV offloading.", by_type,
                              registry=registry)
        total_time = Counter("vllm:kv_offload_total_time", "Seconds spent in KV offloading transfers.", by_type,
                             registry=registry)
        sizes = Histogram("vllm:kv_offload_size", "KV offload transfer size, in bytes.", by_type,
                          buckets=SIZE_BUCKETS, registry=registry)
        self.bytes = {k: total_bytes.labels(*values, t) for k, t in self.kinds.items()}
        self.time = {k: total_time.labels(*values, t) for k, t in self.kinds.items()}
        self.sizes = {k: sizes.labels(*values, t) for k, t in self.kinds.items()}
        self.queries = Counter("vllm:external_prefix_cache_queries", "Prompt tokens looked up in the second KV "
                               "tier (after a device-cache miss).", names, registry=registry).labels(*values)
        self.hits = Counter("vllm:external_prefix_cache_hits", "Prompt tokens restored from the second KV tier.",
                            names, registry=registry).labels(*values)
        self.cached = cached_by_tier[tier.store.kind]
        self.usage = Gauge(f"workbench:kv_offload_{tier.store.kind}_usage_perc",
                           "Share of the second KV tier's budget in use. 1 means 100 percent.", names,
                           registry=registry).labels(*values)
        self.degraded = Gauge("workbench:kv_offload_writes_stopped", "1 once the tier stopped storing (a full "
                              "disk, a quota, a read-only file system); 0 while it stores.", names,
                              registry=registry).labels(*values)
        self._seen = _snapshot(tier.counters)

    def export(self, tier) -> None:
        c = tier.counters
        was, self._seen = self._seen, _snapshot(c)
        size = tier.block_size
        self.bytes["store"].inc(c.store_bytes - was["store_bytes"])
        self.bytes["restore"].inc(c.restore_bytes - was["restore_bytes"])
        self.time["store"].inc(c.store_seconds - was["store_seconds"])
        self.time["restore"].inc(c.restore_seconds - was["restore_seconds"])
        for kind, nbytes in tier.take_transfer_sizes():
            self.sizes[kind].observe(nbytes)
        self.queries.inc(size * (c.looked_up_blocks - was["looked_up_blocks"]))
        restored = size * (c.restored_blocks - was["restored_blocks"])
        self.hits.inc(restored)
        self.cached.inc(restored)
        store = tier.store
        self.usage.set(store.used_bytes / store.capacity_bytes)
        self.degraded.set(1 if store.degraded else 0)


_FIELDS = ("looked_up_blocks", "restored_blocks", "store_bytes", "restore_bytes", "store_seconds", "restore_seconds")


def _snapshot(counters) -> dict[str, float]:
    return {name: getattr(counters, name) for name in _FIELDS}
