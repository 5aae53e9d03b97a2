"""Parallel sampling (``n > 1``) on the paged cache: siblings share the prompt's blocks, and copy-on-write gives
each one a private copy of a block only when it is about to write into a shared one.

The course mentions copy-on-write only for beam search. The engine uses it for every request with ``n > 1``:
after the prompt's prefill, the other samples are forked from the first (`BlockManager.fork`: same block table,
reference counts + 1), and the next decode step, which writes each sample's first token into the partly filled
last block, copies that block for every sibling but the last writer. ``parallel_sampling_trace`` runs such a
request on the engine and snapshots every sibling's block table and every block's reference count after each
step; ``ParallelSamplingLab`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.cache.sizing import blocks_for_tokens
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.workloads import prompt_of_length

PRIVATE, SHARED, COPIED = 0, 1, 2
STATE_COLORS = [[0, "#9ecae1"], [0.33, "#9ecae1"], [0.34, "#fd8d3c"], [0.66, "#fd8d3c"], [0.67, "#d62728"],
                [1, "#d62728"]]


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


class ParallelSamplingLab(LabPanel):
    """The samples' block tables at one engine step, and blocks held with and without sharing over the run."""

    def __init__(self, model, tokenizer, *, n: int = 3, prompt_tokens: int = 40, max_tokens: int = 6):
        self.model, self.tokenizer = model, tokenizer
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.n = widgets.IntSlider(value=n, min=2, max=6, description="samples n")
        self.step = widgets.IntSlider(value=1, min=0, max=max_tokens - 2, description="after step")
        grid = go.Figure(go.Heatmap(colorscale=STATE_COLORS, zmin=0, zmax=2, showscale=False, xgap=3, ygap=3,
                                    texttemplate="%{text}", textfont={"size": 14},
                                    hovertemplate="%{customdata}<extra></extra>"))
        grid.update_xaxes(title_text="logical block (table entry)", dtick=1)
        grid.update_yaxes(autorange="reversed", dtick=1)
        style(grid, "Block tables", measured_on(model) + " — cell = physical block id; blue private, orange shared "
              "(reference count > 1), red copied on write at this step", height=300)
        held = go.Figure()
        held.add_scatter(name="blocks held (shared prompt)", mode="lines+markers", line={"color": "#1f77b4"})
        held.add_scatter(name="without sharing (a copy of the prompt each)", mode="lines+markers",
                         line={"color": "#7f7f7f", "dash": "dash"})
        held.update_xaxes(title_text="engine step", dtick=1)
        held.update_yaxes(title_text="KV blocks", rangemode="tozero")
        style(held, "Blocks held by the request's samples", measured_on(model), height=340)
        self.grid, self.held, self.trace = grid, held, None
        super().__init__([self.n], [grid, held], redraw_only=[self.step])
        self.refresh()

    def measure(self) -> None:
        self.trace = parallel_sampling_trace(self.model, self.tokenizer, prompt_tokens=self.prompt_tokens,
                                             n=self.n.value, max_tokens=self.max_tokens)
        self._holding = True  # a shorter run clamps the step slider: that must not redraw a half-updated panel
        try:
            self.step.max = len(self.trace.steps) - 1
        finally:
            self._holding = False
        self.progress.finish(f"{len(self.trace.steps)} engine steps")

    def cells(self, step: int) -> tuple[list[list[int]], list[list[str]], list[list[str]]]:
        """State, label and hover text of every (sample, table entry) at ``step``."""
        snap = self.trace.steps[step]
        width = max(len(t) for t in snap.tables)
        z, text, hover = [], [], []
        for sample, table in enumerate(snap.tables):
            z.append([COPIED if i in snap.copied[sample] else SHARED if snap.refs[b] > 1 else PRIVATE
                      for i, b in enumerate(table)] + [None] * (width - len(table)))
            text.append([str(b) for b in table] + [""] * (width - len(table)))
            hover.append([f"sample {sample}, entry {i}: block {b}, reference count {snap.refs[b]}"
                          for i, b in enumerate(table)] + [""] * (width - len(table)))
        return z, text, hover

    def draw(self) -> None:
        trace = self.trace
        step = min(self.step.value, len(trace.steps) - 1)
        z, text, hover = self.cells(step)
        snap = trace.steps[step]
        with self.grid.batch_update():
            heat = self.grid.data[0]
            heat.z, heat.text, heat.customdata = z, text, hover
            heat.y = [f"sample {i}" for i in range(trace.n)]
            self.grid.layout.title.text = (f"Block tables of n = {trace.n} samples after engine step {step} "
                                           f"(prompt {trace.prompt_tokens} tokens, blocks of {trace.block_size})")
        held, unshared = trace.held_blocks(), trace.unshared_blocks()
        with self.held.batch_update():
            steps = list(range(len(trace.steps)))
            self.held.data[0].x, self.held.data[0].y = steps, held
            self.held.data[1].x, self.held.data[1].y = steps, unshared
        shared = sum(1 for count in snap.refs.values() if count > 1)
        self.status.value = (
            f"After step {step}: {shared} block(s) shared by the samples, {sum(map(len, snap.copied))} copied on "
            f"write at this step. Over the run the engine made <b>{trace.copies()}</b> copy-on-write copies; at the "
            f"end the samples hold <b>{held[-1]}</b> blocks where separate copies of the prompt would need "
            f"<b>{unshared[-1]}</b>.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        snap = self.trace.steps[min(self.step.value, len(self.trace.steps) - 1)]
        rows = [{"sample": i, "tokens cached": snap.tokens[i], "block table": " ".join(map(str, table)),
                 "reference counts": " ".join(str(snap.refs[b]) for b in table)}
                for i, table in enumerate(snap.tables)]
        return [(f"Block tables after step {self.step.value}", pd.DataFrame(rows).set_index("sample"))]
