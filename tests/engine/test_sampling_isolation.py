"""One request's numbers never break another's: extreme but legal sampling values stay finite (vLLM's temperature
rules, a top-p that always keeps the most likely token, logits that saturate instead of overflowing), and a row
that still gives no distribution fails its own sequence with finish reason "error" while every other sequence of
the same steps gets exactly the tokens it gets alone."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, effective_temperature
from workbench.engine.llm_engine import LLMEngine
from workbench.sampling import SamplingError, apply_history, make_generator, probabilities, sample_batch

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_follows_vllms_rules():
    assert effective_temperature(0.0) == 0.0
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=9e-6).greedy
    assert SamplingParams(temperature=1e-5).temperature == 1e-2
    assert SamplingParams(temperature=1e-3).temperature == 1e-2
    assert SamplingParams(temperature=0.7).temperature == 0.7
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1e-300)


@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 1e-6])
def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token(top_p):
    probs = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [1, 0, 0, 0, 0, 0]


def test_a_tiny_repetition_penalty_saturates_instead_of_overflowing():
    params = SamplingParams(temperature=1.0, repetition_penalty=1e-38)
    logits = apply_history(LOGITS * 4, params, [0, 3], num_prompt_tokens=2, stop_ids=set())
    assert math.isinf(float(logits[0]))  # 8 / 1e-38 overflows float32
    probs = probabilities(logits, params)
    assert torch.isfinite(probs).all() and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert probs[0] == 1.0  # the overflowed logit stands for "most likely"


def test_a_nan_row_fails_alone_and_the_other_rows_draw_as_without_it():
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS * 0.5])
    alone = sample_batch(logits[[0, 2]], [params[0], params[2]], [make_generator(p) for p in (params[0], params[2])])
    poisoned = logits.clone()
    poisoned[1, 3] = float("nan")
    got = sample_batch(poisoned, params, [make_generator(p) for p in params])
    assert isinstance(got[1], SamplingError) and "NaN" in str(got[1])
    assert [got[0], got[2]] == alone
    greedy = sample_batch(poisoned, [SamplingParams()] * 3, [None] * 3)
    assert greedy[0] == 0 and isinstance(greedy[1], SamplingError) and greedy[2] == 0


PROMPTS = ["Write a haiku about autumn leaves.", "List three uses of a paperclip.", "Name a color."]


def _engine(real_model, tokenizer) -> LLMEngine:
    return LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=128))


def _poisoned() -> SamplingParams:
    """A value that slipped past every check (validation cannot catch what it does not know): NaN temperature."""
    params = SamplingParams(max_tokens=12, temperature=1.0)
    object.__setattr__(params, "temperature", float("nan"))
    return params


def test_the_engine_fails_one_sequence_and_the_others_match_their_runs_alone(real_model, tokenizer):
    healthy = [SamplingParams(max_tokens=12, ignore_eos=True),
               SamplingParams(max_tokens=12, temperature=0.8, seed=11, ignore_eos=True),
               SamplingParams(max_tokens=12, temperature=1e-300, top_p=5e-324, repetition_penalty=1e-38,
                              ignore_eos=True)]
    engine = _engine(real_model, tokenizer)
    alone = [engine.generate([p], [params], progress=False)[0].token_ids for p, params in zip(PROMPTS, healthy,
                                                                                              strict=True)]
    outputs = engine.generate([*PROMPTS, PROMPTS[0]], [*healthy, _poisoned()], progress=False)
    assert [o.token_ids for o in outputs[:3]] == alone
    assert all(o.outputs[0].finish_reason == "length" for o in outputs[:3])
    bad = outputs[3].outputs[0]
    assert bad.finish_reason == "error" and bad.token_ids == [] and "not a distribution" in bad.error
    assert not engine.has_unfinished_requests()
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks  # the failed sequence's blocks came back
    check_block_manager(engine.blocks)
    assert [s.finish_reason.value for s in engine.metrics.finished][-4:].count("error") == 1
