"""The sampler draws from exactly the distribution its parameters describe."""

from __future__ import annotations

import torch

from workbench.config import SamplingParams
from workbench.sampling import make_generator, probabilities, sample, sample_batch

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_scales_the_softmax():
    p = probabilities(LOGITS, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(LOGITS / 0.5, -1))


def test_top_k_keeps_exactly_k_tokens():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=3))
    assert (p > 0).sum() == 3 and torch.isclose(p.sum(), torch.tensor(1.0))
    assert torch.allclose(p[:3], torch.softmax(LOGITS[:3], -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = torch.softmax(LOGITS, -1)  # [0.55, 0.20, 0.12, 0.07, 0.03, 0.004]
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))
    assert (p > 0).tolist() == [True, True, False, False, False, False]
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())


def test_greedy_is_one_hot_on_the_argmax():
    assert probabilities(LOGITS, SamplingParams()).tolist() == [1, 0, 0, 0, 0, 0]
    assert sample(LOGITS, SamplingParams()) == 0


def test_sampled_frequencies_follow_the_distribution():
    params = SamplingParams(temperature=1.0, top_k=4, seed=123)
    gen = make_generator(params)
    draws = torch.tensor([sample(LOGITS, params, gen) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=6).float() / len(draws)
    expected = probabilities(LOGITS, params)
    # Four standard errors of a binomial proportion at n = 4000 is at most 0.032.
    assert (freq - expected).abs().max() < 0.032
    assert freq[4:].sum() == 0


def test_batch_mixes_greedy_and_sampled_rows():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=5)]
    tokens = sample_batch(logits, params, [None, make_generator(params[1])])
    assert tokens[0] == 0 and 0 <= tokens[1] < 6
