"""Chapter 2's measurements, each one run of the real engine: no cache vs cache, paged memory over a mixed
workload (with a snapshot of every block table at every step), prefix-cache TTFT, and hit rate against a
cache budget. Plain torch/pandas on top of `workbench.generation` and `workbench.engine`: no widgets, so the
same runs serve the notebook panels, the tests and anyone scripting them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.generation import generate
from workbench.prompts import encode_prompt
from workbench.workloads import NAMES, WorkloadRequest, questions, static_instructions

ProgressFn = Callable[[int, int, str], None]

def _progress(progress: ProgressFn | None, done: int, total: int, text: str) -> None:
    if progress is not None:
        progress(done, total, text)


# ----------------------------------------------------------------------------------------------- no cache
@dataclass
class CacheComparison:
    steps: pd.DataFrame  # mode, token_index, context_tokens, step_ms
    summary: pd.DataFrame  # per mode: prompt tokens, TTFT, decode tokens/s
    same_tokens: bool


def cache_vs_no_cache(model, tokenizer, *, context_tokens: int = 48, max_tokens: int = 32,
                      progress: ProgressFn | None = None) -> CacheComparison:
    """Generate the same greedy tokens with and without the KV cache, timing every step."""
    prompt = encode_prompt(tokenizer, static_instructions(tokenizer, context_tokens) + " Summarise the rules.")
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    # Warm up both modes alike at the real prompt length (first calls at a new shape allocate and pick kernels),
    # so the two prefills, which are the same work, also time the same.
    for use_cache in (True, False):
        generate(model, tokenizer, prompt, SamplingParams(max_tokens=2), use_cache=use_cache)
    rows, summary, tokens = [], [], {}
    for done, use_cache in enumerate((True, False)):
        mode = "with KV cache" if use_cache else "without cache (recompute)"
        _progress(progress, done, 2, f"generating {max_tokens} tokens {mode}")
        result = generate(model, tokenizer, prompt, params, use_cache=use_cache)
        tokens[use_cache] = result.token_ids
        times = [0.0, *result.token_times_s]
        for i in range(len(result.token_ids)):
            rows.append({"mode": mode, "token_index": i, "context_tokens": len(prompt) + i,
                         "step_ms": (times[i + 1] - times[i]) * 1e3})
        summary.append({"mode": mode, "prompt_tokens": len(prompt), "new_tokens": len(result.token_ids),
                        "ttft_ms": result.ttft_s * 1e3, "decode_tokens_per_s": result.decode_tokens_per_s,
                        "total_s": result.total_s})
    _progress(progress, 2, 2, "done")
    return CacheComparison(pd.DataFrame(rows), pd.DataFrame(summary).set_index("mode"), tokens[True] == tokens[False])


# ------------------------------------------------------------------------------------------------- paged
@dataclass
class PagedTrace:
    """One engine run over a workload, with what the paged cache held at every step."""

    block_size: int
    num_blocks: int
    bytes_per_token: int
    timeline: pd.DataFrame  # per step: running, waiting, finished, used_tokens, held_blocks, held/used bytes
    tables: list[dict[str, list[int]]] = field(default_factory=list)  # per step: request id -> block table
    tokens: list[dict[str, int]] = field(default_factory=list)  # per step: request id -> tokens in the cache
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)  # per request: prompt and output tokens


def trace_paged_run(model, tokenizer, workload: list[WorkloadRequest], *, block_size: int = 16,
                    pool_tokens: int = 2048, max_num_seqs: int = 4,
                    progress: ProgressFn | None = None) -> PagedTrace:
    """Run ``workload`` (all arriving at once, at most ``max_num_seqs`` running) on a paged cache of
    ``pool_tokens`` tokens, snapshotting every running request's block table after each step."""
    num_blocks = max(1, pool_tokens // block_size)
    engine = LLMEngine(model, tokenizer,
                       cache_config=CacheConfig(block_size=block_size, num_blocks=num_blocks,
                                                enable_prefix_caching=False),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=max(512, max_num_seqs),
                                                        max_num_seqs=max_num_seqs))
    for i, request in enumerate(workload):
        engine.add_request(request.prompt, request.sampling_params(), request_id=f"r{i}")
    per_token = engine.cache.bytes_per_block // block_size
    rows, tables, tokens, step = [], [], [], 0
    while engine.has_unfinished_requests():
        engine.step()
        running = list(engine.scheduler.running)
        tables.append({s.request_id: engine.blocks.block_table(s.seq_id) for s in running})
        tokens.append({s.request_id: s.num_computed_tokens for s in running})
        used = sum(s.num_computed_tokens for s in running)
        held = engine.blocks.num_used_blocks
        rows.append({"step": step, "running": len(running), "waiting": len(engine.scheduler.waiting),
                     "finished": len(engine.metrics.finished), "used_tokens": used, "held_blocks": held,
                     "used_bytes": used * per_token, "held_bytes": held * engine.cache.bytes_per_block})
        step += 1
        _progress(progress, len(engine.metrics.finished), len(workload), f"step {step}")
    requests = engine.metrics.request_frame()[["request_id", "prompt_tokens", "output_tokens"]]
    requests = requests.sort_values("request_id", key=lambda ids: ids.str[1:].astype(int)).reset_index(drop=True)
    return PagedTrace(block_size, num_blocks, per_token, pd.DataFrame(rows), tables, tokens, requests)


# ------------------------------------------------------------------------------------------- prefix cache
LAYOUTS = ("static first", "dynamic first")


