"""Chapter 8's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch08.csv)."""

from __future__ import annotations

import pandas as pd

from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import check
from workbench.monitoring.capacity import seed_estimate


def _single_a100() -> str:
    one = check("llama-3-70b", "A100 80GB")
    return (f"its planning model times 'a single A100' serving a 70B model, which {one.label.split(': ', 1)[1]}: "
            "each 'GPU' of its count is at least two")


def _batch_64() -> str:
    serial = seed_estimate()["ceil_result"]
    shared = seed_estimate(decode_ms_per_token=150 / 64)["ceil_result"]
    fewest, most = (seed_estimate(decode_ms_per_token=ms)["ceil_result"] for ms in (5, 10))
    return (f"a 150 ms step shared by 64 sequences is {150 / 64:.2f} ms per token: {shared} GPUs against {serial} "
            f"(the book's '5-10 ms' gives {fewest}-{most}, and implies a step of 320-640 ms at batch 64); but the "
            "150 ms is a batch-1 step: at batch 64 each step also reads 64 sequences' KV, tens of GB beside the "
            "weights' 141 GB, so the shared step is longer and the GPU count higher than this")


def _itl_is_tpot() -> str:
    return ("wrong: ITL is every gap between streamed chunks, TPOT a per-request average (section 3.4 sets them "
            "side by side)")


def _queue_50() -> str:
    return "set aside: a threshold for a production fleet; the chapter's alert reads p99 TTFT against its baseline"


def _kv_90_95() -> str:
    return ("set aside: the burst here peaks well below 90% KV usage with no preemption (section 3's dashboard), so "
            "neither threshold is reached; chapter 2's eviction panel and chapter 5's pool panel show what a full "
            "pool does")


def _try_this() -> str:
    return ("set aside: only the TTFT rule is built and tested here (section 3); a KV-usage alert needs a load "
            "that fills the pool and a hit-rate alert a traffic shift, neither of which this chapter runs")


CHECKS = {"kv_90_95": _kv_90_95, "try_this": _try_this, "single_a100": _single_a100,
          "batch_64": _batch_64, "itl_is_tpot": _itl_is_tpot, "queue_50": _queue_50}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 8, with what this chapter finds for it."""
    return kit.table("ch08", CHECKS)
