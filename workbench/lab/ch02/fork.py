"""Parallel sampling (``n > 1``) on the paged cache: siblings share the prompt's blocks, and copy-on-write gives
each one a private copy of a block only when it is about to write into a shared one.

The book mentions copy-on-write only for beam search. The engine uses it for every request with ``n > 1``:
after the prompt's prefill, the other samples are forked from the first (`BlockManager.fork`: same block table,
reference counts + 1), and the next decode step, which writes each sample's first token into the partly filled
last block, copies that block for every sibling but the last writer. ``parallel_sampling_trace`` runs such a
request on the engine and snapshots every sibling's block table and every block's reference count after each
step; ``ParallelSamplingLab`` (`workbench.lab.ch02.panels_fork`) draws them. No widgets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.cache.sizing import blocks_for_tokens
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import prompt_of_length

PRIVATE, SHARED, COPIED = 0, 1, 2


@dataclass
class ForkStep:
    tables: list[list[int]]  # per sample: its block table (empty once finished)
    tokens: list[int]  # per sample: tokens whose KV is in the cache
    refs: dict[int, int]  # block -> reference count
    copied: list[list[int]]  # per sample: table entries that point at a new block since the previous step


@dataclass
class ForkTrace:
    block_size: int
    prompt_tokens: int
    n: int
    steps: list[ForkStep] = field(default_factory=list)

    def held_blocks(self) -> list[int]:
        """Distinct blocks the samples hold after each step."""
        return [len({b for table in s.tables for b in table}) for s in self.steps]

    def unshared_blocks(self) -> list[int]:
        """Blocks the samples would hold after each step if each kept its own copy of the prompt."""
        return [sum(blocks_for_tokens(t, self.block_size) for t in s.tokens) for s in self.steps]

    def copies(self) -> int:
        return sum(len(c) for s in self.steps for c in s.copied)


def parallel_sampling_trace(model, tokenizer, *, prompt_tokens: int = 40, n: int = 3, max_tokens: int = 6,
                            block_size: int = 16, seed: int = 0) -> ForkTrace:
    """Run one request with ``n`` samples (temperature 0.8) and snapshot its block tables after every step."""
    if not 2 <= n <= 8:
        raise ValueError(f"n must be in [2, 8] to show sharing, got {n}")
    pool = n * blocks_for_tokens(prompt_tokens + max_tokens, block_size) + 4
    engine = LLMEngine(model, tokenizer,
                       cache_config=CacheConfig(block_size=block_size, num_blocks=pool, enable_prefix_caching=False),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=max(512, prompt_tokens),
                                                        max_num_seqs=n))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=seed, n=n, ignore_eos=True)
    request_id = engine.add_request(prompt_of_length(tokenizer, prompt_tokens), params)
    seqs = engine.requests[request_id].seqs
    trace, previous = ForkTrace(block_size, prompt_tokens, n), [[] for _ in range(n)]
    while engine.has_unfinished_requests():
        engine.step()
        blocks = engine.blocks
        tables = [blocks.block_table(s.seq_id) if s.seq_id in blocks else [] for s in seqs]
        copied = [[i for i, b in enumerate(table) if i < len(before) and before[i] != b]
                  for table, before in zip(tables, previous, strict=True)]
        if not any(tables):  # the last step finished every sample: nothing left to show
            break
        refs = {b: blocks.ref_count(b) for table in tables for b in table}
        trace.steps.append(ForkStep(tables, [s.num_computed_tokens for s in seqs], refs, copied))
        previous = tables
    return trace
