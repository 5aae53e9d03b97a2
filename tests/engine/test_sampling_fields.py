"""vLLM's sampling extensions, as the engine honours them: each against a reference written elsewhere
(transformers' logits processors and ``generate``) or, where transformers has no counterpart (frequency and
presence penalties), against the definition computed independently here.

The engine runs them batched and paged, beside requests without them; ``SamplingParams.one_token_per_step``
keeps such requests out of speculative decoding, which is checked too.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.engine.llm_engine import LLMEngine
from workbench.prompts import encode_prompt
from workbench.sampling import apply_history, probabilities

SKY = "Answer with one word: what color is the sky?"  # greedy: 10 tokens, then <|im_end|>
OTHER = "List three uses of a paperclip."


def _engine(model, tokenizer, **configs) -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=256),
                     scheduler_config=SchedulerConfig(), **configs)


def _hf_greedy(reference_model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> list[int]:
    ids = encode_prompt(tokenizer, prompt)
    out = reference_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=tokenizer.eos_token_id, **kwargs)
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------------------------- the processors alone
def test_repetition_penalty_matches_transformers():
    torch.manual_seed(0)
    logits, history = torch.randn(50) * 3, [3, 7, 7, 11, 40, 3]
    params = SamplingParams(repetition_penalty=1.7)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([history]), logits.clone()[None])[0]
    ours = apply_history(logits, params, history, num_prompt_tokens=2, stop_ids=set())
    torch.testing.assert_close(ours, theirs)


def test_frequency_and_presence_penalties_follow_their_definition():
    """logit[t] -= frequency x count(t in output) + presence x [t in output]; the prompt does not count."""
    torch.manual_seed(1)
    logits, prompt, output = torch.randn(30), [1, 2, 2, 5], [2, 9, 9, 9, 4]
    params = SamplingParams(frequency_penalty=0.4, presence_penalty=-1.1)
    counts = collections.Counter(output)
    expected = torch.tensor([float(logits[t]) - 0.4 * counts[t] - (-1.1) * (counts[t] > 0) for t in range(30)])
    torch.testing.assert_close(apply_history(logits, params, prompt + output, len(prompt), set()), expected)


def test_min_tokens_masks_the_stop_tokens_until_enough_are_out():
    logits = torch.zeros(10)
    params = SamplingParams(min_tokens=2, max_tokens=5, stop_token_ids=(4,))
    early = apply_history(logits, params, [0, 1, 8], num_prompt_tokens=2, stop_ids={4, 9})
    assert math.isinf(early[4]) and math.isinf(early[9]) and early[:4].eq(0).all()
    assert apply_history(logits, params, [0, 1, 8, 8], 2, {4, 9}).eq(0).all()


@pytest.mark.parametrize("min_p,temperature", [(0.05, 1.0), (0.3, 0.7), (0.9, 1.3)])
def test_min_p_matches_transformers(min_p, temperature):
    torch.manual_seed(2)
    logits = torch.randn(200) * 2
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone()[None])
    scores = MinPLogitsWarper(min_p)(None, scores)[0]
    theirs = torch.softmax(scores, -1)
    ours = probabilities(logits, SamplingParams(temperature=temperature, min_p=min_p))
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_respect_min_tokens_and_include_stop_str(tokenizer, include):
    ids = tokenizer.encode("red. blue. green.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, (".",), include_stop=include, min_tokens=3)
    for token in ids:
        detok.push(token)
        if detok.stopped_on:
            break
    # "red." ends inside the first three tokens, so the first stop that counts is after "blue".
    assert detok.text == ("red. blue." if include else "red. blue")


# ---------------------------------------------------------------------------------------- the engine
def test_engine_greedy_with_repetition_penalty_matches_transformers(real_model, tokenizer, reference_model):
    engine = _engine(real_model, tokenizer)
    outs = engine.generate([SKY, OTHER], [SamplingParams(max_tokens=24, repetition_penalty=1.3),
                                           SamplingParams(max_tokens=24)], progress=False)
    assert outs[0].token_ids == _hf_greedy(reference_model, tokenizer, SKY, 24, repetition_penalty=1.3)
    assert outs[1].token_ids == _hf_greedy(reference_model, tokenizer, OTHER, 24)


def test_engine_min_tokens_matches_transformers_min_new_tokens(real_model, tokenizer, reference_model):
    engine = _engine(real_model, tokenizer)
    plain = engine.generate([SKY], SamplingParams(max_tokens=24), progress=False)[0]
    assert plain.outputs[0].finish_reason == "stop" and len(plain.token_ids) < 14  # it would stop early
    out = engine.generate([SKY], SamplingParams(max_tokens=24, min_tokens=14), progress=False)[0]
    assert len(out.token_ids) >= 14
    assert out.token_ids == _hf_greedy(reference_model, tokenizer, SKY, 24, min_new_tokens=14)


def test_engine_penalties_match_the_single_sequence_loop(real_model, tokenizer):
    """Batched and paged beside a plain request, the penalties give the tokens of the contiguous-cache loop
    (which applies the same definition, tested above, one sequence at a time)."""
    from workbench.generation import generate

    params = SamplingParams(max_tokens=20, frequency_penalty=1.2, presence_penalty=0.5)
    engine = _engine(real_model, tokenizer)
    outs = engine.generate([OTHER, SKY], [params, SamplingParams(max_tokens=20)], progress=False)
    assert outs[0].token_ids == generate(real_model, tokenizer, OTHER, params).token_ids
    assert outs[0].token_ids != generate(real_model, tokenizer, OTHER, SamplingParams(max_tokens=20)).token_ids


def test_engine_logprobs_are_the_models_log_softmax(real_model, tokenizer, reference_model):
    """Each returned log-probability is log_softmax of transformers' logits at that position (raw: before the
    request's penalties and temperature), and the top alternatives are the most likely tokens, best first."""
    engine = _engine(real_model, tokenizer)
    params = SamplingParams(max_tokens=8, logprobs=3, repetition_penalty=1.2)
    out = engine.generate([SKY], params, progress=False)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    ids = encode_prompt(tokenizer, SKY) + out.token_ids
    with torch.no_grad():
        logits = reference_model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(ids) - len(out.token_ids) - 1: -1]
    for position, entry in enumerate(out.logprobs):
        assert entry.token_id == out.token_ids[position]
        assert entry.logprob == pytest.approx(float(expected[position, entry.token_id]), abs=1e-3)
        best = torch.topk(expected[position], 3)
        assert [t for t, _ in entry.top] == best.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(best.values.tolist(), abs=1e-3)


