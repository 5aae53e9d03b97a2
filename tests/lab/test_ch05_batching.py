"""Chapter 5's lab: panels measure when asked and draw named traces, the sweep computes its knee, the claim checks
compute what they say, exercises check, and the closing table's verdicts are computed.

The panels run on a tiny random-weight model (tests/lab/conftest.py) with small workloads, so the tests check the
panels' wiring and arithmetic, not the real model's speed: the notebook and benchmarks/bench_batching.py do that.
"""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.lab import ch05
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace, trace_names

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module")
def panels(tiny_model):
    return {"modes": ch05.ModesLab(tiny_model, None, requests=4, users=2, max_num_seqs=2),
            "sweep": ch05.ConcurrencySweepLab(tiny_model, None, requests=8, output_tokens=(2, 4),
                                              concurrencies=(1, 2, 4), max_num_seqs=2),
            "variance": ch05.VarianceLab(tiny_model, None, requests=8, users=4),
            "capacity": ch05.BatchCapacityLab(tiny_model, None, requests=4),
            "priority": ch05.PriorityLab(tiny_model, None, requests=6)}


def test_panels_measure_only_when_asked(panels):
    assert not any(panel.measured for panel in panels.values())


def test_every_panel_draws_titled_figures_a_status_and_stable_tables(panels):
    for name, panel in panels.items():
        panel.run()
        assert panel.status.value, name
        for fig in panel.figures:
            names = trace_names(fig)
            assert names and len(set(names)) == len(names), name
            assert fig.layout.title.text and fig.layout.title.subtitle.text, name
        assert len(panel.stored_tables()) == 1, name


def test_modes_panel_redraws_the_chosen_timeline_and_remeasures_on_users(panels):
    modes = panels["modes"].run()
    modes.show.value = "continuous"
    assert "continuous batching" in modes.figures[0].layout.title.text
    modes.users.value = 3
    assert "3 users" in modes.status.value and "3 users" in modes.figures[0].layout.title.text
    assert set(modes.result.table.index) == {"static", "dynamic", "continuous"}
    assert trace(modes.figures[1], "output tokens/s").y is not None


def test_sweep_knee_and_goodput_follow_the_slo(panels):
    sweep = panels["sweep"].run()
    result = sweep.result
    assert result.concurrencies == [1, 2, 4] and result.requests == 8
    assert set(result.knees().index) == {"static", "dynamic", "continuous"}
    strict = result.good_share(1)
    assert (result.good_share(1e9) >= strict).all() and (result.good_share(1e9) == 1.0).all()
    sweep.ttft_slo.value = 100  # the SLO control only re-reads the kept TTFTs
    assert set(sweep.goodput_users()) == {"static", "dynamic", "continuous"}


def _sweep(throughputs: list[float], ttfts: list[float]) -> ch05.ConcurrencySweep:
    rows = [{"mode": mode, "concurrency": c, "requests": 48, "output_tok_s": tps, "ttft_p50_ms": ttft / 2,
             "ttft_p90_ms": ttft, "ttft_ms_all": [0.5 * ttft, 0.8 * ttft, ttft, 1.02 * ttft]}
            for mode in ch05.MODES for c, tps, ttft in zip((1, 2, 4, 8), throughputs, ttfts, strict=True)]
    return ch05.ConcurrencySweep(pd.DataFrame(rows))


def test_the_knee_is_the_first_level_after_which_gains_fall_below_ten_percent():
    flat = _sweep([10, 18, 19, 19.5], [50, 60, 120, 240])
    assert int(flat.knee("continuous")["concurrency"]) == 2
    rising = _sweep([10, 18, 30, 45], [50, 60, 70, 80])
    assert rising.knee("continuous") is None
    assert not rising.knees()["reached"].any() and rising.knees().loc["static", "last_gain"] == pytest.approx(0.5)


def test_priority_panel_serves_interactive_requests_first(panels):
    result = panels["priority"].run().result
    assert result.cell("priority", "interactive", "ttft_p50_ms") < result.cell("fcfs", "interactive", "ttft_p50_ms")
    assert result.cell("priority", "interactive", "preemptions") == 0


