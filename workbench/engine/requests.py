"""Requests at the door of the engine: validation, turning a prompt into sequences, and reporting them back.

Everything a caller can get wrong is checked here, before the engine's state changes, so a bad request raises
a ``ValueError`` that names the value and the allowed range while the requests already queued keep running.
A request whose prompt and ``max_tokens`` could never fit in the whole KV pool is refused here too, instead of
waiting forever. What a request is checked against is fixed when the engine is built (``RequestLimits``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from workbench.cache.block_manager import BlockManager
from workbench.config import CacheConfig, ModelSpec, SamplingParams, SchedulerConfig
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.engine.outputs import CompletionOutput, RequestOutput
from workbench.engine.sequence import FinishReason, Sequence
from workbench.prompts import check_prompt_fits, encode_prompt
from workbench.sampling import make_generator


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What every request must fit: the model's vocabulary and context, the KV pool, and one step's budget."""

    vocab_size: int
    max_context: int
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    # Blocks a sequence of n tokens takes at most, when that is not ceil(n / block_size): KV groups with
    # sliding windows (`workbench.cache.kv_groups.KVGroupLayout.blocks_needed`).
    blocks_for: Callable[[int], int] | None = None

    @classmethod
    def of(cls, spec: ModelSpec, cache: CacheConfig, scheduler: SchedulerConfig, num_blocks: int) -> RequestLimits:
        return cls(spec.vocab_size, spec.max_context, cache.block_size, num_blocks, scheduler.max_num_batched_tokens,
                   scheduler.enable_chunked_prefill)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]  # seqs[0] is scheduled first; the others fork from it once its prompt is cached

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def checked_prompt(prompt: str | list[int], params: SamplingParams, tokenizer, chat: bool,
                   limits: RequestLimits) -> tuple[list[int], int]:
    """The prompt's token ids and the most tokens its sequences may reach, or ValueError saying what is wrong."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if isinstance(prompt, str) and tokenizer is None:
        raise ValueError("this engine has no tokenizer: pass the prompt as a list of token ids")
    prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
    bad = [t for t in prompt_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})")
    check_prompt_fits(len(prompt_ids), limits.max_context)
    max_total = min(len(prompt_ids) + params.max_tokens, limits.max_context)
    need = limits.blocks_for(max_total) if limits.blocks_for else -(-max_total // limits.block_size)
    if need > limits.num_blocks:
        raise ValueError(f"request needs up to {need} KV blocks ({max_total} tokens of prompt and max_tokens) but "
                         f"the whole cache has {limits.num_blocks}: lower max_tokens, shorten the prompt or "
                         "give the cache more blocks")
    budget = limits.max_num_batched_tokens
    if not limits.enable_chunked_prefill and max_total > budget:
        raise ValueError(f"without chunked prefill a sequence of up to {max_total} tokens must fit in one step, "
                         f"but max_num_batched_tokens is {budget}: enable chunked prefill or raise the budget")
    return prompt_ids, max_total


def new_request(request_id: str, prompt: str | list[int], params: SamplingParams, *, tokenizer,
                limits: RequestLimits, blocks: BlockManager, seq_ids: Iterator[int], arrival_time: float,
                chat: bool, spec_k: int, priority: int, device: torch.device, spec_slots: int = 0,
                queued_time: float | None = None) -> Request:
    """A validated request with its ``params.n`` sequences (seeded ones get seed, seed + 1, ...); ``spec_slots``:
    the slots a token tree takes beyond the newest token (0 for chains); ``queued_time``: when the engine took
    it (None: its arrival time)."""
    prompt_ids, max_total = checked_prompt(prompt, params, tokenizer, chat, limits)
    seqs = []
    for index in range(params.n):
        seq_params = params if params.seed is None else replace(params, seed=params.seed + index)
        if index and params.prompt_logprobs is not None:  # the prompt's are the first sequence's; siblings fork it
            seq_params = replace(seq_params, prompt_logprobs=None)
        seqs.append(Sequence(
            next(seq_ids), request_id, list(prompt_ids), seq_params, max_total, arrival_time, blocks=blocks,
            generator=make_generator(seq_params, device), spec_k=spec_k, spec_slots=spec_slots, priority=priority,
            queued_time=queued_time,
            detokenizer=IncrementalDetokenizer.for_params(tokenizer, params) if tokenizer else None))
    return Request(request_id, prompt_ids, params, seqs)


def build_output(request: Request, since_last_look: bool = False) -> RequestOutput:
    """The request's completions; with ``since_last_look`` the deltas are relative to the previous such call."""
    outputs = []
    for index, seq in enumerate(request.seqs):
        start, text_start = (seq.num_returned_tokens, seq.returned_text_len) if since_last_look else (0, 0)
        text, output_ids = seq.text, seq.output_ids
        outputs.append(CompletionOutput(
            index=index, token_ids=output_ids, text=text,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            new_token_ids=output_ids[start:], new_text=text[text_start:],
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None, error=seq.error,
            stop_reason=stop_reason(seq)))
        if since_last_look:
            seq.num_returned_tokens, seq.returned_text_len = len(output_ids), len(text)
    prompt_logprobs = None
    if request.params.prompt_logprobs is not None:
        prompt_logprobs = [None, *request.seqs[0].prompt_logprobs]
    return RequestOutput(request.request_id, request.prompt_ids, outputs, prompt_logprobs)


def stop_reason(seq: Sequence) -> str | int | None:
    """What stopped a sequence that finished with "stop": its stop string, or its stop token id unless that is an
    EOS the request did not name (vLLM reports None then)."""
    if seq.finish_reason is not FinishReason.STOP:
        return None
    if seq.detokenizer is not None and seq.detokenizer.stopped_on is not None:
        return seq.detokenizer.stopped_on
    last = seq.token_ids[-1] if seq.num_output_tokens else None
    return last if last in seq.params.stop_token_ids else None
