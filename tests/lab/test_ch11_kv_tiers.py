"""Chapter 11's lab: the two-tier simulator against the engine, the tier costs and the crossover, the GPU case
from the stored files, the panels (on the tiny model, shrunk), the exercises and the closing table."""

from __future__ import annotations

import math

import pytest

from workbench.lab import ch11
from workbench.lab.ch02.policy_sim import simulate
from workbench.lab.kit.closing import Verdict
from workbench.lab.kit.figures import trace, trace_names

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_two_tier_simulator_counts_what_the_engine_counts(tiny_model):
    check = ch11.engine_check(tiny_model, sessions=4, device_blocks=10, tier_blocks=24)
    assert check.matches
    assert check.engine["device only"][1:] == (0, 0) and check.engine["device + tier"][2] > 0
    prompts = ch11.stream(3, 12)
    assert ch11.simulate_tiers(prompts, 8, 16, 0).hit_rate == simulate(prompts, 8, 16, "LRU").hit_rate


def test_a_tier_moves_the_cliff_out(tiny_model):
    sweep = ch11.working_set_sweep(lambda n: ch11.stream(n, 6 * n), range(1, 10), 10, 24, 16)
    alone = sweep[sweep["device only"] > 0]["sessions"].max()
    tiered = sweep[sweep["device + tier"] > 0]["sessions"].max()
    assert (alone, tiered) == (3, 9)  # 10 device blocks hold 2 sessions of 4; 24 more hold 6 more


def test_the_gpu_case_is_read_from_the_stored_files():
    cases = ch11.gpu_cases()
    assert [c.device for c in cases] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    for case in cases:
        assert case.kv_bytes_per_token == 131072 and not case.host_measured
        assert 1 < case.ratio(4096) < 100 and case.per_token_s > 0
    assert abs(ch11.PCIE5_X16_BYTES_PER_S - 63.0e9) < 0.01 * 63.0e9
    names = trace_names(ch11.gpu_figure(cases))
    assert "H200: restore over the PCIe 5.0 x16 datasheet (not measured)" in names


@pytest.fixture(scope="module")
def panels(tiny_model, tokenizer):
    crossover = ch11.CrossoverLab(tiny_model).run()
    hits = ch11.HitRateLab(tiny_model).run()
    sessions = ch11.SessionsLab(tiny_model, sessions=3, turns=2, history=64, repeats=1).run()
    restart = ch11.RestartLab(tiny_model, tokenizer, prompt_tokens=256).run()
    return crossover, hits, sessions, restart


def test_panels_draw_named_traces_and_computed_status(panels):
    crossover, hits, sessions, restart = panels
    costs = crossover.result
    assert set(costs.restore) == set(ch11.TIERS) and costs.per_token_s > 0
    assert all(math.isfinite(costs.crossover_tokens(t)) for t in costs.restore)  # restoring wins here
    assert len(trace(crossover.figures[0], "restore from disk, cold").x) == len(ch11.crossover_frame(costs))
    assert "ms per token here" in crossover.status.value
    assert "equal to the simulator's" in hits.status.value
    run = sessions.result
    assert run.outputs_identical and run.ratio("host tier") > 0
    assert run.frame[run.frame["arm"] == "host tier"]["restored_tokens"].sum() > 0
    frame = restart.result.frame
    assert list(frame["cached_tokens"]) == [0, 240] and restart.result.foreign_found == 0


def test_the_ending_computes_every_verdict(panels):
    crossover, hits, sessions, restart = panels
    costs, (sweep, check) = crossover.result, hits.result
    cases = ch11.gpu_cases()
    table = ch11.closing_table(costs, sweep, check, sessions.result, restart.result, cases)
    assert len(table) == 6 and all(isinstance(v, Verdict) for v in table.verdicts)
    assert table.verdicts[1] is Verdict.NOT_MEASURABLE  # the host link is a datasheet figure
    assert table.verdicts[2] is Verdict.HOLDS and table.verdicts[5] is Verdict.HOLDS
    systems = ch11.systems_table(sessions.result, restart.result, costs)
    assert len(systems) == 6 and systems["published figure (source)"].iloc[-1].endswith("(this notebook)")
    assert systems["system"].iloc[0].startswith("vLLM") and not systems.isna().any().any()  # the file parses whole
    exercises = ch11.exercises(costs, sweep, cases[-1])
    assert exercises["sessions"].check(3).correct and exercises["bandwidth"].check(-1).correct is False
    assert ch11.chapter_baseline(costs, crossover.model).prefill_tokens == 512
