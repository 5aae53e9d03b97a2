"""The batch-invariant mode (`workbench.models.row_invariant`, `workbench.cache.invariant_attention`): one request
decoded alone and among varied traffic gets bit-identical logits on every exact path; without the mode the
divergence harness (`workbench.quality.determinism`) finds the logits that differ."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_model

from workbench.cache.invariant_attention import invariant_attention
from workbench.models.attention import causal_attention
from workbench.models.row_invariant import in_row_tiles
from workbench.quality.determinism import compare, decode_with_traffic, divergence_experiment, engine_for

PROMPT = list(range(300, 390))  # 90 tokens: chunked by the 64-token step budget


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(num_layers=2)


def test_row_tiles_make_a_row_independent_of_its_neighbours():
    torch.manual_seed(1)
    weight = torch.randn(576, 1536)
    rows = torch.randn(40, 1536)
    alone = torch.cat([in_row_tiles(lambda x: F.linear(x, weight), rows[i:i + 1]) for i in range(40)])
    for count in (2, 7, 16, 33, 40):
        assert torch.equal(in_row_tiles(lambda x: F.linear(x, weight), rows[:count]), alone[:count])


def test_invariant_attention_is_attention():
    torch.manual_seed(2)
    q, k, v = torch.randn(150, 9, 64), torch.randn(150, 3, 64), torch.randn(150, 3, 64)
    want = causal_attention(q, k, v, 0.125)
    got = invariant_attention(q, torch.arange(150), k.transpose(0, 1), v.transpose(0, 1), 0.125)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_invariant_attention_gives_a_row_the_same_bits_wherever_it_sits():
    torch.manual_seed(3)
    q, k, v = torch.randn(150, 9, 64), torch.randn(3, 150, 64), torch.randn(3, 150, 64)
    whole = invariant_attention(q, torch.arange(150), k, v, 0.125)
    for p in (0, 63, 64, 100, 149):
        decode = invariant_attention(q[p:p + 1], torch.tensor([p]), k[:, :p + 1], v[:, :p + 1], 0.125)
        chunk = invariant_attention(q[max(0, p - 20):p + 1], torch.arange(max(0, p - 20), p + 1), k[:, :p + 1],
                                    v[:, :p + 1], 0.125)
        assert torch.equal(decode[0], whole[p]) and torch.equal(chunk[-1], whole[p])


@pytest.mark.parametrize("kv_format", ["auto", "int8", "int4"])
def test_the_mode_gives_bit_identical_logits_among_any_traffic(tiny, kv_format):
    report = divergence_experiment(tiny, None, PROMPT, runs=5, max_tokens=10, max_others=6, kv_cache_dtype=kv_format,
                                   batch_invariant=True, seed=4)
    assert report.runs["others"].max() > 0 and report.runs["cached_prompt_tokens"].max() > 0
    assert report.runs_with_other_logits == 0 and report.distinct_completions == 1, report.runs


def test_the_mode_survives_preemption(tiny):
    """Everything queued before the request under study, in a pool too small for all: the newest running request
    (ours) is preempted and its prompt and tokens recomputed in other shapes; the logits stay the same bits."""
    settings = {"batch_invariant": True, "kv_cache_dtype": "auto", "chunk_tokens": 64}
    reference = decode_with_traffic(engine_for(tiny, None, num_blocks=None, **settings), PROMPT, 24, 0,
                                    random.Random(0))
    crowded = decode_with_traffic(engine_for(tiny, None, num_blocks=14, **settings), PROMPT, 24, 6,
                                  random.Random(1), joining_later=0.0)
    assert crowded.preemptions > 0, "the small pool was meant to preempt the request"
    assert compare(reference, crowded)["first_logit_difference"] is None


def test_without_the_mode_the_harness_finds_other_logits(tiny):
    report = divergence_experiment(tiny, None, PROMPT, runs=5, max_tokens=10, max_others=6, seed=4)
    # What it measures, not a fixed count: some run among traffic got other logits, and none alone did.
    assert report.runs_with_other_logits > 0
    alone = report.runs[report.runs["others"] == 0]
    assert alone["first_logit_difference"].isna().all()
    # The control: run 1 decodes alone but reads its prefix from the cache, so a cache hit alone changed nothing.
    assert len(alone) == 2 and alone["cached_prompt_tokens"].max() > 0
    assert (report.runs["max_logit_gap"] < 1e-3).all()  # last-bit differences, not a broken path


def test_the_harness_refuses_bad_settings(tiny):
    with pytest.raises(ValueError, match="runs"):
        divergence_experiment(tiny, None, PROMPT, runs=0)


def test_serve_takes_the_mode_from_its_command_line():
    from workbench.cli import _parser
    from workbench.serve.options import engine_configs

    assert engine_configs(_parser().parse_args(["serve", "--batch-invariant"]))["batch_invariant"] is True
    assert "batch_invariant" not in engine_configs(_parser().parse_args(["serve"]))
