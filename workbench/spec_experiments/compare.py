"""Plain decoding and each proposer over the same requests, in one run: the comparison chapter 7 is built on.

`compare` creates one engine per method (`workbench.spec_experiments.methods`), warms each up, then sends the prompts
group by group (``batch`` at a time), every method in turn for each group, so load that changes during the run
hits all methods alike. `Comparison` turns the runs into the chapter's frames: per method (speed, speedup,
counts, α, tokens per pass beside the formula, the cost ratios c and r, and the speedup the model predicts
from them), per draft position, and per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from workbench.config import SamplingParams
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.outputs import RequestOutput
from workbench.prompts import encode_prompt
from workbench.spec.stats import SpecCounters, expected_tokens_per_pass
from workbench.spec.theory import speedup
from workbench.spec_experiments.methods import (
    PLAIN,
    PROPOSERS,
    MethodRun,
    ProgressFn,
    generate_group,
    make_engine,
    request_rows,
    step_times,
    warm_up,
)


@dataclass(slots=True)
class _Pending:
    label: str
    method: str
    k: int | None
    engine: LLMEngine
    ids: list[str] = field(default_factory=list)
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    decode_tokens: int = 0
    decode_seconds: float = 0.0


def compare(model, tokenizer, prompts: list[str], methods: list[tuple[str, int]], *, max_tokens: int = 48,
            temperature: float = 0.0, batch: int = 1, draft=None, seed: int = 0,
            progress: ProgressFn | None = None) -> Comparison:
    """Plain decoding and each (proposer label, K) on the same prompts, ``batch`` requests at a time."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    for label, k in methods:
        if label not in PROPOSERS or not isinstance(k, int) or not 1 <= k <= 16:
            raise ValueError(f"need (proposer, K) with proposer in {list(PROPOSERS)} and K in [1, 16], got "
                             f"({label!r}, {k!r})")
    lengths = [len(encode_prompt(tokenizer, p, chat=True)) for p in prompts]
    # Room for a whole group's prefill in one step (plus K + 1 <= 17 positions per sequence), so the group's decode
    # phase starts together and is timed as one span.
    budget = max(1024, max(sum(lengths[i:i + batch]) for i in range(0, len(prompts), batch)) + 17 * batch)
    runs = [_Pending(PLAIN, PLAIN, None, make_engine(model, tokenizer, PLAIN, 1, max_num_seqs=batch,
                                                     max_num_batched_tokens=budget))]
    runs += [_Pending(f"{label}, K={k}" if [m for m, _ in methods].count(label) > 1 else label, PROPOSERS[label],
                      k, make_engine(model, tokenizer, PROPOSERS[label], k, max_num_seqs=batch, draft=draft,
                                     max_num_batched_tokens=budget)) for label, k in methods]
    for run in runs:
        warm_up(run.engine, run.k)
    groups = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]
    total = len(groups) * len(runs)
    for g, group in enumerate(groups):
        params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i) for i in group]
        for r, run in enumerate(runs):
            if progress:
                progress(g * len(runs) + r, total, f"{run.label}: requests {group[0] + 1}-{group[-1] + 1}")
            ids = [f"{run.label}-{i}" for i in group]
            run.outputs.update(generate_group(run.engine, [prompts[i] for i in group], params, run.k, ids))
            run.ids += ids
            wanted = set(ids)
            seqs = [s for s in run.engine.metrics.finished if s.request_id in wanted]
            run.decode_tokens += sum(len(s.token_times) - 1 for s in seqs)
            run.decode_seconds += max(s.token_times[-1] for s in seqs) - min(s.token_times[0] for s in seqs)
    if progress:
        progress(total, total, f"{len(prompts)} requests x {len(runs)} methods, batch {batch}")
    return Comparison([_finish(run, batch) for run in runs], max_tokens=max_tokens, temperature=temperature)


