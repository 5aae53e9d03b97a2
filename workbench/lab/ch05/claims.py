"""Chapter 5's checks of the book's loose claims, and the priority-scheduling run.

- The book's dynamic batcher is said to "collect requests for up to T ms", but its loop pops only what is
  already queued and leaves as soon as the queue is empty: it never waits. `dynamic_wait_effect` runs the
  engine's dynamic batching with a wait of 0 (what that loop does) and with a real wait on the same Poisson
  arrivals and counts how many requests each batch started with.
- "Larger blocks reduce fragmentation overhead": `block_waste` computes, for a workload's final sequence
  lengths, the KV slots reserved but never written (internal fragmentation), which *grows* with the block size.
  What larger blocks reduce is the number of block-table entries.
- "gpu_memory_utilization controls how much GPU memory is reserved for the KV cache (the remainder goes to
  the weights)": `utilization_split` shows that the fraction caps the whole instance (weights, activation peak
  and cache together), as the engine's own `workbench.cache.sizing.block_budget` does, and vLLM documents.
- `priority_run` → `PriorityRun` overloads a small engine with interactive (priority 0) and batch (priority 1)
  requests and compares FCFS with the priority policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from workbench.bench.drive import drive
from workbench.cache.sizing import block_budget, weight_bytes
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.evidence import TIMING_FLOOR, Evidence
from workbench.lab.kit.feasibility import check, smallest_feasible
from workbench.models import model_spec
from workbench.workloads import WorkloadRequest

GiB = 2**30


def batch_sizes_at_start(requests: pd.DataFrame) -> pd.Series:
    """How many requests each static or dynamic batch started with: admissions sharing one step's timestamp."""
    return requests.groupby("first_scheduled").size()


def dynamic_wait_effect(make_engine: Callable[[float], LLMEngine], workload: list[WorkloadRequest], *,
                        rate: float, waits_s: tuple[float, ...] = (0.0, 0.25), seed: int = 0) -> pd.DataFrame:
    """Dynamic batching on the same Poisson arrivals with different waits: batch sizes and latency."""
    rows = []
    for wait in waits_s:
        run = drive(make_engine(wait), workload, request_rate=rate, seed=seed)
        sizes = batch_sizes_at_start(run.requests)
        rows.append({"max_wait_ms": wait * 1e3, "batches": len(sizes), "mean_batch": float(sizes.mean()),
                     "queue_p50_ms": float(run.requests["queue_s"].median() * 1e3),
                     "ttft_p50_ms": run.summary["ttft_median_ms"], "output_tok_s": run.summary["output_throughput"]})
    return pd.DataFrame(rows)


def wait_reading(waits: pd.DataFrame) -> str:
    """What a real dynamic-batching wait bought and cost, read from ``dynamic_wait_effect`` against the timing
    noise of one run each (``TIMING_FLOOR``)."""
    none, wait = waits.iloc[0], waits.iloc[-1]

    def change(column: str, unit: str) -> str:
        ratio = wait[column] / none[column]
        inside = abs(ratio - 1) <= TIMING_FLOOR
        return (f"{none[column]:.0f} → {wait[column]:.0f} {unit} ({ratio - 1:+.0%}"
                f"{', within the noise' if inside else ''})")

    return (f"a {wait['max_wait_ms']:.0f} ms wait started {wait['batches']:.0f} batches of {wait['mean_batch']:.1f} "
            f"requests instead of {none['batches']:.0f} of {none['mean_batch']:.1f}; TTFT p50 "
            f"{change('ttft_p50_ms', 'ms')}, throughput {change('output_tok_s', 'tokens/s')} (one run each, ±"
            f"{TIMING_FLOOR:.0%} is this machine's run-to-run noise)")


def padding_reading(share: float, seed_range: tuple[float, float] = (0.5, 0.7)) -> str:
    """Where a padding share falls against the book's 50-70%."""
    low, high = seed_range
    where = "inside" if low <= share <= high else ("below" if share < low else "above")
    return f"{share:.0%} of the padded slots are padding ({where} the book's {low:.0%}–{high:.0%})"


