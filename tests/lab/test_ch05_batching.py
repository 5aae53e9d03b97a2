"""Chapter 5's lab: panels measure and redraw, the claim checks compute what they say, exercises check.

The panels run on a one-layer random-weight model with SmolLM2's attention shapes and a 512-token vocabulary
(the panels keep their workloads' token ids below the model's vocabulary size; a step takes milliseconds), so
the test checks the panels' wiring and arithmetic, not the real model's speed: the notebook (nbval) and
benchmarks/bench_batching.py do that on the real model.
"""

from __future__ import annotations

from functools import cache

import pytest

from workbench.lab import ch05_batching as ch05
from workbench.models import model_spec, random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small_model():
    # Renamed: labels treat any "smollm2-135m*" spec as the real weights.
    spec = model_spec("smollm2-135m").replace(name="tiny-random", num_layers=1, vocab_size=512,
                                              intermediate_size=128)
    return random_model(spec, device="cpu", seed=5)


@cache
def panels():
    model = small_model()
    return {"modes": ch05.ModesLab(model, None, requests=4, users=2, max_num_seqs=2),
            "sweep": ch05.SweepLab(model, None, requests=4, concurrencies=(1, 2, 4)),
            "variance": ch05.VarianceLab(model, None, requests=8, users=4),
            "capacity": ch05.CapacityLab(model, None, requests=4),
            "priority": ch05.PriorityLab(model, None, requests=6)}


def test_every_panel_draws_titled_figures_a_status_and_stable_tables():
    for name, panel in panels().items():
        assert panel.status.value, name
        for fig in panel.figures:
            assert fig.data and fig.layout.title.text and "random weights" in fig.layout.title.subtitle.text, name
        assert len(panel.stored_tables()) == 1, name


def test_modes_panel_redraws_the_chosen_timeline_and_remeasures_on_users():
    modes = panels()["modes"]
    modes.show.value = "continuous"
    assert "continuous batching" in modes.figures[0].layout.title.text
    modes.users.value = 3
    assert "3 users" in modes.status.value and "3 users" in modes.figures[0].layout.title.text
    assert set(modes.table.index) == {"static", "dynamic", "continuous"}


def test_sweep_knee_and_goodput_follow_the_slo():
    sweep = panels()["sweep"]
    assert list(sweep.sweep["concurrency"].unique()) == [1, 2, 4]
    assert set(sweep.knees().index) == {"static", "dynamic", "continuous"}
    sweep.ttft_slo.value = 100  # the SLO control only re-reads the kept TTFTs
    strict = sweep.good_share()
    sweep.ttft_slo.value = 5000
    assert (sweep.good_share() >= strict).all() and (sweep.good_share() == 1.0).all()


def test_priority_panel_serves_interactive_requests_first():
    panel = panels()["priority"]
    assert panel.cell("priority", "interactive", "ttft_p50_ms") < panel.cell("fcfs", "interactive", "ttft_p50_ms")
    assert panel.cell("priority", "interactive", "preemptions") == 0


def test_variance_panel_counts_steps_static_pads_and_continuous_does_not():
    variance = panels()["variance"]
    steps = variance.step_ratios()
    # Equal output lengths leave static batching nothing to pad; spread-out ones cost it extra steps.
    assert steps["fixed"] == pytest.approx(1.0, abs=0.15)
    assert steps["log-uniform"] > steps["fixed"]
    assert (variance.table["steps"] > 0).all()


def test_capacity_panel_shows_the_pool_bounding_the_batch():
    table = panels()["capacity"].table
    assert table.iloc[0]["peak_batch"] < table.iloc[0]["max_num_seqs"]
    assert table["peak_batch"].is_monotonic_increasing


def test_claim_checks_compute_what_they_say():
    waste = ch05.padding_waste([1, 3], 2)
    assert waste == {"useful_tokens": 4, "padded_slots": 6, "waste_share": pytest.approx(1 / 3)}
    blocks = ch05.block_waste([17, 33], (1, 16))
    assert blocks["wasted_share"].tolist() == [0.0, pytest.approx(1 - 50 / 80)]
    assert blocks["table_entries"].tolist() == [50, 5]
    split = ch05.utilization_split("llama-3-8b", device_gib=80.0, utilization=0.9, activation_gib=2.0)
    engine_row = split.iloc[1]
    assert engine_row["total_GiB"] == pytest.approx(72.0, abs=0.01)  # the fraction caps everything
    assert split.iloc[0]["total_GiB"] > 80.0  # the course's reading does not even fit on the device
    with pytest.raises(ValueError, match="batch_size"):
        ch05.padding_waste([1], 0)
    with pytest.raises(ValueError, match="spread"):
        ch05.random_requests(2, spread="bimodal", vocab_size=512)


def test_exercises_right_wrong_and_unanswered():
    exercises = ch05.exercises(panels()["sweep"])
    assert set(exercises) == {"padding", "capacity", "block_waste", "knee"}
    right = {"padding": 1 - 226 / 960, "capacity": 15, "block_waste": exercises["block_waste"].answer(),
             "knee": int(panels()["sweep"].knees().loc["continuous", "concurrency"])}
    for name, exercise in exercises.items():
        assert exercise.check(right[name]).correct is True, name
        assert exercise.check(right[name] * 3 + 1).correct is False, name
        assert exercise.check(...).correct is None, name


def test_takeaways_table_has_a_verdict_for_each_of_the_five():
    p = panels()
    hits = ch05.cache_aware_hit_rates(
        lambda aware: ch05.batching_engine(small_model(), None, "continuous", max_num_seqs=1, num_blocks=6,
                                           cache_aware_admission=aware), ch05.alternating_families(vocab_size=512))
    assert hits.loc["cache-aware", "hit_rate"] > hits.loc["FCFS", "hit_rate"]
    table = ch05.takeaways(p["sweep"], p["variance"], p["capacity"], hits)
    assert len(table) == 5
    assert set(table["verdict"]) <= {"holds", "holds with a caveat", "wrong"}
