"""Capacity turned into throughput: the same KV memory, two cache formats, more requests than the fp32 cache holds.

The chapter's speed figure once came from a run that capped every format at 16 sequences with an ample pool, so
"a smaller cache, a larger batch, more throughput" was never tested: the batch could not grow. Here the pool is a
fixed number of bytes (``CacheConfig.memory_budget_bytes``) and ``max_num_seqs`` sits above what any format
fits, so the KV pool, not the configuration, bounds the batch; each format's peak batch is checked against both
caps (`workbench.lab.kit.caps`). Whether the larger batch pays for the dequantization each decode step costs on
this CPU is what the run measures. No widgets here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from workbench.bench.drive import drive
from workbench.bench.synthetic import random_requests
from workbench.cache.sizing import blocks_for_tokens, kv_bytes_per_token
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.caps import Cap, Limit
from workbench.lab.kit.evidence import Evidence
from workbench.progress import ProgressFn, no_progress

FP32_SEQUENCES = 4  # the pool holds this many whole fp32 sequences: the fp32 batch is the pool's
MAX_NUM_SEQS = 64  # above what any format fits in that pool


@dataclass(frozen=True)
class MemoryLimitedRun:
    """Per KV format, on the same KV bytes: the sequences that fit, the peak and mean decode batch, throughput."""

    frame: pd.DataFrame  # kv_format, num_blocks, fit, peak_batch, mean_decode_batch, preemptions, output_tok_s
    budget_bytes: int
    max_num_seqs: int
    requests: int

    def row(self, kv_format: str) -> pd.Series:
        return self.frame.set_index("kv_format").loc[kv_format]

    def limit(self, kv_format: str) -> Limit:
        """The format's peak batch against the configured caps (``max_num_seqs``, the requests offered): below
        both, the KV pool is what bounded it, which is the point of the run."""
        r = self.row(kv_format)
        return Limit(f"the {kv_format} cache's peak batch", float(r["peak_batch"]), "sequences",
                     (Cap("max_num_seqs", self.max_num_seqs), Cap("requests offered", self.requests)))

    def sentence(self) -> str:
        """What bounded each format's batch, said with the caps and the pool."""
        parts = []
        for kv_format in self.frame["kv_format"]:
            limit, fit = self.limit(kv_format), int(self.row(kv_format)["fit"])
            parts.append(limit.sentence() if limit.set_by_cap else
                         f"{limit.sentence().split(':')[0]}: the KV pool sets it ({fit} whole sequences fit; "
                         "admission counts only the prompt's blocks, so a batch can pass that and preempt)")
        return "; ".join(parts)

    def evidence(self, small: str, base: str = "auto") -> list[Evidence]:
        """The chain, link by link: the smaller cache runs a larger batch, and that batch more tokens per second
        (one run each: the timing's noise floor is the margin)."""
        s, b = self.row(small), self.row(base)
        settings = {"KV bytes": f"{self.budget_bytes / 2**20:.1f} MiB", "max_num_seqs": self.max_num_seqs}
        return [Evidence.exact(f"peak decode batch, {small} / {base} cache", s["peak_batch"] / b["peak_batch"], 1.0,
                               n_label="step counts", settings=settings),
                Evidence.repeats(f"output tok/s, {small} / {base} cache", [s["output_tok_s"]], [b["output_tok_s"]],
                                 n_label="run of each")]


def memory_limited_run(model, tokenizer, formats: tuple[str, ...] = ("auto", "int8"), *, requests: int = 24,
                       prompt_tokens: int = 96, output_tokens: int = 24, progress: ProgressFn = no_progress,
                       ) -> MemoryLimitedRun:
    """Every format on a pool of the KV bytes that hold ``FP32_SEQUENCES`` whole fp32 sequences."""
    length = prompt_tokens + output_tokens
    block = 16
    fp32_sequence = blocks_for_tokens(length, block) * block * kv_bytes_per_token(model.spec, "auto", model.dtype)
    budget = FP32_SEQUENCES * fp32_sequence
    workload = random_requests(requests, prompt_tokens=prompt_tokens, output_tokens=(output_tokens, output_tokens),
                               seed=3, vocab_size=model.spec.vocab_size)
    rows = []
    for i, kv_format in enumerate(formats):
        progress(i, len(formats), f"{kv_format} cache")
        engine = LLMEngine(model, tokenizer,
                           cache_config=CacheConfig(block_size=block, kv_cache_dtype=kv_format,
                                                    memory_budget_bytes=budget, enable_prefix_caching=False),
                           scheduler_config=SchedulerConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=512))
        blocks = engine.blocks.num_blocks
        run = drive(engine, workload, concurrency=requests)
        decode = run.steps[run.steps["num_decode_seqs"] > 0]
        rows.append({"kv_format": kv_format, "num_blocks": int(blocks),
                     "fit": int(blocks // blocks_for_tokens(length, block)),
                     "peak_batch": int(run.steps["batch_size"].max()),
                     "mean_decode_batch": float(decode["num_decode_seqs"].mean()),
                     "preemptions": int(run.requests["preemptions"].sum()),
                     "output_tok_s": float(run.summary["output_throughput"])})
    progress(1, 1, "done")
    return MemoryLimitedRun(pd.DataFrame(rows), budget, MAX_NUM_SEQS, requests)
