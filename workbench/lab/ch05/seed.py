"""Chapter 5's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch05.csv)."""

from __future__ import annotations

import pandas as pd

from workbench.config import SchedulerConfig
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import check, smallest_feasible


def _a100_price() -> str:
    return ("set aside: the workbench keeps no GPU rental prices (they change by provider and month); nothing in "
            "the chapter depends on the figure")


def _utilization() -> str:
    return ("set aside here: chapter 4 measures how far below its floor a batch-1 step runs on this machine, and "
            "its roofline places the step at a fraction of the compute peak")


def _fill_time() -> str:
    return (f"16 requests at 4 per second: {16 / 4:.0f} s to fill (holds); with a 2-second budget a batch that waits "
            f"can hold {2 * 4} requests, so batching still works, smaller (the 'cannot use batching at all' is wrong); "
            "and the engines the book names do not wait to fill a batch at all")


def _dynamic_defaults() -> str:
    config = SchedulerConfig()
    return (f"the book's batcher: batch 16, 50 ms; the engine's dynamic mode: batch {config.dynamic_batch_size}, "
            f"{config.dynamic_max_wait_s * 1e3:.0f} ms by default (section 2 sets them), and the book's loop never "
            "waits for its deadline (cell 2.4)")


def _vllm_flags() -> str:
    rows = []
    for context in (1024, 4096):
        one = check("llama-3-70b", "A100 80GB", tp=4, batch=256, context=context)
        least = smallest_feasible("llama-3-70b", "A100 80GB", batch=256, context=context)
        rows.append(f"256 sequences of {context:,} tokens: on 4 A100 80GB "
                    + ("fits" if one.fits else f"does not fit (needs TP {least.tp})"))
    return ("its command serves Llama-3-70B with TP 4, max_num_seqs 256 (bf16): " + "; ".join(rows)
            + ": max_num_seqs is a ceiling the KV pool may not reach")


def _packing() -> str:
    return ("packing (or a paged cache) computes only the real tokens, so the padding share is 0 (holds); the "
            "engine's continuous batching takes section 3.2's step counts instead of the padded ones")


def _max_num_seqs() -> str:
    return ("partly: 3.4 holds max_num_seqs at 4 and shows the KV pool, not the cap, bounding the batch (the memory "
            "half); the sweep of section 6 raises the cap with the users, so throughput against max_num_seqs alone "
            "is not measured here")


def _frontier() -> str:
    return ("not measurable here: section 6's sweep found no knee by its 10% rule and its top point is a start-up "
            "burst (every user's first request at once), so no saturation level was reached to take 80% or 98% of")


def _knee() -> str:
    return ("not measurable here: the sweep of 2-32 users (6.1) found no knee by the 10% rule, one run per level, "
            "with its last step inside the run's noise; where a knee would lie is past this sweep")


CHECKS = {"max_num_seqs": _max_num_seqs, "frontier": _frontier, "knee": _knee, "a100_price": _a100_price,
          "utilization": _utilization, "fill_time": _fill_time,
          "dynamic_defaults": _dynamic_defaults, "vllm_flags": _vllm_flags, "packing": _packing}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 5, with what this chapter finds for it."""
    return kit.table("ch05", CHECKS)
