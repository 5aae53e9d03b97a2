"""What a benchmark run did to the server's prefix cache and second KV tier, read from its /metrics before and
after the run: device-cache hits, tokens restored from the tier, and the tier's transfers (bytes, seconds) by
direction. vLLM's names, so the same lines come out against a vLLM server with its OffloadingConnector; a server
that exports none of them (or no /metrics at all) gets no line.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "device_queries": "vllm:prefix_cache_queries_total", "device_hits": "vllm:prefix_cache_hits_total",
    "tier_queries": "vllm:external_prefix_cache_queries_total", "tier_hits": "vllm:external_prefix_cache_hits_total",
}
BYTES, SECONDS = "vllm:kv_offload_total_bytes_total", "vllm:kv_offload_total_time_total"


def scrape(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict[tuple[str, str], float] | None:
    """Every sample of ``<base_url>/metrics`` by (name, labels), or None when it cannot be read."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=timeout_s)
        response.raise_for_status()
        return {(sample.name, _labels(sample.labels)): float(sample.value)
                for family in text_string_to_metric_families(response.text) for sample in family.samples}
    except (httpx.HTTPError, ValueError):
        return None


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _total(samples: dict, name: str, transfer_type: str | None = None) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name
               and (transfer_type is None or f'transfer_type="{transfer_type}"' in labels))


def offload_delta(before: dict | None, after: dict | None) -> dict | None:
    """The run's growth of the cache and tier counters; None when the server has no second tier (or no metrics)."""
    if before is None or after is None or not any(n == BYTES for n, _ in after):
        return None
    out = {key: _total(after, name) - _total(before, name) for key, name in COUNTERS.items()}
    for labels in sorted({labels for n, labels in after if n == BYTES}):
        kind = labels.split('transfer_type="')[1].split('"')[0]
        out[f"{kind}_bytes"] = _total(after, BYTES, kind) - _total(before, BYTES, kind)
        out[f"{kind}_seconds"] = _total(after, SECONDS, kind) - _total(before, SECONDS, kind)
    return out


def offload_line(delta: dict) -> str:
    moves = []
    for key in delta:
        if key.endswith("_bytes"):
            kind, seconds = key[:-6], delta[key[:-6] + "_seconds"]
            rate = f", {delta[key] / seconds / 1e9:.2f} GB/s" if seconds > 0 else ""
            moves.append(f"{kind} {delta[key] / 2**20:,.1f} MiB in {seconds:.2f} s{rate}")
    return (f"kv tiers    device cache hit {delta['device_hits']:,.0f} of {delta['device_queries']:,.0f} prompt tokens;"
            f" second tier restored {delta['tier_hits']:,.0f} of {delta['tier_queries']:,.0f} looked up; "
            + "; ".join(moves))
