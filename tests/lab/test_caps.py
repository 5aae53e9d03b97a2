"""Every knee or saturation a chapter reports is checked against the caps it ran under (issue 40): chapter 5's
knees (max_num_seqs and the dynamic batch, once 16 and 4, were the knees) and chapter 6's speed runs (the cached
sweep caps every KV format at 16 sequences, so only the memory-limited run may speak of a larger batch)."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.bench.drive import batching_engine
from workbench.lab import ch05
from workbench.lab.ch05.runs import concurrency_sweep
from workbench.lab.kit.caps import Cap

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def workload(tiny_model):
    return ch05.random_requests(8, prompt_tokens=16, output_tokens=(2, 4), seed=1,
                                vocab_size=tiny_model.spec.vocab_size)


def test_a_knee_at_the_configured_cap_is_reported_as_the_caps(tiny_model, workload):
    """A sweep past a batch cap of 2: throughput cannot grow past 2 sequences per step, the knee sits at or past
    the cap, and the sweep says the configuration set it."""
    sweep = concurrency_sweep(lambda mode: batching_engine(tiny_model, None, mode, max_num_seqs=2,
                                                           dynamic_batch_size=2),
                              workload, ("continuous", "dynamic"), (1, 2, 4, 8))
    assert {c.name for c in sweep.mode_caps("dynamic")} >= {"max_num_seqs", "dynamic_batch_size"}
    for mode in ("continuous", "dynamic"):
        limit = sweep.knee_limit(mode)
        assert Cap("max_num_seqs", 2) in limit.caps
        if sweep.knee(mode) is not None and limit.value >= 2:
            assert limit.set_by_cap and "max_num_seqs = 2" in limit.sentence()
    assert "set by the configuration" in sweep.knee_sentence() or "none inside" in sweep.knee_sentence()


def test_the_chapters_sweep_puts_every_cap_at_or_above_its_last_level(tiny_model):
    """The chapter's default sweep: max_num_seqs and the dynamic batch are its largest concurrency, so a knee
    inside the sweep (which needs a next level) lies below every cap and is the hardware's."""
    assert ch05.ConcurrencySweepLab(tiny_model, None).caps() == 32  # the default sweep: 2 to 32 users
    assert ch05.ConcurrencySweepLab(tiny_model, None, concurrencies=(1, 2, 4, 8, 16, 32, 64)).caps() == 64
    assert ch05.ConcurrencySweepLab(tiny_model, None, max_num_seqs=4).caps() == 4  # a cap set by hand stays


def test_a_knee_below_every_cap_is_the_hardwares():
    rows = [{"mode": "continuous", "concurrency": c, "requests": 48, "output_tok_s": t, "ttft_p50_ms": 1.0,
             "ttft_p90_ms": 2.0, "ttft_ms_all": [1.0, 2.0]} for c, t in ((2, 10), (4, 18), (8, 19), (16, 19.5))]
    sweep = ch05.ConcurrencySweep(pd.DataFrame(rows), caps={"continuous": (Cap("max_num_seqs", 16),)})
    limit = sweep.knee_limit("continuous")
    assert limit.value == 4 and not limit.set_by_cap and "below every cap" in limit.sentence()


def test_the_kv_speed_claim_comes_from_the_memory_limited_run_only():
    """Chapter 6's closing row takes its batch evidence from the run whose batch the KV pool bounded (its
    settings say max_num_seqs 64), and names the cached sweep's 16-sequence cap where it quotes that run."""
    from workbench.lab.ch06.capacity_run import MemoryLimitedRun

    frame = pd.DataFrame({"kv_format": ["auto", "int8"], "num_blocks": [16, 60], "fit": [4, 15],
                          "peak_batch": [4, 15], "mean_decode_batch": [4.0, 14.0], "preemptions": [0, 0],
                          "output_tok_s": [20.0, 30.0]})
    run = MemoryLimitedRun(frame, 1 << 22, 64, 24)
    batch, speed = run.evidence("int8")
    assert batch.settings["max_num_seqs"] == 64 and not run.limit("int8").set_by_cap
    capped = MemoryLimitedRun(frame.assign(peak_batch=[4, 24]), 1 << 22, 64, 24)
    assert capped.limit("int8").set_by_cap  # every request offered ran at once: the offer, not the pool, set it
