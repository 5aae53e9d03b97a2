"""Requests at the door of the engine: validation, turning a prompt into sequences, and reporting them back.

Everything a caller can get wrong is checked here, before the engine's state changes, so a bad request raises
a ``ValueError`` that names the value and the allowed range while the requests already queued keep running:
the prompt, the sampling parameters, ``priority`` and ``num_speculative_tokens``. ``max_tokens`` has one policy,
owned here (``resolved_max_tokens``): a prompt and ``max_tokens`` past the model's context are refused
(`workbench.prompts.ContextLengthError`, never capped), a missing ``max_tokens`` (None) becomes what the context
and the KV pool leave, and a request that could never fit the whole KV pool is refused instead of waiting
forever. The server runs the same function before admitting a request. What a request is checked against is
fixed when the engine is built (``RequestLimits``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from workbench.config import MAX_SPECULATIVE_TOKENS, CacheConfig, ModelSpec, SamplingParams, SchedulerConfig
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.engine.outputs import CompletionOutput, RequestOutput
from workbench.engine.sequence import FinishReason, Sequence
from workbench.intmath import ceil_div
from workbench.prompts import check_context, encode_prompt
from workbench.sampling import make_generator

# A request's priority may be any integer in [-PRIORITY_BOUND, PRIORITY_BOUND]: a signed 32-bit range, as wide as
# any client's scheme needs, so a typo of many digits is refused instead of sorting ahead of everything.
PRIORITY_BOUND = 2**31


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
    spec_depth: int = 0  # the engine's K for a request that names none (0: the engine does not speculate)

    @classmethod
    def of(cls, spec: ModelSpec, cache: CacheConfig, scheduler: SchedulerConfig, num_blocks: int,
           spec_depth: int = 0) -> RequestLimits:
        return cls(spec.vocab_size, spec.max_context, cache.block_size, num_blocks, scheduler.max_num_batched_tokens,
                   scheduler.enable_chunked_prefill, spec_depth=spec_depth)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks one sequence of ``num_tokens`` tokens takes at most."""
        return self.blocks_for(num_tokens) if self.blocks_for else ceil_div(num_tokens, self.block_size)

    def most_tokens(self) -> int:
        """The longest sequence the context and the whole KV pool can hold."""
        low, high = 0, self.max_context  # blocks_needed grows with the length: the longest that fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.blocks_needed(middle) <= self.num_blocks else (low, middle - 1)
        return low


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]  # seqs[0] is scheduled first; the others fork from it once its prompt is cached

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def resolved_max_tokens(num_prompt_tokens: int, params: SamplingParams, limits: RequestLimits) -> int:
    """The most tokens a request's sequences may generate: its ``max_tokens``, or (None) what the context and the KV
    pool leave. ``ContextLengthError`` past the context; ValueError when the pool could never hold the request, or
    leaves too little for ``min_tokens``."""
    check_context(num_prompt_tokens, params.max_tokens, limits.max_context)
    max_tokens = params.max_tokens
    if max_tokens is None:
        max_tokens = limits.most_tokens() - num_prompt_tokens
        if max_tokens < max(1, params.min_tokens):
            raise ValueError(f"prompt of {num_prompt_tokens} tokens leaves room for {max(max_tokens, 0)} generated "
                             f"tokens in the KV pool ({limits.num_blocks} blocks), fewer than the "
                             f"{max(1, params.min_tokens)} asked for (min_tokens): shorten the prompt or give the "
                             "cache more blocks")
    total = num_prompt_tokens + max_tokens
    need = limits.blocks_needed(total)
    if need > limits.num_blocks:
        raise ValueError(f"request needs up to {need} KV blocks ({total} tokens of prompt and max_tokens) but "
                         f"the whole cache has {limits.num_blocks}: lower max_tokens, shorten the prompt or "
                         "give the cache more blocks")
    budget = limits.max_num_batched_tokens
    if not limits.enable_chunked_prefill and total > budget:
        raise ValueError(f"without chunked prefill a sequence of up to {total} tokens must fit in one step, "
                         f"but max_num_batched_tokens is {budget}: enable chunked prefill or raise the budget")
    return max_tokens


def checked_prompt(prompt: str | list[int], params: SamplingParams, tokenizer, chat: bool,
                   limits: RequestLimits) -> tuple[list[int], int]:
    """The prompt's token ids and the most tokens its sequences may generate, or ValueError saying what is wrong."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if isinstance(prompt, str) and tokenizer is None:
        raise ValueError("this engine has no tokenizer: pass the prompt as a list of token ids")
    prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
    bad = [t for t in prompt_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})")
    return prompt_ids, resolved_max_tokens(len(prompt_ids), params, limits)


def checked_priority(priority: int) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > PRIORITY_BOUND:
        raise ValueError(f"priority must be an integer in [-2**31, 2**31] (lower runs first), got {priority!r}")
    return priority


def speculative_tokens(requested: int | None, params: SamplingParams, limits: RequestLimits) -> int:
    """How many tokens to draft per step for a request: ``requested`` (None: the engine's K), 0 for parameters that
    need one token per step (penalties, min_tokens, logprobs: ``SamplingParams.one_token_per_step``)."""
    if requested is None:
        requested = limits.spec_depth
    elif not isinstance(requested, int) or isinstance(requested, bool) or not 0 <= requested <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"num_speculative_tokens must be an integer in [0, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {requested!r}")
    elif requested and not limits.spec_depth:
        raise ValueError("speculative decoding is off in this engine: create it with a spec_config")
    return 0 if params.one_token_per_step else requested


def new_request(request_id: str, prompt: str | list[int], params: SamplingParams, *, tokenizer,
                limits: RequestLimits, seq_ids: Iterator[int], arrival_time: float, chat: bool,
                num_speculative_tokens: int | None, priority: int, device: torch.device, tree_slots: int = 0,
                queued_time: float | None = None) -> Request:
    """A validated request with its ``params.n`` sequences (seeded ones get seed, seed + 1, ...), each with
    ``max_tokens`` resolved; ``tree_slots``: the slots a token tree takes beyond the newest token (0 for chains);
    ``queued_time``: when the engine took it (None: its arrival time)."""
    prompt_ids, max_tokens = checked_prompt(prompt, params, tokenizer, chat, limits)
    spec_k = speculative_tokens(num_speculative_tokens, params, limits)
    priority = checked_priority(priority)
    spec_slots = tree_slots if spec_k else 0
    max_total = len(prompt_ids) + max_tokens
    if params.max_tokens != max_tokens:  # None resolved: what the context and the pool leave
        params = replace(params, max_tokens=max_tokens)
    seqs = []
    for index in range(params.n):
        seq_params = params if params.seed is None else replace(params, seed=params.seed + index)
        if index and params.prompt_logprobs is not None:  # the prompt's are the first sequence's; siblings fork it
            seq_params = replace(seq_params, prompt_logprobs=None)
        seqs.append(Sequence(
            next(seq_ids), request_id, list(prompt_ids), seq_params, max_total, arrival_time,
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
