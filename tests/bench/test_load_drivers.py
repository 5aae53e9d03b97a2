"""Chapter 5's load drivers: closed loop keeps exactly N requests in flight, open loop follows seeded Poisson
arrivals, and the same drive reaches an HTTP endpoint through workbench.bench.

The in-process runs use a one-layer random-weight model (milliseconds per step): token values are meaningless,
only the timeline matters. The HTTP run uses the real model on a server bound to 127.0.0.1.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from tiny_models import SMALL, tiny_model

from workbench.bench.drive import drive
from workbench.bench.runner import LoadShape
from workbench.bench.synthetic import random_requests
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.serve.launch import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small_model():
    return tiny_model(seed=2, num_layers=1, **SMALL)


def tiny_engine(max_num_seqs: int = 8) -> LLMEngine:
    return LLMEngine(small_model(), cache_config=CacheConfig(block_size=4, num_blocks=256),
                     scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=128))


def small_workload(n: int, seed: int = 0):
    return random_requests(n, prompt_tokens=6, output_tokens=(2, 9), seed=seed, spread="uniform")


def tiny_ids(workload):
    """The same requests with token ids inside the tiny model's 256-token vocabulary."""
    from dataclasses import replace

    return [replace(r, prompt=[t % 250 + 1 for t in r.prompt]) for r in workload]


def test_closed_loop_keeps_exactly_n_requests_in_flight():
    workload = tiny_ids(small_workload(14))
    run = drive(tiny_engine(), workload, concurrency=3)
    counts = run.in_flight
    assert max(counts) == 3
    # While requests remain to be sent, every step has exactly 3 in flight; after the last is sent, only fewer.
    first_short = next(i for i, c in enumerate(counts) if c < 3)
    assert all(c == 3 for c in counts[:first_short])
    assert all(a >= b for a, b in zip(counts[first_short:], counts[first_short + 1:], strict=False))
    assert len(run.requests) == 14 and run.requests["workload_index"].tolist() == list(range(14))
    assert (run.requests["output_tokens"].to_numpy() == [r.max_tokens for r in workload]).all()
    # A user sends its next request only when its previous one is done: never more than 3 overlap in time.
    rows = run.requests
    for t in rows["arrival"]:
        overlapping = ((rows["arrival"] <= t) & (rows["finish"] > t)).sum()
        assert overlapping <= 3
    for column in ("queue_s", "ttft_s", "tpot_s", "e2e_s"):
        assert rows[column].notna().all() or column == "tpot_s"
    assert run.summary["completed"] == 14 and run.summary["output_throughput"] > 0


def test_open_loop_arrivals_follow_the_seeded_poisson_rate():
    shape = LoadShape(request_rate=5.0, seed=3)
    times = np.array([r.arrival_s for r in shape.arrivals(small_workload(400))])
    assert abs((len(times) - 1) / times[-1] - 5.0) < 0.75  # 400 draws: the rate within 15%
    again = np.array([r.arrival_s for r in LoadShape(request_rate=5.0, seed=3).arrivals(small_workload(400))])
    other = np.array([r.arrival_s for r in LoadShape(request_rate=5.0, seed=4).arrivals(small_workload(400))])
    assert (times == again).all() and not (times == other).all()

    workload = tiny_ids(small_workload(8))
    run = drive(tiny_engine(), workload, request_rate=20.0, seed=3)
    expected = [r.arrival_s for r in LoadShape(request_rate=20.0, seed=3).arrivals(workload)]
    rows = run.requests
    sent = (rows["arrival"] - rows["arrival"].min()).to_numpy()
    assert np.allclose(sent, expected, atol=1e-9)  # each request enters at its own Poisson time
    assert (rows["first_scheduled"] >= rows["arrival"]).all()  # and is never admitted before it arrives


def test_drive_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        drive(tiny_engine(), [], concurrency=1)
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        drive(tiny_engine(), small_workload(2), concurrency=0)
    with pytest.raises(ValueError, match="request_rate must be a number > 0"):
        drive(tiny_engine(), small_workload(2), request_rate=-1.0)
    with pytest.raises(ValueError, match="target must be an LLMEngine"):
        drive(42, small_workload(2), concurrency=1)


def test_the_same_drive_reaches_an_http_endpoint(real_model, tokenizer):
    workload = random_requests(4, prompt_tokens=8, output_tokens=(3, 6), seed=1)
    engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=64))
    with ServerThread(engine, host="127.0.0.1") as server:
        remote = drive(server.url, workload, concurrency=2, slo={"ttft": 60_000})
    local = drive(LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=64)), workload,
                  concurrency=2, slo={"ttft": 60_000})
    for run in (remote, local):
        assert run.summary["completed"] == 4 and run.summary["good_requests"] == 4
        assert run.requests["output_tokens"].tolist() == [r.max_tokens for r in workload]
        assert (run.requests["ttft_s"] > 0).all()
    assert "closed loop, concurrency 2" in remote.load and remote.load == local.load
