"""Profiling engine steps on a 2-layer random-weight model: every named range shows up, the ranges add up to
the step time measured around ``engine.step()`` (within 10 %), the trace file is a Chrome trace with the
ranges in it, and with no profiler running a range is a plain no-op context (no ``record_function``)."""

from __future__ import annotations

import json
from contextlib import nullcontext
from functools import cache

import pytest
import torch
from tiny_models import SMALL, tiny_model
from torch.profiler import profile

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.metrics.step_ranges import STEP_RANGES, step_range
from workbench.models import model_spec, random_model
from workbench.monitoring.profiling import profile_steps

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small_model():
    return tiny_model(seed=2, num_layers=2, **SMALL)


def busy_engine(spec: bool) -> LLMEngine:
    engine = LLMEngine(small_model(), None, cache_config=CacheConfig(num_blocks=64, block_size=4),
                       scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
                       spec_config=SpecConfig("ngram", 2) if spec else None)
    for i in range(4):  # repeating prompts, so prompt lookup drafts
        engine.add_request([1, 2, 3, 4] * (3 + i), SamplingParams(max_tokens=24, ignore_eos=True), chat=False)
    return engine


def test_ranges_add_up_to_the_step_and_the_trace_has_them(tmp_path):
    engine = busy_engine(spec=True)
    prof = profile_steps(engine, 12, trace_path=tmp_path / "trace.json")
    ranges = prof.ranges.set_index("range")
    assert prof.num_steps == 12 and list(ranges.index) == list(STEP_RANGES)
    for name in ("schedule", "prepare", "forward", "sample", "postprocess", "draft", "verify"):
        assert ranges.loc[name, "calls"] >= 1 and ranges.loc[name, "ms"] > 0, name
    assert 0.9 <= prof.coverage <= 1.0 + 1e-6, prof.ranges  # exclusive ranges, so never more than the step
    operators = " ".join(prof.operators["operator"])
    assert "linear" in operators or "mm" in operators, prof.operators  # the matmuls are among the top operators
    names = {event.get("name") for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"engine.forward", "engine.sample", "engine.schedule"} <= names


def test_profile_steps_checks_its_input():
    engine = busy_engine(spec=False)
    with pytest.raises(ValueError, match="num_steps"):
        profile_steps(engine, 0)
    empty = LLMEngine(small_model(), None, cache_config=CacheConfig(num_blocks=8, block_size=4))
    with pytest.raises(ValueError, match="no requests"):
        profile_steps(empty, 3)


def test_a_range_is_a_no_op_without_a_profiler():
    assert isinstance(step_range("forward"), nullcontext)
    with profile():
        assert not isinstance(step_range("forward"), nullcontext)
    assert isinstance(step_range("forward"), nullcontext)
    with pytest.raises(ValueError, match="unknown step range"):
        step_range("fwd")
    if not torch.cuda.is_available():
        from workbench.metrics.step_ranges import enable_nvtx
        enable_nvtx(True)  # no CUDA: NVTX stays off
        assert isinstance(step_range("forward"), nullcontext)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_profile_steps_on_cuda_reports_device_time():
    spec = model_spec("smollm2-135m").replace(num_layers=2, vocab_size=256, intermediate_size=128)
    engine = LLMEngine(random_model(spec, device="cuda", seed=2), None,
                       cache_config=CacheConfig(num_blocks=64, block_size=16))
    for i in range(4):
        engine.add_request([1, 2, 3, 4] * (3 + i), SamplingParams(max_tokens=12, ignore_eos=True), chat=False)
    prof = profile_steps(engine, 6)
    assert "device_ms" in prof.operators and prof.operators["device_ms"].sum() > 0
    assert 0.9 <= prof.coverage <= 1.0 + 1e-6, prof.ranges
