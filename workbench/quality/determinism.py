"""Temperature 0, the same prompt, different answers: measuring where and why greedy decoding diverges.

The engine's sampling is deterministic; its arithmetic is not invariant to the batch. The same prompt decoded
alone and decoded beside other traffic goes through matrix products and attention of other shapes, so its
logits differ in the last bits (`workbench.models.row_invariant` says which products, measured); where two
candidate tokens are that close, greedy decoding picks another one and the rest of the answer follows it.

``divergence_experiment`` decodes one prompt greedily many times on one engine while the traffic around it
varies (0 to ``max_others`` random requests, some queued before it, some joining mid-decode; prompts chunked
by a small token budget; the prompt's prefix read back from the cache after the first run) and compares every
run with a reference decoded alone on a fresh engine: the distinct completions, the first step whose token
differs, the first step whose logits differ at all, and how far apart they were there.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pandas as pd
import torch

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.model_runner import ForwardResult
from workbench.progress import ProgressFn, no_progress

# The prompt under study and the requests the cost comparison runs (chapter 10 and benchmarks/bench_determinism.py).
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
COST_PROMPTS = ("Explain what a KV cache is.", "Name three uses of a lighthouse.", "Write a haiku about rain.",
                "What is 17 times 23?", "Describe a sunrise over the sea.", "List four prime numbers.",
                "Why is the sky blue?", "Give a tip for learning to cook.")


@dataclass(frozen=True, slots=True)
class DecodeTrace:
    """One greedy decode of the prompt under study: its tokens and the logits row that chose each."""

    others: int
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]
    cached_prompt_tokens: int  # read from the prefix cache at its (last) admission
    preemptions: int


@dataclass(frozen=True, slots=True)
class DivergenceReport:
    batch_invariant: bool
    kv_cache_dtype: str
    reference: DecodeTrace
    runs: pd.DataFrame  # one row per run: others, first_token_divergence, first_logit_difference, max_logit_gap

    @property
    def distinct_completions(self) -> int:
        return int(self.runs["completion"].nunique())

    @property
    def runs_diverged(self) -> int:
        return int(self.runs["first_token_divergence"].notna().sum())

    @property
    def runs_with_other_logits(self) -> int:
        return int(self.runs["first_logit_difference"].notna().sum())


def engine_for(model, tokenizer, *, batch_invariant: bool, kv_cache_dtype: str, chunk_tokens: int,
            num_blocks: int | None) -> LLMEngine:
    return LLMEngine(model, tokenizer, batch_invariant=batch_invariant,
                     cache_config=CacheConfig(kv_cache_dtype=kv_cache_dtype, num_blocks=num_blocks),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=chunk_tokens, max_num_seqs=16))


def decode_with_traffic(engine: LLMEngine, prompt_ids: list[int], max_tokens: int, others: int,
                        rng: random.Random, *, joining_later: float = 0.5) -> DecodeTrace:
    """Greedy-decode ``prompt_ids`` while ``others`` random requests share the engine (a share ``joining_later``
    joins at random steps of the decode, the rest is queued first); the others are aborted once the prompt under
    study ends."""
    vocab = engine.model.spec.vocab_size
    joins = sorted((0 if rng.random() >= joining_later else rng.randint(1, max(1, max_tokens - 1)),
                    [rng.randrange(vocab) for _ in range(rng.randint(4, 48))], rng.randint(1, 2 * max_tokens))
                   for _ in range(others))
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows: list[torch.Tensor] = []
    added = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), chat=False)
             for step, p, n in joins if step == 0]
    target = engine.add_request(prompt_ids, greedy, chat=False)
    request = engine.requests[target]
    seq_id = request.seqs[0].seq_id

    def observe(result: ForwardResult) -> None:
        for item in result.items:
            if item.item.seq.seq_id == seq_id and item.num_logit_rows:
                rows.append(result.logits[item.first_logit_row + item.num_logit_rows - 1].clone())

    engine.runner.observers.append(observe)
    try:
        step = 0
        while not request.finished:
            added += [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                                         chat=False) for s, p, n in joins if s == step and s > 0]
            engine.step()
            step += 1
    finally:
        engine.runner.observers.remove(observe)
        for rid in added:
            if rid in engine.requests:
                engine.abort(rid)
    seq = request.seqs[0]
    return DecodeTrace(others, tuple(seq.output_ids), tuple(rows), seq.num_cached_prompt_tokens, seq.num_preemptions)


def _first(flags: list[bool]) -> int | None:
    return next((i for i, flag in enumerate(flags) if flag), None)


def compare(reference: DecodeTrace, run: DecodeTrace) -> dict[str, object]:
    """Where ``run`` first differs from ``reference``: token step, logits step, and the largest logit gap."""
    steps = min(len(reference.logits), len(run.logits))
    gaps = [float((reference.logits[i] - run.logits[i]).abs().max()) for i in range(steps)]
    token_step = _first([a != b for a, b in zip(reference.tokens, run.tokens, strict=False)])
    logit_step = _first([gap > 0 for gap in gaps])
    before = gaps[: token_step if token_step is not None else steps]  # after a new token, logits differ by design
    return {"others": run.others, "cached_prompt_tokens": run.cached_prompt_tokens, "preemptions": run.preemptions,
            "completion": run.tokens, "first_token_divergence": token_step,
            "first_logit_difference": logit_step, "max_logit_gap": max(before, default=0.0)}


CONTROL_RUNS = 2


def divergence_experiment(model, tokenizer, prompt_ids: list[int], *, runs: int = 20, max_tokens: int = 16,
                          max_others: int = 15, kv_cache_dtype: str = "auto", batch_invariant: bool = False,
                          chunk_tokens: int = 64, num_blocks: int | None = None, seed: int = 0,
                          progress: ProgressFn = no_progress) -> DivergenceReport:
    """The same greedy request ``runs`` times among varying traffic, against a reference decoded alone.
    ``chunk_tokens``: the step's token budget (prompts longer than what is left are chunked); ``num_blocks``: a
    small KV pool makes the scheduler preempt and recompute requests."""
    if runs < 1 or max_tokens < 1 or max_others < 0:
        raise ValueError(f"runs and max_tokens must be >= 1 and max_others >= 0, got {runs}, {max_tokens}, "
                         f"{max_others}")
    settings = {"batch_invariant": batch_invariant, "kv_cache_dtype": kv_cache_dtype, "chunk_tokens": chunk_tokens,
                "num_blocks": num_blocks}
    rng = random.Random(seed)
    reference = decode_with_traffic(engine_for(model, tokenizer, **settings), prompt_ids, max_tokens, 0, rng)
    engine = engine_for(model, tokenizer, **settings)
    rows = []
    for i in range(runs):
        progress(i, runs, f"run {i + 1} of {runs}")
        # Runs 0 and 1 decode alone: 0 from an empty cache, 1 reading its prefix from the cache (the control that
        # tells a cache hit's effect from the traffic's); every later run shares its steps with 1-max_others others.
        others = 0 if i < CONTROL_RUNS else rng.randint(1, max_others) if max_others else 0
        rows.append(compare(reference, decode_with_traffic(engine, prompt_ids, max_tokens, others, rng)))
    progress(runs, runs, "done")
    return DivergenceReport(batch_invariant, kv_cache_dtype, reference, pd.DataFrame(rows))


def summary(report: DivergenceReport) -> dict[str, object]:
    """The report in numbers (what a benchmark line or a cached result keeps)."""
    diverged = report.runs["first_token_divergence"].dropna()
    return {"kv_cache_dtype": report.kv_cache_dtype, "batch_invariant": report.batch_invariant,
            "runs": len(report.runs), "distinct_completions": report.distinct_completions,
            "runs_diverged": report.runs_diverged, "runs_with_other_logits": report.runs_with_other_logits,
            "earliest_divergence": None if diverged.empty else int(diverged.min()),
            "max_logit_gap": float(report.runs["max_logit_gap"].max())}


def mode_cost(model, tokenizer, prompts: list[list[int]], *, max_tokens: int = 32, repeats: int = 3,
              num_blocks: int | None = None, progress: ProgressFn = no_progress) -> pd.DataFrame:
    """Output tokens per second of the same batch with the mode off and on, alternating (off, on, off, on, ...)
    so that both see the same machine; the first pass of each is a warm-up and is not kept. ``num_blocks``: each
    engine's KV pool (on a GPU the default takes most of the device, and the two engines live side by side)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engines = {mode: LLMEngine(model, tokenizer, batch_invariant=mode, cache_config=CacheConfig(num_blocks=num_blocks))
               for mode in (False, True)}
    rows, total = [], 2 * (repeats + 1)
    for r in range(repeats + 1):
        for mode, engine in engines.items():
            progress(len(rows) if r else 0, total, f"batch-invariant {'on' if mode else 'off'}, pass {r + 1}")
            start = time.perf_counter()
            outputs = engine.generate(prompts, params, progress=False, chat=False)
            seconds = time.perf_counter() - start
            if r:
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                rows.append({"batch_invariant": mode, "pass": r, "tokens": tokens, "seconds": seconds,
                             "tokens_per_s": tokens / seconds})
    progress(total, total, "done")
    return pd.DataFrame(rows)