def prefix_prompts(tokenizer, num_requests: int, static_tokens: int, layout: str) -> list[list[int]]:
    """Chat prompts sharing standing instructions; each also carries its own header and question.

    ``static first`` puts the shared instructions at the very start of the system prompt; ``dynamic first``
    puts the per-request header (customer, ticket number) before them, so no two prompts share a prefix."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    static = static_instructions(tokenizer, static_tokens)
    prompts = []
    for i, question in enumerate(questions(num_requests, seed=3)):
        header = f"Customer {NAMES[i % len(NAMES)]}, ticket #{4100 + 7 * i}."
        system = f"{static}\n{header}" if layout == "static first" else f"{header}\n{static}"
        prompts.append(encode_prompt(tokenizer, question, system=system))
    return prompts


def _sequential_ttft(engine: LLMEngine, prompts: list[list[int]], progress: ProgressFn | None) -> pd.DataFrame:
    rows = []
    for i, ids in enumerate(prompts):
        _progress(progress, i, len(prompts), f"request {i + 1} of {len(prompts)}")
        engine.generate([ids], SamplingParams(max_tokens=1), progress=False)
        row = engine.metrics.request_frame().iloc[-1]
        rows.append({"request": i, "prompt_tokens": int(row["prompt_tokens"]),
                     "cached_tokens": int(row["cached_prompt_tokens"]), "ttft_ms": float(row["ttft_s"]) * 1e3})
    _progress(progress, len(prompts), len(prompts), "done")
    frame = pd.DataFrame(rows)
    frame["hit"] = frame["cached_tokens"] > 0
    return frame


def prefix_cache_run(model, tokenizer, *, static_tokens: int = 500, layout: str = "static first",
                     caching: bool = True, num_requests: int = 6, block_size: int = 16,
                     progress: ProgressFn | None = None) -> tuple[pd.DataFrame, float]:
    """TTFT of requests sent one at a time (so TTFT is prefill, not queueing), and the token hit rate."""
    prompts = prefix_prompts(tokenizer, num_requests, static_tokens, layout)
    longest = max(map(len, prompts))
    engine = LLMEngine(model, tokenizer,
                       cache_config=CacheConfig(block_size=block_size, num_blocks=4 * longest // block_size + 8,
                                                enable_prefix_caching=caching),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=max(512, longest), max_num_seqs=4))
    # Warm-up on an unrelated prompt of the same length (first forwards allocate), then forget it.
    engine.generate([prompts[0][::-1]], SamplingParams(max_tokens=1), progress=False)
    engine.blocks.clear_prefix_cache()
    engine.blocks.reset_stats()
    frame = _sequential_ttft(engine, prompts, progress)
    return frame, engine.blocks.stats.hit_rate


# ---------------------------------------------------------------------------------------------- eviction
PATTERNS = ("round robin", "skewed (Zipf)", "shifting hot set")
ZIPF_S = 1.2


def access_order(num_prefixes: int, num_requests: int, pattern: str, seed: int = 0) -> list[int]:
    """Which shared prefix each request uses: cycling through all; a few hot ones (Zipf, s = 1.2); or Zipf whose
    ranking reverses halfway, so the prefixes that were hot go cold (a new system prompt ships, say)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if pattern == "round robin":
        return [i % num_prefixes for i in range(num_requests)]
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(num_prefixes)]
    order = rng.choices(range(num_prefixes), weights=weights, k=num_requests)
    if pattern == "shifting hot set":
        half = num_requests // 2
        order[half:] = [num_prefixes - 1 - k for k in order[half:]]
    return order


def eviction_prompts(num_prefixes: int, num_requests: int, pattern: str, *, prefix_tokens: int = 64,
                     block_size: int = 16) -> list[list[int]]:
    """The request stream of the eviction sweep: each prompt is one of ``num_prefixes`` shared prefixes of
    ``prefix_tokens`` token ids followed by half a block of its own."""
    rng = random.Random(7)
    prefixes = [[rng.randrange(100, 30000) for _ in range(prefix_tokens)] for _ in range(num_prefixes)]
    order = access_order(num_prefixes, num_requests, pattern)
    return [prefixes[k] + [rng.randrange(100, 30000) for _ in range(block_size // 2)] for k in order]


def eviction_sweep(model, tokenizer, budgets: list[int], *, num_prefixes: int = 4, pattern: str = "round robin",
                   num_requests: int = 16, prefix_tokens: int = 64, block_size: int = 16,
                   progress: ProgressFn | None = None) -> pd.DataFrame:
    """Prefix-cache hit rate for the same request stream under different cache budgets (in blocks).

    Each request is one of ``num_prefixes`` shared prefixes followed by its own few tokens; they run one at a
    time, so the only thing that differs between budgets is what the LRU cache had to evict."""
    prompts = eviction_prompts(num_prefixes, num_requests, pattern, prefix_tokens=prefix_tokens,
                               block_size=block_size)
    smallest = -(-(len(prompts[0]) + 1) // block_size)
    if min(budgets) < smallest:
        raise ValueError(f"every budget must hold one request ({smallest} blocks of {block_size}), got {min(budgets)}")
    rows = []
    for done, budget in enumerate(budgets):
        _progress(progress, done, len(budgets), f"budget {budget} blocks")
        engine = LLMEngine(model, tokenizer,
                           cache_config=CacheConfig(block_size=block_size, num_blocks=budget),
                           scheduler_config=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=1))
        frame = _sequential_ttft(engine, prompts, None)
        stats = engine.blocks.stats
        rows.append({"budget_blocks": budget, "budget_tokens": budget * block_size, "hit_rate": stats.hit_rate,
                     "requests_hit": int(frame["hit"].sum()), "evicted_blocks": stats.evicted_blocks,
                     "mean_ttft_ms": frame["ttft_ms"].mean()})
    _progress(progress, len(budgets), len(budgets), "done")
    frame = pd.DataFrame(rows)
    frame.attrs["working_set_blocks"] = num_prefixes * (prefix_tokens // block_size)
    return frame
