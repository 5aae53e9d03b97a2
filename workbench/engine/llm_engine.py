"""The engine: requests in, tokens out, one batched forward per step.

    engine = LLMEngine.from_pretrained("smollm2-135m")
    outputs = engine.generate(["Hello!", "What is a KV cache?"], SamplingParams(max_tokens=32))

    for delta in engine.stream("Tell me a story.", SamplingParams(max_tokens=64)):
        print(delta.outputs[0].new_text, end="")

A step: the scheduler picks sequences and token counts (decodes first, then prefill chunks), the proposer (if
speculating) drafts, the runner runs one forward over the mixed batch on the paged cache, and the bookkeeper
(`workbench.engine.bookkeeping`) turns the logits into tokens and every state change that follows: computed
KV, appended tokens, stop checks, freed blocks, the metrics' timelines. The engine wires these parts together
and answers requests; it writes no sequence state itself.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from workbench.cache.block_manager import BlockManager
from workbench.cache.calibration import calibration_ids, fp8_scales
from workbench.cache.hybrid_block_manager import HybridBlockManager
from workbench.cache.kv_groups import KVGroupLayout, grouped
from workbench.cache.paged import PagedKVCache
from workbench.cache.sizing import kv_format_for, num_blocks_for
from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.manager import TieredBlockManager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.engine.bookkeeping import Bookkeeper
from workbench.engine.cuda_graphs import DecodeGraphs
from workbench.engine.kv_offload import build_tier, calibrate
from workbench.engine.model_runner import ForwardItem, ModelRunner
from workbench.engine.outputs import RequestOutput
from workbench.engine.requests import Request, RequestLimits, build_output, new_request
from workbench.engine.scheduler import Scheduler, SchedulerOutput
from workbench.engine.sequence import FinishReason
from workbench.intmath import ceil_div
from workbench.metrics.recorder import MetricsRecorder, StepRecord
from workbench.metrics.step_ranges import step_range
from workbench.models.llama import LlamaModel
from workbench.prompts import eos_token_ids
from workbench.spec.drafts import Drafts
from workbench.spec.proposer import Proposer, build_proposer
from workbench.spec.tree_draft import TreeShape


class LLMEngine:
    def __init__(self, model: LlamaModel, tokenizer=None, *, cache_config: CacheConfig | None = None,
                 scheduler_config: SchedulerConfig | None = None, spec_config: SpecConfig | None = None,
                 draft_model=None, cuda_graphs: bool = True, batch_invariant: bool = False,
                 kv_offload: KVOffloadConfig | None = None):
        """``cuda_graphs``: on a CUDA model, replay captured graphs for pure decode steps
        (`workbench.engine.cuda_graphs`); False launches every kernel eagerly. Ignored on the CPU.
        ``batch_invariant``: a request's logits are bit-identical whatever else shares its batch, however its
        prompt is chunked and whether its prefix comes from the cache (`workbench.models.row_invariant`); slower,
        and it runs every step eagerly. ``kv_offload``: a second KV tier under the prefix cache, in host memory or
        on disk (`workbench.cache.tier`): evicted blocks spill to it, and prefixes it holds are restored instead of
        recomputed when the rule measured at start-up says restoring is cheaper."""
        self.model, self.tokenizer = model, tokenizer
        self.cache_config = cache_config or CacheConfig()
        self.scheduler_config = scheduler_config or SchedulerConfig()
        kv_format = kv_format_for(self.cache_config, model.dtype)
        # Per-layer windows (layer_types): KV groups with their own block tables in one pool (kv_groups).
        layout = KVGroupLayout.of(model.spec) if grouped(model.spec) else None
        if layout is not None:
            _check_grouped(kv_format, spec_config, batch_invariant)
        num_blocks = num_blocks_for(model, self.cache_config, self.scheduler_config.max_num_batched_tokens,
                                    layout=layout)
        self.cache = PagedKVCache(model.spec, num_blocks, self.cache_config.block_size, dtype=model.dtype,
                                  device=model.device, kv_format=kv_format, layout=layout)
        if kv_format == "fp8_e4m3":
            self.cache.set_static_scales(*fp8_scales(model, calibration_ids(model, tokenizer)))
        caching = self.cache_config.enable_prefix_caching
        self.kv_offload = None if kv_offload is None else build_tier(
            kv_offload, model, self.cache, grouped=layout is not None, spec_config=spec_config, prefix_caching=caching)
        self.blocks = (TieredBlockManager(num_blocks, self.cache_config.block_size, self.kv_offload)
                       if self.kv_offload is not None else
                       BlockManager(num_blocks, self.cache_config.block_size, enable_prefix_caching=caching)
                       if layout is None else
                       HybridBlockManager(num_blocks, self.cache_config.block_size, layout,
                                          enable_prefix_caching=caching, max_chunk=self.scheduler_config.chunk_limit))
        self.spec_config = spec_config
        self.proposer: Proposer | None = None
        self.tree_shape = _tree_shape(spec_config)
        if self.tree_shape is not None and batch_invariant:
            raise ValueError("the batch-invariant mode attends without a tree mask: use a chain (no tree_branching "
                             "or tree_budget) or turn batch_invariant off")
        if spec_config is not None:
            self.proposer = build_proposer(spec_config, target=model, blocks=self.blocks, draft_model=draft_model)
        self.scheduler = Scheduler(self.scheduler_config, self.blocks)
        taps = self.proposer.taps if self.proposer else ()
        graphs = None
        self.batch_invariant = batch_invariant
        if cuda_graphs and model.device.type == "cuda" and not batch_invariant and layout is None:
            width = min(num_blocks, ceil_div(model.spec.max_context, self.cache_config.block_size))
            graphs = DecodeGraphs(model, self.cache, max_num_seqs=self.scheduler_config.max_num_seqs,
                                  max_blocks_per_seq=width, taps=taps)
        self.runner = ModelRunner(model, self.cache, self.blocks, taps=taps, graphs=graphs,
                                  batch_invariant=batch_invariant)
        self.metrics = MetricsRecorder()
        self.eos_ids = eos_token_ids(tokenizer) if tokenizer is not None else set()
        self.bookkeeper = Bookkeeper(self.scheduler, self.blocks, self.metrics, self.eos_ids, self.proposer,
                                     move_kv=self.runner.move_slots)
        self.limits = RequestLimits.of(model.spec, self.cache_config, self.scheduler_config, num_blocks,
                                       spec_depth=spec_config.depth if spec_config else 0)
        if layout is not None:  # windows are masked here: the whole position range, each group's real demand
            chunk, size = self.scheduler_config.chunk_limit, self.cache_config.block_size
            self.limits = replace(self.limits, max_context=model.spec.max_position_embeddings,
                                  blocks_for=lambda tokens: layout.blocks_needed(tokens, size, chunk))
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        self._steps = 0
        self.clock = time.perf_counter
        if self.kv_offload is not None:
            calibrate(self)  # the restore rule's costs, measured on this engine (workbench.engine.kv_offload)

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

        ``num_speculative_tokens`` overrides the engine's K for this request (0: no speculation; with a token tree,
        the most levels it may draft; a request with penalties, min_tokens or logprobs is never drafted:
        ``SamplingParams.one_token_per_step``). ``priority`` (lower first) matters only with
        ``SchedulerConfig(scheduling_policy="priority")``. ``arrival_time`` (default: now) is when the request
        arrived, e.g. at a server in front of the engine: TTFT and latency count from it, queue time from now."""
        request_id = request_id if request_id is not None else f"req-{next(self._request_ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        now = self.clock()
        request = new_request(
            request_id, prompt, SamplingParams() if params is None else params, tokenizer=self.tokenizer,
            limits=self.limits, seq_ids=self._seq_ids, chat=chat, num_speculative_tokens=num_speculative_tokens,
            priority=priority, arrival_time=now if arrival_time is None else arrival_time, queued_time=now,
            device=self.model.device, tree_slots=self._tree_slots())
        self.scheduler.add(request.seqs[0], siblings=request.seqs[1:])
        self.requests[request_id] = request
        return request_id

    def _tree_slots(self) -> int:
        """Slots a tree pass takes beyond the newest token: its nodes (and the draft's scratch), 0 for chains."""
        shape = self.tree_shape
        if shape is None:
            return 0
        return shape.budget if self.spec_config.method == "ngram" else shape.num_slots

    def abort(self, request_id: str) -> None:
        """Stop a request now; its blocks are freed at once."""
        request = self.requests.pop(request_id, None)
        if request is None:
            raise ValueError(f"unknown request id {request_id!r}")
        now = self.clock()
        for seq in request.seqs:
            if not seq.is_finished:
                self.bookkeeper.finish(seq, FinishReason.ABORT, now)

    def has_unfinished_requests(self) -> bool:
        return any(not r.finished for r in self.requests.values())

    def close(self) -> None:
        """A clean shutdown: a write-back tier writes every cached block it lacks (a server calls this as it stops;
        without a tier, nothing to do). The engine stays usable."""
        if self.kv_offload is not None:
            self.kv_offload.flush(self.blocks)

    # ----------------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling decision and one forward; return the requests that got new tokens."""
        start = self.clock()
        with step_range("schedule"):
            out = self.scheduler.schedule(start)
            if self.proposer is not None:
                for seq in out.preempted:
                    self.proposer.forget(seq.seq_id)
        if self.kv_offload is not None:
            with step_range("prepare"):  # spills out, then restores in, before the forward reads the blocks
                self.kv_offload.move(self.blocks)
        if out.is_empty:
            return []
        with step_range("draft"):
            drafts = self._draft(out)
        items = [ForwardItem(s, drafts.get(s.seq.seq_id)) for s in out.scheduled]
        result = self.runner.execute(items, out.block_copies)  # the "prepare" and "forward" ranges
        with step_range("postprocess"):  # the "sample" and "verify" ranges nest inside
            committed = self.bookkeeper.commit(result, self.clock())
            if self.kv_offload is not None:  # write-through: the blocks this forward completed
                self.kv_offload.move(self.blocks)
            steps = 1 if result.step_tokens is None else result.step_tokens.shape[0]
            self._record_step(out, start, sum(len(i.draft_tokens) for i in items), committed.num_accepted, steps)
            outputs = [build_output(self.requests[rid]) for rid in committed.touched if rid in self.requests]
            for output in outputs:
                if output.finished:
                    del self.requests[output.request_id]
        return outputs

    def _draft(self, out: SchedulerOutput) -> dict[int, Drafts]:
        """Let the proposer draft for every decode that reserved lookahead slots: seq_id -> its drafts."""
        if self.proposer is None:
            return {}
        self.proposer.copy_blocks(out.block_copies)
        items = [d for d in out.decodes if d.lookahead > 0 and not d.multi_step]
        if not items:
            return {}
        if self.tree_shape is not None:
            trees = self.proposer.propose_tree([(d.seq, d.lookahead, d.seq.draft_depth) for d in items],
                                               self.tree_shape)
            drafts = [Drafts.of_tree(tree, d.seq.token_ids[-1], d.lookahead) for d, tree in zip(items, trees,
                                                                                                strict=True)]
        else:
            proposals = self.proposer.propose([(d.seq, d.lookahead) for d in items])
            drafts = [Drafts.chain(tokens, probs, d.lookahead) for d, (tokens, probs) in zip(items, proposals,
                                                                                            strict=True)]
        return {d.seq.seq_id: x for d, x in zip(items, drafts, strict=True) if x is not None}

    def _record_step(self, out: SchedulerOutput, start: float, num_drafted: int, num_accepted: int,
                     steps: int = 1) -> None:
        """One record per engine step; a multi-step decode's ``steps`` forwards count their tokens together."""
        self.metrics.record_step(StepRecord(
            step=self._steps, start_time=start, duration_s=self.clock() - start,
            num_prefill_tokens=sum(s.num_new_tokens for s in out.prefills),
            num_decode_tokens=steps * len(out.decodes),
            num_prefill_seqs=len(out.prefills), num_decode_seqs=len(out.decodes),
            num_waiting=len(self.scheduler.waiting), kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_free=self.blocks.num_free_blocks,
            prefix_hit_tokens=sum(s.num_cached_prompt_tokens for s in out.admitted),
            preemptions=len(out.preempted), num_drafted_tokens=num_drafted,
            num_accepted_tokens=num_accepted))
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


def _check_grouped(kv_format: str, spec_config: SpecConfig | None, batch_invariant: bool) -> None:
    """What the KV-group path (sliding-window layers) does not combine with, each refused with the reason."""
    if kv_format == "fp8_e4m3":
        raise ValueError("kv_cache_dtype 'fp8_e4m3' keeps one static scale per layer, and layers of different KV "
                         "groups share cache tensors here: use 'auto', 'int8' or 'int4' with sliding-window layers")
    if spec_config is not None:
        raise ValueError("speculative decoding drafts over the target's block tables, which a sliding-window "
                         "group punches holes in: run models with layer_types without a spec_config")
    if batch_invariant:
        raise ValueError("the batch-invariant attention has no window: run models with layer_types without "
                         "batch_invariant")


def _tree_shape(config: SpecConfig | None) -> TreeShape | None:
    """The token tree a config asks for, None for chains."""
    if config is None or not config.is_tree:
        return None
    if config.tree_branching:
        return TreeShape(branching=config.tree_branching)
    return TreeShape(budget=config.tree_budget, top_k=config.tree_top_k, depth=config.num_speculative_tokens)