def seed_batch_feasibility(model: str = "llama-3-70b", device: str = "A100 80GB",
                           batches: tuple[int, ...] = (64, 256),
                           contexts: tuple[int, ...] = (1024, 4096)) -> pd.DataFrame:
    """The book's "a 70B model on an A100 needs batches of 64-256", checked as a deployment
    (`workbench.lab.kit.feasibility`): whether one GPU holds the weights and the batch's KV (bf16), and the
    smallest tensor-parallel degree that does, with the floor of one decode step there."""
    rows = []
    for batch in batches:
        for context in contexts:
            one, fits = check(model, device, batch=batch, context=context), smallest_feasible(
                model, device, batch=batch, context=context)
            rows.append({"batch": batch, "context": context,
                         f"on one {device}": "fits" if one.fits else f"needs TP >= {one.smallest_tp}",
                         "smallest TP": fits.tp if fits.fits else None,
                         "GiB per GPU there": (fits.weight_bytes_per_gpu + fits.kv_bytes_per_gpu) / GiB,
                         "decode step floor (ms)": fits.decode_floor_ms})
    return pd.DataFrame(rows)


def block_waste(total_lengths: list[int], block_sizes: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)
                ) -> pd.DataFrame:
    """Per block size: KV slots reserved for the sequences' final lengths, the share never written, and the
    number of block-table entries (what larger blocks do save)."""
    lengths = np.asarray(total_lengths)
    if len(lengths) == 0 or (lengths < 1).any():
        raise ValueError("total_lengths must be a non-empty list of lengths >= 1")
    rows = []
    for size in block_sizes:
        blocks = -(-lengths // size)
        slots = int((blocks * size).sum())
        rows.append({"block_size": size, "reserved_slots": slots, "wasted_share": 1 - lengths.sum() / slots,
                     "table_entries": int(blocks.sum())})
    return pd.DataFrame(rows)


def utilization_split(model: str = "llama-3-8b", device_gib: float = 80.0, utilization: float = 0.9,
                      activation_gib: float = 2.0) -> pd.DataFrame:
    """Memory of one GPU under ``gpu_memory_utilization``: the book's reading (the fraction is the KV cache)
    beside what the engine (and vLLM) do: the fraction caps weights + activation peak + KV together."""
    spec = model_spec(model)
    budget = block_budget(spec, int(device_gib * GiB), utilization=utilization,
                          activation_bytes=int(activation_gib * GiB))
    weights = weight_bytes(spec, torch.bfloat16) / GiB
    return pd.DataFrame([
        {"reading": "the book: the fraction is reserved for the KV cache", "weights_GiB": weights,
         "activations_GiB": activation_gib, "kv_GiB": device_gib * utilization,
         "total_GiB": weights + activation_gib + device_gib * utilization},
        {"reading": "engine / vLLM: the fraction caps everything", "weights_GiB": weights,
         "activations_GiB": activation_gib, "kv_GiB": budget.kv_budget_bytes / GiB,
         "total_GiB": weights + activation_gib + budget.kv_budget_bytes / GiB},
    ]).set_index("reading")


def with_priorities(workload: list[WorkloadRequest], every: int = 3) -> list[WorkloadRequest]:
    """Every ``every``-th request becomes interactive (priority 0); the rest are batch jobs (priority 1)."""
    return [replace(r, tags={**r.tags, "priority": "0" if i % every == 0 else "1",
                             "class": "interactive" if i % every == 0 else "batch"}) for i, r in enumerate(workload)]


@dataclass(frozen=True)
class PriorityRun:
    """Per policy and class: requests, TTFT p50 and max (a few requests per class: no p99), queue, preemptions."""

    frame: pd.DataFrame

    def cell(self, policy: str, cls: str, column: str) -> float:
        t = self.frame
        return float(t[(t["policy"] == policy) & (t["class"] == cls)][column].iloc[0])

    @property
    def interactive_speedup(self) -> float:
        """Interactive TTFT p50 under FCFS over the same under priority."""
        return self.cell("fcfs", "interactive", "ttft_p50_ms") / self.cell("priority", "interactive", "ttft_p50_ms")

    def interactive_evidence(self) -> Evidence:
        """FCFS over priority interactive TTFT p50, resampled over the few interactive requests."""
        t = self.frame.set_index(["policy", "class"])["ttft_ms_all"]
        return Evidence.bootstrap("interactive TTFT p50, FCFS / priority", t[("fcfs", "interactive")],
                                  t[("priority", "interactive")])

    def reading(self) -> str:
        """What priority did for the interactive requests, said only as far as the evidence carries."""
        e = self.interactive_evidence()
        fcfs, prio = self.cell("fcfs", "interactive", "ttft_p50_ms"), self.cell("priority", "interactive",
                                                                                 "ttft_p50_ms")
        if not e.resolved:
            return (f"interactive TTFT p50 {fcfs:.0f} ms under FCFS, {prio:.0f} ms under priority: within the noise "
                    f"(n = {e.n_label}, margin ±{e.margin:.2f}x around {e.effect:.2f}x), so priority changed nothing "
                    "measurable here: with little queue there is little to reorder")
        return (f"interactive TTFT p50 {fcfs:.0f} ms under FCFS, {prio:.0f} ms under priority: "
                f"{'faster' if e.holds else 'slower'} with priority ({e.effect:.2f}x, margin ±{e.margin:.2f}x, "
                f"n = {e.n_label})")


def priority_run(make_engine: Callable[[str], LLMEngine], workload: list[WorkloadRequest], *,
                 rate: float | None = None, seed: int = 0) -> PriorityRun:
    """FCFS vs priority on the same overload: per policy and class, TTFT p50/max, queue time, preemptions."""
    rows = []
    for policy in ("fcfs", "priority"):
        run = drive(make_engine(policy), workload, request_rate=rate, seed=seed)
        for name, group in run.requests.groupby("class"):
            rows.append({"policy": policy, "class": name, "requests": len(group),
                         "ttft_p50_ms": float(group["ttft_s"].median() * 1e3),
                         "ttft_max_ms": float(group["ttft_s"].max() * 1e3),
                         "queue_p50_ms": float(group["queue_s"].median() * 1e3),
                         "preemptions": int(group["preemptions"].sum()),
                         "ttft_ms_all": (group["ttft_s"] * 1e3).tolist()})
    return PriorityRun(pd.DataFrame(rows))


def alternating_families(requests: int = 8, *, prefix_tokens: int = 64, suffix_tokens: int = 8,
                         seed: int = 0, vocab_size: int = 49152) -> list[WorkloadRequest]:
    """Two families of prompts (each its own shared prefix) alternating in the queue: x, y, x, y, ..."""
    rng, high = random.Random(seed), min(30000, vocab_size)
    prefixes = [[rng.randrange(high // 2, high) for _ in range(prefix_tokens)] for _ in range(2)]
    return [WorkloadRequest(prefixes[i % 2] + [rng.randrange(high // 2, high) for _ in range(suffix_tokens)], 2,
                            ignore_eos=True, tags={"family": "xy"[i % 2]}) for i in range(requests)]


def cache_aware_hit_rates(make_engine: Callable[[bool], LLMEngine], workload: list[WorkloadRequest]) -> pd.DataFrame:
    """Prefix-cache hit rate of the same queue admitted FCFS and cache-aware (all requests waiting at once)."""
    rows = []
    for aware in (False, True):
        engine = make_engine(aware)
        engine.blocks.reset_stats()
        run = drive(engine, workload)
        stats = engine.blocks.stats
        rows.append({"admission": "cache-aware" if aware else "FCFS",
                     "hit_rate": stats.hit_tokens / stats.queried_tokens,
                     "cached_prompt_tokens": int(run.requests["cached_prompt_tokens"].sum()),
                     "output_tok_s": run.summary["output_throughput"]})
    return pd.DataFrame(rows).set_index("admission")
