"""Chapter 4's timing panels without a browser (`workbench.lab.ch04.panels_timing`, `.panels_streaming`): TTFT by
prompt length, a long prompt among decoders under several schedules, streaming in alternating rounds, and the
closing table with every verdict computed (a result that contradicts a claim gives `Verdict.WRONG`).

Assertions are about structure the scheduler guarantees (how a prompt is split into steps, who waits for whom),
not about timings, except where the chapter's claim is a timing one and the margin is wide.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.config import CacheConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab import ch04
from workbench.lab.ch04.panels_timing import LANE_TOKENS, MAX_ITL, row_trace
from workbench.lab.ch04.runs import NO_CHUNKING, STATIC, scheduler_for, ttft_sweep
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace
from workbench.roofline import measure_peaks


@pytest.fixture(scope="module")
def ttft(tiny_model):
    return ch04.PrefillTTFTLab(tiny_model, lengths=(16, 64, 256)).run()


@pytest.fixture(scope="module")
def ttft_sweeps(ttft):
    alone = ttft.result
    ttft.arrivals.value = "burst, longest first"  # a control change re-measures
    return alone, ttft.result


@pytest.fixture(scope="module")
def chunked(tiny_model):
    return ch04.ChunkedPrefillLab(tiny_model, chunks=(64, 128), long_prompt=512, decoder_tokens=24).run()


@pytest.fixture(scope="module")
def streaming(tiny_model, tokenizer):
    engine = LLMEngine(tiny_model, tokenizer, cache_config=CacheConfig(num_blocks=32))
    return ch04.StreamingLab(engine, max_tokens=8).run()


def test_ttft_lab_queues_short_prompts_behind_long_ones_in_a_burst(ttft_sweeps, ttft):
    alone, burst = ttft_sweeps
    assert list(alone.frame["prompt_tokens"]) == list(burst.frame["prompt_tokens"]) == [16, 64, 256]
    assert (alone.frame["queued_s"] < 0.5 * alone.frame["ttft_s"]).all()  # sent alone, nothing waits ahead
    # In the burst the 256-token prompt goes first; budget 512 fits all three, so the 16-token one is admitted in
    # the same step: queued ~0, but it shares that step's compute.
    assert (burst.frame["ttft_s"] > 0).all() and (burst.frame["computing_s"] >= 0).all()
    assert burst.arrivals == "burst, longest first" and "burst" in ttft.figure.layout.title.text
    assert alone.length_ratio == 16 and alone.ttft_ratio == pytest.approx(alone.ttft_long_ms / alone.ttft_short_ms)
    tight = ttft_sweep(ttft.model, (16, 256), arrivals="burst, longest first", budget=128).frame
    assert tight["queued_s"].iloc[0] > tight["queued_s"].iloc[1]  # with a small budget the short one queues
    with pytest.raises(ValueError, match="arrivals must be one of"):
        ttft_sweep(ttft.model, (16,), arrivals="sometimes")


def test_chunked_prefill_lab_splits_the_long_prompt_and_static_batching_makes_it_wait(chunked):
    sweep = chunked.result
    assert set(sweep.runs) == {NO_CHUNKING, 64, 128, STATIC}
    assert sweep.runs[NO_CHUNKING].steps["num_prefill_tokens"].max() == 512  # one step holds the whole prompt
    for chunk in (64, 128):
        steps = sweep.runs[chunk].steps
        assert steps["num_prefill_tokens"].max() <= chunk + 32
        assert (steps["num_prefill_tokens"] > 0).sum() >= 512 // chunk
    static = sweep.runs[STATIC].requests
    decoders_done = static.loc[static["role"] == "decoder", "finish"].max()
    assert static.loc[static["role"] == "long_prompt", "first_scheduled"].iloc[0] >= decoders_done
    table = sweep.summary()
    assert list(table.index) == [NO_CHUNKING, "chunks of 64", "chunks of 128", STATIC]
    assert not table.loc[STATIC, "decoders_outlasted_prefill"]  # static: the decoders finish before it starts
    assert sweep.reference_label == "chunks of 128" and table.loc[STATIC, "long_ttft_ms"] > 0
    lanes = trace(chunked.timeline, row_trace("no chunking", LANE_TOKENS))
    assert set(lanes.y) == {"decoder 1", "decoder 2", "decoder 3", "decoder 4", "long prompt"}
    assert len(lanes.x) == 4 * 24 + 8  # every output token is a tick
    chunked.shown.value = STATIC  # redraw only: nothing re-runs
    assert chunked.result is sweep and chunked.timeline.layout.annotations[1].text == STATIC
    itl = trace(chunked.sweep_figure, MAX_ITL)
    assert list(itl.x) == [64, 128, 512] and itl.text[-1] == NO_CHUNKING  # no chunking = one 512-token chunk
    with pytest.raises(ValueError, match="chunk size"):
        scheduler_for(0)


def test_streaming_lab_alternates_streamed_and_buffered_rounds(streaming):
    run = streaming.result
    assert run.same_text and run.text and run.tokens == 8
    assert list(run.arrivals["tokens_seen"]) == sorted(run.arrivals["tokens_seen"])
    assert run.ttft_s < run.streamed_total_s and run.cold_total_s > 0
    rounds = run.rounds
    assert list(rounds["mode"]) == ["buffered", "streamed", "streamed", "buffered"]  # each mode goes first once
    assert list(rounds["first"]) == [True, False, True, False]
    assert run.streamed_total_s == pytest.approx(rounds.loc[rounds["mode"] == "streamed", "total_s"].min())
    assert streaming.live.value.startswith("<pre") and "▌" not in streaming.live.value
    buffered = trace(streaming.figure, "not streamed: tokens on screen")
    assert list(buffered.y) == [0, 8, 8]
    captions = [caption for caption, _ in streaming.stored_tables()]
    assert "arrival" in captions[0] and "uncounted" in captions[1]


@pytest.fixture(scope="module")
def results(tiny_model, ttft_sweeps, chunked, streaming):
    peaks = measure_peaks("cpu", torch.float32, buffer_bytes=32 << 20, matmul_sizes=(256,))
    roofline = ch04.RooflineLab(tiny_model, peaks=peaks, sweeps=[("small", (16, 128), (1, 4), 16)]).run()
    decode = ch04.DecodeLab(tiny_model, peaks, batches=(1, 4), contexts=(16,), context=16, steps=2).run()
    return {"roofline": roofline.result, "decode": decode.result, "ttft_alone": ttft_sweeps[0],
            "ttft_burst": ttft_sweeps[1], "chunked": chunked.result, "streaming": streaming.result}


def test_closing_table_has_a_computed_verdict_for_each_takeaway(results):
    table = ch04.closing_table(**results)
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert all(isinstance(v, Verdict) for v in table.verdicts)
    assert "ridge" in table.rows[0].measured and "static batching" in table.rows[3].measured
    assert all(row.note for row in table.rows if row.verdict is not Verdict.HOLDS)


def test_closing_table_says_wrong_when_a_result_contradicts_the_claim(results):
    alone = results["ttft_alone"]
    shrinking = dataclasses.replace(alone, frame=alone.frame.assign(ttft_s=alone.frame["ttft_s"].values[::-1]))
    run = results["streaming"]
    late = dataclasses.replace(run, arrivals=run.arrivals.assign(seconds=run.arrivals["seconds"] + 100.0),
                               rounds=run.rounds.assign(ttft_s=run.rounds["ttft_s"] + 100.0))
    table = ch04.closing_table(**{**results, "ttft_alone": shrinking, "streaming": late})
    assert table.rows[1].verdict is Verdict.WRONG  # TTFT fell as the prompt grew
    assert table.rows[4].verdict is Verdict.WRONG  # the first streamed text came after the unstreamed whole
