"""The engine: requests in, tokens out, one batched forward per step.

    engine = LLMEngine.from_pretrained("smollm2-135m")
    outputs = engine.generate(["Hello!", "What is a KV cache?"], SamplingParams(max_tokens=32))

    for delta in engine.stream("Tell me a story.", SamplingParams(max_tokens=64)):
        print(delta.outputs[0].new_text, end="")

A step: the scheduler picks sequences and token counts (decodes first, then prefill chunks), the runner runs
one forward over the mixed batch on the paged cache, the sampler picks next tokens, the engine appends them,
checks stop conditions, frees finished sequences' blocks, and stamps every event for the metrics.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq

import torch
from tqdm.auto import tqdm

from workbench.cache.block_manager import BlockManager
from workbench.cache.calibration import calibration_ids, fp8_scales
from workbench.cache.paged import PagedKVCache
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.cache_setup import kv_format_for, num_blocks_for
from workbench.engine.model_runner import ForwardResult, ModelRunner
from workbench.engine.outputs import RequestOutput
from workbench.engine.requests import Request, build_output, new_request
from workbench.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from workbench.engine.sequence import FinishReason, Sequence
from workbench.metrics.recorder import MetricsRecorder, StepRecord
from workbench.models.llama import LlamaModel
from workbench.prompts import eos_token_ids
from workbench.sampling import probabilities, sample_batch
from workbench.spec.proposer import Proposer, build_proposer
from workbench.spec.verify import verify_greedy, verify_sampled


class LLMEngine:
    def __init__(self, model: LlamaModel, tokenizer=None, *, cache_config: CacheConfig | None = None,
                 scheduler_config: SchedulerConfig | None = None, spec_config: SpecConfig | None = None,
                 draft_model=None):
        self.model, self.tokenizer = model, tokenizer
        self.cache_config = cache_config or CacheConfig()
        self.scheduler_config = scheduler_config or SchedulerConfig()
        num_blocks = num_blocks_for(model, self.cache_config, self.scheduler_config)
        kv_format = kv_format_for(self.cache_config, model.dtype)
        self.cache = PagedKVCache(model.spec, num_blocks, self.cache_config.block_size, dtype=model.dtype,
                                  device=model.device, kv_format=kv_format)
        if kv_format == "fp8_e4m3":
            self.cache.set_static_scales(*fp8_scales(model, calibration_ids(model, tokenizer)))
        self.blocks = BlockManager(num_blocks, self.cache_config.block_size,
                                   enable_prefix_caching=self.cache_config.enable_prefix_caching)
        self.scheduler = Scheduler(self.scheduler_config, self.blocks)
        self.runner = ModelRunner(model, self.cache, self.blocks)
        self.metrics = MetricsRecorder()
        self.requests: dict[str, Request] = {}
        self.eos_ids = eos_token_ids(tokenizer) if tokenizer is not None else set()
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        self._steps = 0
        self.clock = time.perf_counter
        self.spec_config = spec_config
        self.proposer: Proposer | None = None
        if spec_config is not None:
            self.proposer = build_proposer(spec_config, self, draft_model)
            self.runner.taps = self.proposer.taps

    @classmethod
    def from_pretrained(cls, name: str = "smollm2-135m", *, device: torch.device | str | None = None,
                        dtype: torch.dtype = torch.float32, weights: str = "auto", **configs) -> LLMEngine:
        """The real model (``weights``: ``auto``, ``int8`` or ``int8_all``, see `workbench.models.load_model`)."""
        from workbench.models import load_model

        model, tokenizer = load_model(name, dtype=dtype, device=device, weights=weights)
        return cls(model, tokenizer, **configs)

    # ----------------------------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, arrival_time: float | None = None, chat: bool = True,
                    num_speculative_tokens: int | None = None, priority: int = 0) -> str:
        """Queue a request; returns its id. Bad input raises ValueError and leaves the engine untouched.

        ``num_speculative_tokens`` overrides the engine's K for this request (0: no speculation). ``priority``
        (lower first) matters only with ``SchedulerConfig(scheduling_policy="priority")``."""
        request_id = request_id if request_id is not None else f"req-{next(self._request_ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        spec_k = self._spec_k(num_speculative_tokens)
        if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 2**31:
            raise ValueError(f"priority must be an integer in [-2**31, 2**31] (lower runs first), got {priority!r}")
        request = new_request(self, request_id, prompt, params or SamplingParams(),
                              self.clock() if arrival_time is None else arrival_time, chat)
        for seq in request.seqs:
            seq.spec_k = spec_k
            seq.priority = priority
        self.requests[request_id] = request
        self.scheduler.add(request.seqs[0])
        return request_id

    def _spec_k(self, requested: int | None) -> int:
        if requested is None:
            return self.spec_config.num_speculative_tokens if self.spec_config else 0
        if not isinstance(requested, int) or not 0 <= requested <= 16:
            raise ValueError(f"num_speculative_tokens must be an integer in [0, 16], got {requested!r}")
        if requested and self.proposer is None:
            raise ValueError("speculative decoding is off in this engine: create it with a spec_config")
        return requested

    def abort(self, request_id: str) -> None:
        """Stop a request now; its blocks are freed at once."""
        request = self.requests.pop(request_id, None)
        if request is None:
            raise ValueError(f"unknown request id {request_id!r}")
        now = self.clock()
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.remove(seq)
                self._finish(seq, FinishReason.ABORT, now)

    def has_unfinished_requests(self) -> bool:
        return any(not r.finished for r in self.requests.values())

    # ----------------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling decision and one forward; return the requests that got new tokens."""
        start = self.clock()
        out = self.scheduler.schedule(start)
        if self.proposer is not None:
            for seq in out.preempted:
                self.proposer.forget(seq.seq_id)
        if out.is_empty:
            return []
        self._propose(out)
        result = self.runner.execute(out.scheduled, out.block_copies)
        for item in out.scheduled:
            if not item.drafts:
                item.seq.num_computed_tokens += item.num_new_tokens
                self.blocks.mark_computed(item.seq.seq_id, item.seq.num_computed_tokens)
        touched = self._emit(result)
        self._observe(result)
        self._record_step(out, start)
        outputs = [build_output(self.requests[rid]) for rid in touched if rid in self.requests]
        for output in outputs:
            if output.finished:
                del self.requests[output.request_id]
        return outputs

    def _propose(self, out: SchedulerOutput) -> None:
        if self.proposer is None:
            return
        self.proposer.copy_blocks(out.block_copies)
        items = [d for d in out.decodes if d.lookahead > 0]
        if items:
            for item, (drafts, probs) in zip(items, self.proposer.propose([(d.seq, d.lookahead) for d in items]),
                                             strict=True):
                item.set_drafts(drafts, probs)

    def _emit(self, result: ForwardResult) -> list[str]:
        """Sample where a next token is due, verify where drafts wait; append and check stop conditions."""
        rows: list[int] = []
        seqs: list[Sequence] = []
        verifying: list[tuple[ScheduledSeq, int, int]] = []
        for item, _, logit_row, count in result.outputs:
            if item.drafts:
                verifying.append((item, logit_row, count))
                continue
            request = self.requests[item.seq.request_id]
            if item.seq is request.seqs[0] and request.pending_forks:
                for child in request.fork_children(self.blocks):
                    self.scheduler.admit_forked(child)
                    rows.append(logit_row)
                    seqs.append(child)
            rows.append(logit_row)
            seqs.append(item.seq)
        now = self.clock()
        if seqs:
            tokens = sample_batch(result.logits[rows], [s.params for s in seqs], [s.generator for s in seqs])
            for seq, token in zip(seqs, tokens, strict=True):
                self._append_token(seq, token, now)
        for item, logit_row, count in verifying:
            self._verify(item, result.logits[logit_row: logit_row + count], now)
        for item, *_ in result.outputs:
            if item.lookahead and not item.seq.is_finished:  # give back slots reserved for unused drafts
                self.blocks.truncate(item.seq.seq_id, item.seq.num_tokens)
        return list(dict.fromkeys([s.request_id for s in seqs] + [i.seq.request_id for i, _, _ in verifying]))

    def _verify(self, item: ScheduledSeq, logits: torch.Tensor, now: float) -> None:
        seq = item.seq
        if seq.params.greedy:
            accepted, emitted = verify_greedy(item.drafts, logits)
        else:
            accepted, emitted = verify_sampled(item.drafts, item.draft_probs, probabilities(logits, seq.params),
                                               seq.generator)
        item.accepted = accepted
        seq.spec.record(len(item.drafts), accepted, len(emitted))
        seq.num_computed_tokens += 1 + accepted  # the newest token and the accepted drafts now have valid KV
        for token in emitted:
            if self._append_token(seq, token, now):
                return
        self.blocks.mark_computed(seq.seq_id, seq.num_computed_tokens)

    def _observe(self, result: ForwardResult) -> None:
        """Tell the proposer which positions are real now (and, if it wants them, their target features)."""
        if self.proposer is None:
            return
        for item, row in result.rows:
            seq = item.seq
            if seq.is_finished:
                continue
            valid = 1 + item.accepted if item.drafts else item.num_new_tokens
            start = seq.num_computed_tokens - valid
            if self.proposer.needs_target_features:
                self.proposer.observe(seq, start, result.features[row: row + valid])
            self.proposer.rollback(seq, seq.num_computed_tokens)

    def _append_token(self, seq: Sequence, token: int, now: float) -> bool:
        """Append one generated token; finish the sequence if it hit a stop condition (returns True then)."""
        seq.output_ids.append(token)
        seq.token_times.append(now)
        self.blocks.append_tokens(seq.seq_id, [token])
        stopped_on_text = False
        if seq.detokenizer is not None:
            seq.detokenizer.push(token)
            stopped_on_text = seq.detokenizer.stopped_on is not None
        stop_ids = set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else self.eos_ids)
        if token in stop_ids or stopped_on_text:
            reason = FinishReason.STOP
        elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= seq.max_total_tokens:
            reason = FinishReason.LENGTH
        else:
            return False
        self.scheduler.remove(seq)
        self._finish(seq, reason, now)
        return True

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        seq.finish(reason, now)
        self.metrics.record_finished(seq)
        if self.proposer is not None:
            self.proposer.forget(seq.seq_id)

    def _record_step(self, out: SchedulerOutput, start: float) -> None:
        self.metrics.record_step(StepRecord(
            step=self._steps, start_time=start, duration_s=self.clock() - start,
            num_prefill_tokens=sum(s.num_new_tokens for s in out.prefills), num_decode_tokens=len(out.decodes),
            num_prefill_seqs=len(out.prefills), num_decode_seqs=len(out.decodes),
            num_waiting=len(self.scheduler.waiting), kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_free=self.blocks.num_free_blocks,
            prefix_hit_tokens=sum(s.num_cached_prompt_tokens for s in out.admitted),
            preemptions=len(out.preempted), num_drafted_tokens=sum(len(d.drafts) for d in out.decodes),
            num_accepted_tokens=sum(d.accepted for d in out.decodes)))
        self._steps += 1

    # ----------------------------------------------------------------------------------------------------
    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               **kwargs) -> Iterator[RequestOutput]:
        """Add a request and yield its output each time it grows (``new_text``/``new_token_ids`` hold the delta).

        Drives the engine itself, so other queued requests progress too. Leaving the loop early aborts it."""
        request_id = self.add_request(prompt, params, **kwargs)
        request = self.requests[request_id]
        try:
            while True:
                output = build_output(request, since_last_look=True)
                if any(o.new_token_ids for o in output.outputs) or output.finished:
                    yield output
                if output.finished:
                    return
                self.step()
        finally:
            if request_id in self.requests and not request.finished:
                self.abort(request_id)

    def generate(self, prompts: Seq[str | list[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                 *, progress: bool = True, chat: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion, batched; outputs in prompt order."""
        params_list = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(p, sp, chat=chat) for p, sp in zip(prompts, params_list, strict=True)]
        requests = {rid: self.requests[rid] for rid in ids}
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not progress) as bar:
            while not all(r.finished for r in requests.values()):
                if not self.step():
                    time.sleep(0.001)  # dynamic batching waiting for its timer
                bar.update(sum(r.finished for r in requests.values()) - bar.n)
        return [build_output(requests[rid]) for rid in ids]