def test_requests_that_read_their_history_are_not_drafted(real_model, tokenizer):
    """With speculative decoding on, a request with penalties, min_tokens or logprobs decodes one token per
    step (its drafts would each need their own history) and gives the tokens of an engine without drafts."""
    spec = _engine(real_model, tokenizer, spec_config=SpecConfig(method="ngram", num_speculative_tokens=3))
    plain = _engine(real_model, tokenizer)
    for params in (SamplingParams(max_tokens=16, repetition_penalty=1.3), SamplingParams(max_tokens=16, logprobs=0)):
        request_id = spec.add_request(OTHER, params)
        assert all(seq.spec_k == 0 for seq in spec.requests[request_id].seqs)
        while spec.has_unfinished_requests():
            spec.step()
        ours = spec.metrics.finished[-1].output_ids
        assert ours == plain.generate([OTHER], params, progress=False)[0].token_ids
    assert spec.requests == {} or all(r.finished for r in spec.requests.values())


def test_the_single_sequence_loop_keeps_the_stop_string_when_asked(real_model, tokenizer):
    """workbench.generation.generate builds its detokenizer from the params as the engine does."""
    from workbench.generation import generate

    text = generate(real_model, tokenizer, SKY, SamplingParams(max_tokens=12)).text
    word = text.split()[2]
    cut = generate(real_model, tokenizer, SKY, SamplingParams(max_tokens=12, stop=(word,))).text
    kept = generate(real_model, tokenizer, SKY, SamplingParams(max_tokens=12, stop=(word,),
                                                               include_stop_str_in_output=True)).text
    assert kept == cut + word and text.startswith(kept)