def _finish(run: _Pending, batch: int) -> MethodRun:
    k = run.k or 0
    requests, counters, outputs = request_rows(run.engine, run.outputs, run.ids, k)
    decode_step, verify, draft_s, positions = step_times(run.engine)
    return MethodRun(run.label, run.method, k, batch, requests, counters, outputs, run.decode_tokens,
                     run.decode_seconds, decode_step, verify, draft_s, positions, run.engine.metrics.step_frame())


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


@dataclass(slots=True)
class Comparison:
    """Plain decoding first, then each speculative method, all over the same requests."""

    runs: list[MethodRun]
    max_tokens: int
    temperature: float

    @property
    def plain(self) -> MethodRun:
        return self.runs[0]

    def run(self, label: str) -> MethodRun:
        for run in self.runs:
            if run.label == label:
                return run
        raise ValueError(f"no run labelled {label!r}: have {[r.label for r in self.runs]}")

    def same_as_plain(self, run: MethodRun) -> bool | None:
        """Token-identical outputs (greedy only: sampled runs draw different random numbers)."""
        return run.outputs == self.plain.outputs if self.temperature == 0 else None

    def cost_ratios(self, run: MethodRun) -> tuple[float, float]:
        """(c, r): drafting per draft step and the verifying forward, each over a plain decode step."""
        plain_step = self.plain.decode_step_s
        c = run.draft_seconds / run.draft_positions / plain_step if run.draft_positions else float("nan")
        return c, run.verify_step_s / plain_step

    def pooled(self, labels: list[str]) -> tuple[float, float]:
        """(α, c) over several runs: counts summed, drafting time over draft steps summed."""
        counters, seconds, positions = SpecCounters(), 0.0, 0
        for label in labels:
            run = self.run(label)
            counters.merge(run.counters)
            seconds, positions = seconds + run.draft_seconds, positions + run.draft_positions
        return counters.alpha, (seconds / positions / self.plain.decode_step_s if positions else float("nan"))

    def summary(self) -> pd.DataFrame:
        """One row per method: speed, speedup, counts, rates, and the speedup the model predicts from them."""
        rows = []
        for run in self.runs:
            counters, (c, r) = run.counters, self.cost_ratios(run)
            alpha = counters.alpha
            theory = expected_tokens_per_pass(alpha, run.k) if counters.drafted else float("nan")
            rows.append({
                "method": run.label, "K": run.k, "batch": run.batch, "output_tokens": int(run.requests[
                    "output_tokens"].sum()), "decode_tokens_per_s": run.tokens_per_s,
                "speedup": run.tokens_per_s / self.plain.tokens_per_s, "passes": counters.passes,
                "drafted": counters.drafted, "tested": sum(counters.tested_at), "accepted": counters.accepted,
                "alpha": alpha, "accepted_per_drafted": counters.acceptance_rate,
                "tokens_per_pass": counters.tokens_per_pass, "tokens_per_pass_theory": theory,
                "draft_cost_c": c, "verify_cost_r": r,
                "speedup_model": speedup(alpha, run.k, c, r) if _finite(alpha, c, r) else float("nan"),
                "speedup_textbook": speedup(alpha, run.k, c) if _finite(alpha, c) else float("nan"),
                "same_as_plain": self.same_as_plain(run) if run.k else None})
        return pd.DataFrame(rows).set_index("method")

    def positions(self, label: str) -> pd.DataFrame:
        """Per draft position: counts, both rates, and what independent acceptance at the pooled α predicts."""
        run = self.run(label)
        frame = run.counters.per_position()
        alpha = run.counters.alpha
        frame["alpha_theory"] = alpha
        frame["acceptance_rate_theory"] = [alpha ** p for p in frame["position"]]
        return frame

    def requests(self) -> pd.DataFrame:
        """Every method's per-request rows, one frame."""
        return pd.concat([run.requests.assign(method=run.label) for run in self.runs], ignore_index=True)
