"""Prompt log-probabilities (vLLM's ``prompt_logprobs``, what OpenAI's ``echo`` + ``logprobs`` and lm-eval's
log-likelihood tasks read) equal transformers' on the same weights, however the prompt is prefilled: in one step,
in chunks, beside other requests, after a prefix-cache hit was possible, and again after a preemption.

The reference is ``log_softmax`` of ``LlamaForCausalLM``'s logits over the whole prompt (fp32, CPU).
"""

from __future__ import annotations

import pytest
import torch

from workbench.cache.block_invariants import check_block_manager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine

PROMPT = ("The key-value cache keeps the keys and values of every token already seen, so each new token attends "
          "to them without recomputing the prompt. Paged attention stores them in fixed-size blocks.")
OTHER = "Write a haiku about autumn leaves, then explain why it has seventeen syllables."
TOL = 1e-4


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer(PROMPT, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def reference(reference_model, prompt_ids):
    """[len(prompt) - 1, vocab]: the log-probabilities of each next token after each prompt prefix."""
    with torch.inference_mode():
        logits = reference_model(torch.tensor([prompt_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def _engine(model, tokenizer, *, num_blocks=128, prefix=True, **scheduler) -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks, block_size=16,
                                                                enable_prefix_caching=prefix),
                     scheduler_config=SchedulerConfig(**scheduler))


def _finish(engine: LLMEngine, request_ids: list[str]) -> dict:
    outputs = {}
    for _ in range(2000):
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output
        if not engine.has_unfinished_requests():
            break
    assert set(outputs) == set(request_ids)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks, "blocks leaked"
    check_block_manager(engine.blocks)
    return outputs


def _check(entries, prompt_ids, reference, num_top: int) -> None:
    assert entries[0] is None and len(entries) == len(prompt_ids)
    for position, entry in enumerate(entries[1:], start=1):
        row = reference[position - 1]
        assert entry.token_id == prompt_ids[position]
        assert entry.logprob == pytest.approx(float(row[prompt_ids[position]]), abs=TOL)
        assert entry.rank == int((row > row[prompt_ids[position]]).sum()) + 1 or abs(
            float(row.sort(descending=True).values[entry.rank - 1]) - entry.logprob) < TOL  # ties within rounding
        top = torch.topk(row, num_top)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=TOL)


@pytest.mark.parametrize("chunk", [None, 7], ids=["one-step", "chunks-of-7"])
def test_prompt_logprobs_equal_transformers(real_model, tokenizer, prompt_ids, reference, chunk):
    engine = _engine(real_model, tokenizer, max_prefill_chunk=chunk)
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=3, prompt_logprobs=2))
    other = engine.add_request(OTHER, SamplingParams(max_tokens=3), chat=False)  # shares the steps
    outputs = _finish(engine, [rid, other])
    _check(outputs[rid].prompt_logprobs, prompt_ids, reference, 2)
    assert outputs[other].prompt_logprobs is None


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(real_model, tokenizer, prompt_ids, reference):
    """The prompt's blocks are in the prefix cache; a request that asks for its log-probabilities prefills it
    again (no lookup, no prefix-cache query counted), while a plain request still hits."""
    engine = _engine(real_model, tokenizer)
    _finish(engine, [engine.add_request(prompt_ids, SamplingParams(max_tokens=2), request_id="warm")])
    stats = engine.blocks.stats
    queried, hits = stats.queried_tokens, stats.hit_tokens
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=2, prompt_logprobs=0), request_id="logprobs")
    seq = engine.requests[rid].seqs[0]
    out = _finish(engine, [rid])[rid]
    _check(out.prompt_logprobs, prompt_ids, reference, 0)
    assert seq.num_cached_prompt_tokens == 0
    assert (stats.queried_tokens, stats.hit_tokens) == (queried, hits)
    plain = engine.add_request(prompt_ids, SamplingParams(max_tokens=2), request_id="plain")
    seq = engine.requests[plain].seqs[0]
    _finish(engine, [plain])
    assert seq.num_cached_prompt_tokens == (len(prompt_ids) - 1) // 16 * 16 > 0


def test_siblings_share_one_list(real_model, tokenizer, prompt_ids, reference):
    engine = _engine(real_model, tokenizer)
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=4, prompt_logprobs=1, n=2, temperature=1.0,
                                                        seed=3))
    _check(_finish(engine, [rid])[rid].prompt_logprobs, prompt_ids, reference, 1)


def test_a_prompt_preempted_mid_prefill_reports_each_token_once(real_model, tokenizer, prompt_ids, reference):
    """A long decode takes the pool while the prompt is prefilled in chunks: the prompt is preempted, recomputed
    from the start later, and each prompt token is reported once, with the same values."""
    decoding = tokenizer(OTHER, add_special_tokens=False)["input_ids"]
    grow = 6 * 16 - len(decoding)  # the decode alone fills 6 blocks
    engine = _engine(real_model, tokenizer, num_blocks=6, max_prefill_chunk=8)
    first = engine.add_request(decoding, SamplingParams(max_tokens=grow, ignore_eos=True))
    seq = engine.requests[first].seqs[0]
    while seq.num_tokens < 3 * 16:  # 3 blocks full: its next token needs a 4th of the 3 left
        engine.step()
    second = engine.add_request(prompt_ids, SamplingParams(max_tokens=2, prompt_logprobs=0))
    outputs = _finish(engine, [first, second])
    assert sum(r.preemptions for r in engine.metrics.steps) > 0, "the pool was meant to force a preemption"
    _check(outputs[second].prompt_logprobs, prompt_ids, reference, 0)


def test_prompt_logprobs_range_is_checked():
    for bad in (-1, 21, 1.5):
        with pytest.raises(ValueError, match=r"prompt_logprobs must be None or an integer in \[0, 20\]"):
            SamplingParams(prompt_logprobs=bad)
