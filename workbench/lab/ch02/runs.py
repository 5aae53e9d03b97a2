"""Chapter 2's measurements, each one run of the real engine, and the result objects the panels, the prose and
the closing table read: no cache vs cache (``CacheComparison``), paged memory over a mixed workload with a
snapshot of every block table at every step (``PagedTrace``), and prefix-cache TTFT (``PrefixRun``). Plain
torch/pandas on top of `workbench.generation` and `workbench.engine`: no widgets, so the same runs serve the
notebook panels, the tests and anyone scripting them. The eviction sweep is in `workbench.lab.ch02.eviction`,
the copy-on-write fork in `workbench.lab.ch02.fork`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from workbench.cache.memory_compare import compare_reservations
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.generation import generate
from workbench.lab.kit.baseline import Baseline
from workbench.prompts import encode_prompt
from workbench.timing import describe_machine
from workbench.workloads import NAMES, WorkloadRequest, questions, static_instructions

ProgressFn = Callable[[int, int, str], None]


def _progress(progress: ProgressFn | None, done: int, total: int, text: str) -> None:
    if progress is not None:
        progress(done, total, text)


# ----------------------------------------------------------------------------------------------- no cache
WITH_CACHE, WITHOUT_CACHE = "with KV cache", "without cache (recompute)"


@dataclass
class CacheComparison:
    steps: pd.DataFrame  # mode, token_index, context_tokens, step_ms
    summary: pd.DataFrame  # per mode (WITH_CACHE, WITHOUT_CACHE): prompt tokens, TTFT, decode tokens/s
    same_tokens: bool

    @property
    def cached_tokens_per_s(self) -> float:
        return float(self.summary.loc[WITH_CACHE, "decode_tokens_per_s"])

    @property
    def recompute_tokens_per_s(self) -> float:
        return float(self.summary.loc[WITHOUT_CACHE, "decode_tokens_per_s"])

    @property
    def speedup(self) -> float:
        """Decode tokens/s with the cache over tokens/s recomputing everything."""
        return self.cached_tokens_per_s / self.recompute_tokens_per_s

    @property
    def prompt_tokens(self) -> int:
        return int(self.summary["prompt_tokens"].iloc[0])

    def ttft_ms(self, mode: str) -> float:
        return float(self.summary.loc[mode, "ttft_ms"])

    def decode_steps_ms(self, mode: str) -> list[float]:
        """Every decode step's time in ``mode`` (the first token, the prefill, left out)."""
        rows = self.steps[(self.steps["mode"] == mode) & (self.steps["token_index"] > 0)]
        return rows["step_ms"].tolist()


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
        mode = WITH_CACHE if use_cache else WITHOUT_CACHE
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

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of every finished request, in request order."""
        return [(int(p), int(o)) for p, o in zip(self.requests["prompt_tokens"], self.requests["output_tokens"],
                                                 strict=True)]

    def totals(self, max_len: int, block_size: int | None = None) -> dict[str, float]:
        """Paged against contiguous reservations for the finished requests' final lengths
        (`workbench.cache.memory_compare`); ``max_len`` is raised to the longest request if below it."""
        longest = max(p + o for p, o in self.lengths)
        return compare_reservations(self.lengths, bytes_per_token=self.bytes_per_token, max_len=max(max_len, longest),
                                    block_size=block_size or self.block_size).attrs["totals"]

    def contiguous_bytes(self, max_len: int) -> pd.Series:
        """Per step: what max-length contiguous buffers for the running requests would reserve."""
        return self.timeline["running"] * max_len * self.bytes_per_token

    def saving(self, max_len: int) -> float:
        """Share of the contiguous reservation, summed over the run, that the paged blocks did not hold."""
        return float(1 - self.timeline["held_bytes"].sum() / self.contiguous_bytes(max_len).sum())


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


def _median(values: pd.Series) -> float:
    return float(statistics.median(values)) if len(values) else float("nan")


@dataclass
class PrefixRun:
    """One configuration of the prefix-cache experiment: requests sent one at a time, TTFT of each."""

    static_tokens: int
    layout: str
    caching: bool
    frame: pd.DataFrame  # per request: prompt_tokens, cached_tokens, ttft_ms, hit
    hit_rate: float  # the engine's token hit rate over all requests

    @property
    def config(self) -> str:
        return f"{self.static_tokens} tok, {self.layout}, cache {'on' if self.caching else 'off'}"

    @property
    def first_ms(self) -> float:
        """TTFT of the first request, which finds the cache empty."""
        return float(self.frame["ttft_ms"].iloc[0])

    @property
    def later_median_ms(self) -> float:
        """Median TTFT of the requests after the first (hits, where the cache can serve them)."""
        return _median(self.frame["ttft_ms"].iloc[1:])

    @property
    def hits(self) -> int:
        return int(self.frame["hit"].sum())

    @property
    def miss_ms(self) -> float:
        return _median(self.frame.loc[~self.frame["hit"], "ttft_ms"])

    @property
    def hit_ms(self) -> float:
        """Median TTFT of the requests that hit the cache; NaN when none did (check ``hits`` first)."""
        return _median(self.frame.loc[self.frame["hit"], "ttft_ms"])

    @property
    def warm_hit_rate(self) -> float:
        """Token hit rate over the requests after the first, cold one (which has nothing to hit)."""
        warm = self.frame.iloc[1:]
        return float(warm["cached_tokens"].sum() / warm["prompt_tokens"].sum())


def prefix_cache_run(model, tokenizer, *, static_tokens: int = 500, layout: str = "static first",
                     caching: bool = True, num_requests: int = 6, block_size: int = 16,
                     progress: ProgressFn | None = None) -> PrefixRun:
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
    return PrefixRun(static_tokens, layout, caching, frame, engine.blocks.stats.hit_rate)


def chapter_baseline(cache: CacheComparison, history: list[PrefixRun], model) -> Baseline:
    """The figures this chapter timed, for the cross-chapter registry: the cached decode step (section 3), the
    cache-off miss per prompt token and a hit's cost per new token (section 7)."""
    runs = {(r.layout, r.caching): r for r in history}
    off, hit = runs.get(("static first", False)), runs.get(("static first", True))
    decode = statistics.median(cache.decode_steps_ms(WITH_CACHE))
    fields: dict = {"decode_step_ms": decode}
    if off is not None:
        later = off.frame.iloc[1:]
        fields |= {"prefill_ms_per_token": float((later["ttft_ms"] / later["prompt_tokens"]).median()),
                   "prefill_tokens": int(later["prompt_tokens"].median())}
    if hit is not None and hit.hits:
        hits = hit.frame[hit.frame["hit"]]
        new = hits["prompt_tokens"] - hits["cached_tokens"]
        fields |= {"prefill_cached_ms_per_token": float((hits["ttft_ms"] / new).median()),
                   "prefill_cached_tokens": int(new.median())}
    return Baseline(
        chapter="ch02", machine=describe_machine(model.device), dtype=str(model.dtype).removeprefix("torch."),
        source="section 3's cached decode (median step after the first token, single-sequence loop) and section 7's "
               "engine runs, one request at a time after an uncounted warm-up: the cache-off requests after the "
               "first (TTFT / prompt tokens), the hits (TTFT / new tokens)",
        **fields).explain(prefill_cached_ms_per_token=(
            "a hit computes only its few dozen new tokens, so one forward's fixed cost (every weight read once, "
            "tens of ms) is shared by few tokens: per new token it costs more than a long miss"))
