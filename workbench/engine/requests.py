"""Requests at the door of the engine: validation, turning a prompt into sequences, and reporting them back.

Everything a caller can get wrong is checked here, before the engine's state changes, so a bad request raises
a ``ValueError`` that names the value and the allowed range while the requests already queued keep running.
A request whose prompt and ``max_tokens`` could never fit in the whole KV pool is refused here too, instead of
waiting forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.cache.block_manager import BlockManager
from workbench.config import SamplingParams
from workbench.engine.detokenizer import IncrementalDetokenizer
from workbench.engine.outputs import CompletionOutput, RequestOutput
from workbench.engine.sequence import Sequence, SequenceStatus
from workbench.prompts import check_prompt_fits, encode_prompt
from workbench.sampling import make_generator

if TYPE_CHECKING:
    from workbench.engine.llm_engine import LLMEngine


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    pending_forks: list[Sequence] = field(default_factory=list)  # siblings waiting for the prompt's KV

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def fork_children(self, blocks: BlockManager) -> list[Sequence]:
        """Siblings (n > 1) share the parent's prompt blocks from here on; copy-on-write separates them."""
        parent = self.seqs[0]
        children, self.pending_forks = self.pending_forks, []
        for child in children:
            blocks.fork(parent.seq_id, child.seq_id)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            child.first_scheduled_time = parent.first_scheduled_time
            child.status = SequenceStatus.RUNNING
        return children


def _validate_ids(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


def new_request(engine: LLMEngine, request_id: str, prompt: str | list[int], params: SamplingParams,
                arrival_time: float, chat: bool) -> Request:
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if isinstance(prompt, str) and engine.tokenizer is None:
        raise ValueError("this engine has no tokenizer: pass the prompt as a list of token ids")
    prompt_ids = encode_prompt(engine.tokenizer, prompt, chat=chat)
    spec = engine.model.spec
    _validate_ids(prompt_ids, spec.vocab_size)
    check_prompt_fits(len(prompt_ids), spec.max_context)
    max_total = min(len(prompt_ids) + params.max_tokens, spec.max_context)
    block_size = engine.cache_config.block_size
    need = -(-max_total // block_size)
    if need > engine.blocks.num_blocks:
        raise ValueError(f"request needs up to {need} KV blocks ({max_total} tokens of prompt and max_tokens) but "
                         f"the whole cache has {engine.blocks.num_blocks}: lower max_tokens, shorten the prompt or "
                         "give the cache more blocks")
    budget = engine.scheduler_config.max_num_batched_tokens
    if not engine.scheduler_config.enable_chunked_prefill and max_total > budget:
        raise ValueError(f"without chunked prefill a sequence of up to {max_total} tokens must fit in one step, "
                         f"but max_num_batched_tokens is {budget}: enable chunked prefill or raise the budget")
    seqs = []
    for index in range(params.n):
        seq_params = params if params.seed is None else _with_seed(params, params.seed + index)
        seqs.append(Sequence(
            seq_id=next(engine._seq_ids), request_id=request_id, prompt_ids=list(prompt_ids), params=seq_params,
            max_total_tokens=max_total, arrival_time=arrival_time,
            generator=make_generator(seq_params, engine.model.device),
            detokenizer=IncrementalDetokenizer(engine.tokenizer, params.stop) if engine.tokenizer else None))
    return Request(request_id, prompt_ids, params, seqs, pending_forks=seqs[1:])


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, seed=seed)


def build_output(request: Request, since_last_look: bool = False) -> RequestOutput:
    """The request's completions; with ``since_last_look`` the deltas are relative to the previous such call."""
    outputs = []
    for index, seq in enumerate(request.seqs):
        start, text_start = (seq.num_returned_tokens, seq.returned_text_len) if since_last_look else (0, 0)
        text = seq.text
        outputs.append(CompletionOutput(
            index=index, token_ids=list(seq.output_ids), text=text,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            new_token_ids=seq.output_ids[start:], new_text=text[text_start:]))
        if since_last_look:
            seq.num_returned_tokens, seq.returned_text_len = len(seq.output_ids), len(text)
    return RequestOutput(request.request_id, request.prompt_ids, outputs)
