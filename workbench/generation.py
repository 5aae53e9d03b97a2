"""Single-sequence generation loops: the chapter-2 baselines and the simplest correct references.

Two ways to produce the same tokens:

* ``use_cache=False`` recomputes the whole sequence at every step (no KV cache): step t costs a forward over
  t tokens, so total work grows with the square of the length;
* ``use_cache=True`` keeps keys and values in a pre-allocated contiguous buffer and feeds only the newest token.

Greedy outputs of the two are identical; their timings are what chapter 2 plots. The batched, paged engine
(`workbench.engine`) is checked against these loops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from workbench.cache.contiguous import ContiguousKVCache
from workbench.config import SamplingParams
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench.prompts import check_context, encode_prompt, eos_token_ids
from workbench.sampling import apply_history, make_generator, sample


@dataclass(slots=True)
class TokenEvent:
    token_id: int
    time_s: float  # seconds since the request started
    text: str = ""  # newly completed text (streaming); empty when no tokenizer is given


@dataclass(slots=True)
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)  # since the request started
    text: str = ""
    finish_reason: str = "length"

    @property
    def ttft_s(self) -> float:
        """Time to first token: prefill plus the first sampling."""
        return self.token_times_s[0] if self.token_times_s else float("nan")

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive tokens."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first token (the decode phase alone)."""
        n = len(self.token_times_s) - 1
        return n / (self.token_times_s[-1] - self.token_times_s[0]) if n > 0 else float("nan")

    @property
    def total_s(self) -> float:
        return self.token_times_s[-1] if self.token_times_s else 0.0


@torch.inference_mode()
def stream_token_ids(model: LlamaModel, prompt_ids: list[int], params: SamplingParams, *,
                     use_cache: bool = True, eos_ids: set[int] | frozenset[int] = frozenset()
                     ) -> Iterator[TokenEvent]:
    """Yield each generated token as soon as it is sampled. Stops at max_tokens (None: the end of the model's
    context), an EOS or stop token id (included in the output). A prompt and max_tokens past the context are
    refused (`workbench.prompts.check_context`)."""
    start = time.perf_counter()
    max_context = model.spec.max_context
    check_context(len(prompt_ids), params.max_tokens, max_context)
    device = model.device
    stop_ids = params.stop_ids(eos_ids)
    budget = max_context - len(prompt_ids) if params.max_tokens is None else params.max_tokens
    generator = make_generator(params, device)
    tokens = torch.tensor(prompt_ids, dtype=torch.long, device=device)
    cache = None
    if use_cache:
        cache = ContiguousKVCache(model.spec, max_batch=1, max_len=len(prompt_ids) + budget,
                                  dtype=model.dtype, device=device)
    cached = 0
    for _ in range(budget):
        if cache is None:  # feed everything, every step
            inputs, positions = tokens, torch.arange(len(tokens), device=device)
            attention = NoCacheAttention([len(tokens)], model.attention_scale)
        else:  # feed only what the cache does not hold yet
            inputs = tokens[cached:]
            positions = torch.arange(cached, len(tokens), device=device)
            attention = cache.attention([0], [cached], [len(inputs)])
            cached = len(tokens)
        hidden = model(inputs, positions, attention)
        logits = model.compute_logits(hidden[-1:])[0]
        if params.reads_history:  # penalties, min_tokens
            logits = apply_history(logits, params, tokens.tolist(), len(prompt_ids), stop_ids)
        token = sample(logits, params, generator)
        yield TokenEvent(token, time.perf_counter() - start)
        if token in stop_ids:
            return
        tokens = torch.cat([tokens, torch.tensor([token], device=device)])


def generate(model: LlamaModel, tokenizer, prompt: str | list[int], params: SamplingParams | None = None, *,
             use_cache: bool = True, chat: bool = True,
             on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Generate one completion: tokens, text, finish reason ("stop" or "length") and per-token timestamps.

    ``on_text`` is called with each newly completed piece of text as it is produced (streaming).
    """
    params = params or SamplingParams()
    prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
    result = GenerationResult(prompt_ids=prompt_ids)
    detok = IncrementalDetokenizer.for_params(tokenizer, params)
    eos = eos_token_ids(tokenizer)
    stop_ids = params.stop_ids(eos)
    for event in stream_token_ids(model, prompt_ids, params, use_cache=use_cache, eos_ids=eos):
        result.token_ids.append(event.token_id)
        result.token_times_s.append(event.time_s)
        delta = detok.push(event.token_id)
        if delta and on_text is not None:
            on_text(delta)
        if detok.stopped_on is not None or event.token_id in stop_ids:
            result.finish_reason = "stop"
            break
    result.text = detok.text
    return result
