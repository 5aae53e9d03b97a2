"""The door of the engine (`workbench.engine.requests`) on its own: every request field it promises to check is
checked there, and ``max_tokens`` has one policy, whoever calls (the engine, the generation loop, the server)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from workbench.config import MAX_SPECULATIVE_TOKENS, SamplingParams
from workbench.engine.requests import PRIORITY_BOUND, RequestLimits, new_request, resolved_max_tokens
from workbench.prompts import ContextLengthError

LIMITS = RequestLimits(vocab_size=100, max_context=64, block_size=4, num_blocks=12, max_num_batched_tokens=64,
                       enable_chunked_prefill=True)


def request(limits: RequestLimits = LIMITS, prompt=(1, 2, 3), params: SamplingParams | None = None, **fields):
    fields = {"num_speculative_tokens": None, "priority": 0, **fields}
    return new_request("r", list(prompt), params or SamplingParams(max_tokens=4), tokenizer=None, limits=limits,
                       seq_ids=itertools.count(), arrival_time=0.0, chat=False, device=torch.device("cpu"), **fields)


@pytest.mark.parametrize(("fields", "match"), [
    ({"priority": PRIORITY_BOUND + 1}, r"priority must be an integer in \[-2\*\*31, 2\*\*31\]"),
    ({"priority": True}, "priority must be an integer"),
    ({"num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1},
     rf"num_speculative_tokens must be an integer in \[0, {MAX_SPECULATIVE_TOKENS}\]"),
    ({"num_speculative_tokens": -1}, "num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": 2}, "speculative decoding is off in this engine"),
])
def test_the_door_checks_priority_and_speculation_itself(fields, match):
    with pytest.raises(ValueError, match=match):
        request(**fields)


def test_speculation_defaults_to_the_engine_k_and_is_off_for_one_token_per_step_params():
    limits = replace(LIMITS, spec_depth=4)
    assert request(limits).seqs[0].spec_k == 4
    assert request(limits, num_speculative_tokens=0).seqs[0].spec_k == 0
    logprobs = SamplingParams(max_tokens=4, logprobs=1)
    assert request(limits, params=logprobs, num_speculative_tokens=3).seqs[0].spec_k == 0


# ---------------------------------------------------------------------------------------------- max_tokens
def test_past_the_context_is_refused_never_capped():
    with pytest.raises(ContextLengthError, match=r"maximum context length is 64 tokens, you requested 66 tokens "
                                                 r"\(6 in the prompt \+ 60 max_tokens\)") as caught:
        resolved_max_tokens(6, SamplingParams(max_tokens=60), LIMITS)
    assert caught.value.param == "max_tokens"
    with pytest.raises(ContextLengthError, match="64 tokens are in the prompt alone") as caught:
        resolved_max_tokens(64, SamplingParams(max_tokens=None), LIMITS)
    assert caught.value.param == "prompt" and caught.value.for_field("messages").param == "messages"
    assert "in the messages alone" in str(caught.value.for_field("messages"))


def test_a_missing_max_tokens_is_what_the_context_and_the_pool_leave():
    assert resolved_max_tokens(6, SamplingParams(max_tokens=None), LIMITS) == 12 * 4 - 6  # the pool is shorter
    roomy = replace(LIMITS, num_blocks=100)
    assert resolved_max_tokens(6, SamplingParams(max_tokens=None), roomy) == 64 - 6  # the context is shorter
    seq = request(params=SamplingParams(max_tokens=None)).seqs[0]
    assert seq.params.max_tokens == 45 and seq.max_total_tokens == 48 and seq.num_remaining_tokens == 45
    with pytest.raises(ValueError, match="fewer than the 46 asked for"):
        resolved_max_tokens(3, SamplingParams(max_tokens=None, min_tokens=46), LIMITS)


def test_a_request_the_pool_could_never_hold_is_refused():
    with pytest.raises(ValueError, match=r"needs up to 13 KV blocks \(50 tokens.*has 12"):
        resolved_max_tokens(10, SamplingParams(max_tokens=40), LIMITS)