def test_variance_panel_counts_steps_static_pads_and_continuous_does_not(panels):
    result = panels["variance"].run().result
    steps = result.step_ratios
    # Equal output lengths leave static batching nothing to pad; spread-out ones cost it extra steps.
    assert steps["fixed"] == pytest.approx(1.0, abs=0.15)
    assert steps["log-uniform"] > steps["fixed"]
    assert (result.frame["steps"] > 0).all()


def test_capacity_panel_shows_the_pool_bounding_the_batch(panels):
    result = panels["capacity"].run().result
    assert result.bounded
    assert trace(panels["capacity"].figures[0], "largest batch measured").y[0] == result.row(0)["peak_batch"]


def test_claim_checks_compute_what_they_say():
    waste = ch05.padding_waste([1, 3], 2)
    assert waste == {"useful_tokens": 4, "padded_slots": 6, "waste_share": pytest.approx(1 / 3)}
    blocks = ch05.block_waste([17, 33], (1, 16))
    assert blocks["wasted_share"].tolist() == [0.0, pytest.approx(1 - 50 / 80)]
    assert blocks["table_entries"].tolist() == [50, 5]
    split = ch05.utilization_split("llama-3-8b", device_gib=80.0, utilization=0.9, activation_gib=2.0)
    assert split.iloc[1]["total_GiB"] == pytest.approx(72.0, abs=0.01)  # the fraction caps everything
    assert split.iloc[0]["total_GiB"] > 80.0  # the course's reading does not even fit on the device
    with pytest.raises(ValueError, match="batch_size"):
        ch05.padding_waste([1], 0)
    with pytest.raises(ValueError, match="spread"):
        ch05.random_requests(2, spread="bimodal", vocab_size=512)


def test_exercises_right_wrong_and_unanswered(panels):
    sweep = panels["sweep"].result
    exercises = ch05.exercises(sweep)
    assert set(exercises) == {"padding", "capacity", "block_waste", "knee"}
    right = {"padding": 1 - 226 / 960, "capacity": 15, "block_waste": exercises["block_waste"].answer(),
             "knee": exercises["knee"].answer()}
    for name, exercise in exercises.items():
        assert exercise.check(right[name]).correct is True, name
        wrong = right[name] * 3 + 1 if isinstance(right[name], int | float) else 99
        assert exercise.check(wrong).correct is False, name
        assert exercise.check(...).correct is None, name


@pytest.fixture(scope="module")
def hits(tiny_model):
    return ch05.cache_aware_hit_rates(
        lambda aware: ch05.batching_engine(tiny_model, None, "continuous", max_num_seqs=1, num_blocks=6,
                                           cache_aware_admission=aware),
        ch05.alternating_families(vocab_size=tiny_model.spec.vocab_size))


def test_the_closing_table_computes_every_verdict(panels, hits):
    p = {name: panel.result for name, panel in panels.items()}
    assert hits.loc["cache-aware", "hit_rate"] > hits.loc["FCFS", "hit_rate"]
    table = ch05.closing_table(p["sweep"], p["variance"], p["capacity"], hits)
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert all(isinstance(v, Verdict) for v in table.verdicts)
    assert table.verdicts[2] is Verdict.HOLDS and table.verdicts[3] is Verdict.CAVEAT
    # A sweep that flattens at 2 users with TTFT growing past it: the frontier claim holds.
    flat = _sweep([10, 18, 19, 19.5], [50, 60, 120, 240])
    assert ch05.closing_table(flat, p["variance"], p["capacity"], hits).verdicts[4] is Verdict.HOLDS
    # A sweep that ends before saturation has no knee: nothing to judge.
    rising = _sweep([10, 18, 30, 45], [50, 60, 70, 80])
    assert ch05.closing_table(rising, p["variance"], p["capacity"], hits).verdicts[4] is Verdict.NOT_MEASURABLE
    # Throughput falling as users grow contradicts the first claim.
    falling = _sweep([20, 18, 15, 10], [50, 60, 70, 80])
    assert ch05.closing_table(falling, p["variance"], p["capacity"], hits).verdicts[0] is Verdict.WRONG
    # The cache-aware hit rate no better than FCFS: wrong.
    same = hits.assign(hit_rate=hits.loc["FCFS", "hit_rate"])
    assert ch05.closing_table(p["sweep"], p["variance"], p["capacity"], same).verdicts[3] is Verdict.WRONG
