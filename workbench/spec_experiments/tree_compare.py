"""Chain against token trees at the same verification budget: tokens per target pass, their expected yield,
and what the wider passes cost in time.

A pass of a chain of K drafts verifies K + 1 positions; so does a tree of K nodes. At equal positions per pass
the target forward costs about the same (the budget), and the question is only which layout turns those
positions into more accepted tokens, and what drafting it costs: a chain needs K draft steps in a row, a tree
only as many as it is deep (each reading a whole frontier at once).

`compare_layouts` runs each layout through an engine on the same prompts (greedy, so every layout must
reproduce plain decoding's tokens, which it checks) and returns one row per layout. It is handed a factory,
``make_engine(spec_config) -> LLMEngine`` (None: plain decoding), so the caller picks the model, draft and
scheduler:

    def make_engine(spec):
        return LLMEngine(model, tokenizer, spec_config=spec, draft_model=draft if spec else None,
                         scheduler_config=SchedulerConfig(max_num_seqs=1))

The rows:

- ``positions``: positions per target pass (the verification budget);
- ``tokens_per_pass``: measured (accepted + the target's own token), ``expected_tokens``: the independence
  model at the per-depth, per-rank acceptance the run measured (`SpecCounters.expected_tokens_by_rank`),
  ``expected_from_probe``: the same model at acceptance measured by another run (the ``probe`` layout's, by
  default the widest static tree), i.e. a prediction of the layout's yield made without running it;
- ``draft_ms``, ``verify_ms``: mean proposer time and target forward per pass, ``plain_ms``: a plain decode
  step's forward, ``r`` = verify_ms / plain_ms (the cost of the wider forward);
- ``decode_tokens_per_s`` and ``speedup`` over plain decoding (decode phase: each request's tokens after its
  first, over the time from its first token to its last).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.config import SamplingParams, SpecConfig
from workbench.spec.stats import SpecCounters, expected_tokens_per_pass

EngineFactory = Callable[[SpecConfig | None], Any]  # a spec config (None: plain) -> a fresh LLMEngine

# A static tree with exactly K nodes for each budget K the comparison uses (a full tree's node count is fixed by
# its branching factors): two candidates at the first depth, where the draft is least sure of the context.
STATIC_AT_BUDGET = {4: (2, 1), 6: (2, 2), 8: (2, 1, 1, 1), 12: (2, 2, 1, 1), 16: (4, 1, 1, 1)}


@dataclass(frozen=True, slots=True)
class Layout:
    label: str
    spec: SpecConfig | None  # None: plain decoding

    @property
    def positions(self) -> int:
        return 1 if self.spec is None else self.spec.verify_positions


def layouts_at_budget(nodes: int, method: str = "draft", top_k: int = 3) -> list[Layout]:
    """A chain of ``nodes`` drafts (at most 16, the engine's deepest), a static tree of ``nodes`` nodes when
    ``STATIC_AT_BUDGET`` lists one, and a dynamic tree of ``nodes`` nodes, all verifying ``nodes + 1`` positions per
    pass (the chain ``min(nodes, 16) + 1``)."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    branching = STATIC_AT_BUDGET.get(nodes)
    depth = min(16, max(len(branching or ()) + 1, nodes // top_k + 1))
    static = [Layout(f"static {branching}", SpecConfig(method, tree_branching=branching))] if branching else []
    return [Layout(f"chain K={min(nodes, 16)}", SpecConfig(method, min(nodes, 16))), *static,
            Layout(f"dynamic {nodes} nodes, top-{top_k}, depth {depth}",
                   SpecConfig(method, depth, tree_budget=nodes, tree_top_k=top_k))]


class _Timed:
    """The engine's proposer, unchanged, with its propose calls timed."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _time(self, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def propose(self, items):
        return self._time(self.inner.propose, items)

    def propose_tree(self, items, shape):
        return self._time(self.inner.propose_tree, items, shape)


@dataclass(slots=True)
class _Run:
    tokens: list[list[int]]
    counters: SpecCounters
    decode_tokens: int = 0
    decode_s: float = 0.0
    verify_s: float = 0.0
    verify_steps: int = 0
    plain_s: float = 0.0
    plain_steps: int = 0
    draft_s: float = 0.0


def run_layout(make_engine: EngineFactory, layout: Layout, prompts: list[str], max_tokens: int, *,
               batch: int = 1) -> _Run:
    """Greedy decoding of ``prompts`` (``batch`` at a time) with one layout, timed by step kind."""
    engine = make_engine(layout.spec)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4), progress=False)  # warm-up, not timed
    engine.metrics.reset()
    timed = _Timed(engine.proposer) if engine.proposer is not None else None
    if timed is not None:
        engine.proposer = engine.bookkeeper.proposer = timed
    run = _Run([], SpecCounters())
    execute = engine.runner.execute

    def timed_execute(scheduled, block_copies=()):
        start = time.perf_counter()
        result = execute(scheduled, block_copies)
        seconds = time.perf_counter() - start
        if any(item.drafts is not None for item in scheduled):
            run.verify_s, run.verify_steps = run.verify_s + seconds, run.verify_steps + 1
        elif all(item.num_fed == 1 and item.seq.num_output_tokens for item in scheduled):
            run.plain_s, run.plain_steps = run.plain_s + seconds, run.plain_steps + 1
        return result

    engine.runner.execute = timed_execute
    params = SamplingParams(max_tokens=max_tokens)
    for i in range(0, len(prompts), batch):
        outs = engine.generate(prompts[i:i + batch], params, progress=False)
        run.tokens += [list(o.token_ids) for o in outs]
    for seq in engine.metrics.finished:
        run.counters.merge(seq.spec)
        if len(seq.token_times) > 1:
            run.decode_tokens += len(seq.token_times) - 1
            run.decode_s += seq.token_times[-1] - seq.token_times[0]
    run.draft_s = timed.seconds if timed is not None else 0.0
    return run


def compare_layouts(make_engine: EngineFactory, prompts: list[str], layouts: list[Layout], *, max_tokens: int = 64,
                    batch: int = 1, probe: str | None = None) -> pd.DataFrame:
    """One row per layout, plain decoding first (see the module docstring for the columns); the factory's
    engines should admit ``batch`` sequences at a time. ``probe``: the label of the layout whose per-depth,
    per-rank acceptance predicts the others' yield (default: the static tree with the most nodes)."""
    runs = {"plain": run_layout(make_engine, Layout("plain", None), prompts, max_tokens, batch=batch)}
    for layout in layouts:
        runs[layout.label] = run_layout(make_engine, layout, prompts, max_tokens, batch=batch)
        if runs[layout.label].tokens != runs["plain"].tokens:
            raise AssertionError(f"{layout.label} changed the greedy output")
    trees = [la for la in layouts if la.spec is not None and la.spec.tree_branching]
    probe = probe or (max(trees, key=lambda la: la.positions).label if trees else None)
    table = runs[probe].counters.acceptance_by_rank() if probe else None
    plain = runs["plain"]
    plain_ms = 1000 * plain.plain_s / max(plain.plain_steps, 1)
    plain_speed = plain.decode_tokens / plain.decode_s
    rows = []
    for layout in [Layout("plain", None), *layouts]:
        run, c = runs[layout.label], runs[layout.label].counters
        passes = max(c.passes, 1)
        verify_ms = 1000 * run.verify_s / run.verify_steps if run.verify_steps else float("nan")
        is_chain = layout.spec is not None and not layout.spec.is_tree
        rows.append({
            "layout": layout.label, "positions": layout.positions, "passes": c.passes,
            "tokens_per_pass": c.tokens_per_pass if c.passes else 1.0,
            "expected_tokens": c.expected_tokens_by_rank() if c.passes else 1.0,
            "expected_from_probe": c.expected_tokens_by_rank(table) if c.passes and table else float("nan"),
            "chain_formula": expected_tokens_per_pass(c.alpha, layout.spec.num_speculative_tokens) if is_chain
            else float("nan"),
            "alpha_depth1": c.accepted_at[0] / c.tested_at[0] if c.tested_at and c.tested_at[0] else float("nan"),
            "draft_ms": 1000 * run.draft_s / passes if c.passes else 0.0, "verify_ms": verify_ms,
            "plain_ms": plain_ms, "r": verify_ms / plain_ms,
            "decode_tokens_per_s": run.decode_tokens / run.decode_s,
            "speedup": run.decode_tokens / run.decode_s / plain_speed})
    frame = pd.DataFrame(rows)
    frame.attrs["probe"] = probe
    return frame
