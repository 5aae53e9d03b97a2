"""Chapter 7's engine runs: plain decoding and speculative decoding side by side, with what each pass did.

Every comparison runs plain decoding and each proposer on the same prompts in one process, interleaved group
by group (a group is ``batch`` requests sent together), so a machine whose load changes during the run slows
all of them alike and the speedup stays a fair ratio. Speculation changes only the decode phase (the prompt's
prefill is the same work either way), so speeds are decode speeds: tokens after each request's first, over the
time from its group's first token to its last.

Three ratios come out of the engine's own records and feed `workbench.spec.theory`: α from the per-request
`SpecCounters`, the draft cost ratio c (time spent proposing per drafted position, over a plain decode step)
and the verification cost ratio r (a speculative step's target forward, over a plain decode step). The
proposer is timed by wrapping the engine's own, which changes nothing it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.spec.stats import SpecCounters, expected_tokens_per_pass
from workbench.spec.theory import speedup

PLAIN = "plain"
PROPOSERS = {"prompt lookup": "ngram", "trained draft": "draft"}  # label -> SpecConfig.method
TASKS = {"grounded": "grounded", "open chat": "draft_heldout"}  # label -> datasets/prompts/<name>.json
ProgressFn = Callable[[int, int, str], None]
# Each engine gets its own KV pool; every lab run fits in ~4k tokens (46 KB each in fp32), and a fixed budget keeps
# several engines alive at once from claiming most of a GPU each (the default sizes the pool to the device).
KV_BUDGET_BYTES = 256 * 2**20


def task_prompts(task: str, count: int) -> list[str]:
    """The first ``count`` prompts of a task set, repeated when more are asked for than it holds."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: choose one of {list(TASKS)}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    prompts = load_prompts(TASKS[task])
    return [prompts[i % len(prompts)] for i in range(count)]


@dataclass(slots=True)
class ProposeCall:
    start: float
    seconds: float
    max_drafts: int  # the largest K asked for in this call: the draft runs that many steps
    drafts: dict[int, list[int]]  # seq_id -> what it proposed


class TimedProposer:
    """The engine's proposer, unchanged, with each ``propose`` call timed and its drafts kept."""

    def __init__(self, inner, clock: Callable[[], float] = time.perf_counter):
        self.inner, self.clock = inner, clock
        self.needs_target_features = inner.needs_target_features
        self.taps = inner.taps
        self.calls: list[ProposeCall] = []

    def propose(self, items):
        start = self.clock()
        result = self.inner.propose(items)
        self.calls.append(ProposeCall(start, self.clock() - start, max(k for _, k in items),
                                      {seq.seq_id: list(drafts) for (seq, _), (drafts, _) in
                                       zip(items, result, strict=True)}))
        return result

    def observe(self, seq, start, hidden):
        self.inner.observe(seq, start, hidden)

    def rollback(self, seq, num_valid):
        self.inner.rollback(seq, num_valid)

    def forget(self, seq_id):
        self.inner.forget(seq_id)

    def copy_blocks(self, pairs):
        self.inner.copy_blocks(pairs)


def make_engine(model, tokenizer, method: str, k: int, *, max_num_seqs: int = 1, draft=None,
                max_num_batched_tokens: int = 4096) -> LLMEngine:
    """An engine for ``plain``, ``ngram`` or ``draft``; a speculative one gets a timed proposer."""
    if method != PLAIN and method not in PROPOSERS.values():
        raise ValueError(f"unknown method {method!r}: choose {PLAIN!r} or one of {list(PROPOSERS.values())}")
    spec = None if method == PLAIN else SpecConfig(method=method, num_speculative_tokens=k)
    engine = LLMEngine(model, tokenizer, spec_config=spec, draft_model=draft if method == "draft" else None,
                       cache_config=CacheConfig(memory_budget_bytes=KV_BUDGET_BYTES),
                       scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs,
                                                        max_num_batched_tokens=max_num_batched_tokens))
    if engine.proposer is not None:
        engine.proposer = TimedProposer(engine.proposer, engine.clock)
    return engine


def generate_group(engine: LLMEngine, prompts: list[str], params: list[SamplingParams], k: int | None,
                   ids: list[str]) -> None:
    """Send the prompts together and step the engine until they are all done."""
    for prompt, sp, request_id in zip(prompts, params, ids, strict=True):
        engine.add_request(prompt, sp, request_id=request_id, num_speculative_tokens=k)
    while engine.has_unfinished_requests():
        engine.step()


def warm_up(engine: LLMEngine, k: int | None) -> None:
    """One short request first, so allocations and the draft's first call are not timed; then forget it."""
    generate_group(engine, ["Say hello."], [SamplingParams(max_tokens=4)], k, ["warm-up"])
    engine.metrics.reset()
    if isinstance(engine.proposer, TimedProposer):
        engine.proposer.calls.clear()


@dataclass(slots=True)
class MethodRun:
    """One method over every group: per-request outcomes, summed counters and the time ratios."""

    label: str
    method: str
    k: int
    batch: int
    requests: pd.DataFrame
    counters: SpecCounters
    outputs: list[list[int]]
    decode_tokens: int
    decode_seconds: float
    decode_step_s: float  # mean duration of a decode step (the target forward plus any drafting)
    verify_step_s: float = float("nan")  # mean target-forward part of a step that verified drafts
    draft_seconds: float = 0.0
    draft_positions: int = 0  # draft steps run: the sum over calls of the largest K asked for
    steps: pd.DataFrame | None = None  # the engine's step records (drafted and accepted per step, durations)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def _request_rows(engine: LLMEngine, ids: list[str], k: int) -> tuple[pd.DataFrame, SpecCounters, list[list[int]]]:
    by_id = {seq.request_id: seq for seq in engine.metrics.finished}
    rows, total, outputs = [], SpecCounters(), []
    for index, request_id in enumerate(ids):
        seq = by_id[request_id]
        spec, times = seq.spec, seq.token_times
        total.merge(spec)
        outputs.append(list(seq.output_ids))
        decode_s = times[-1] - times[0] if len(times) > 1 else float("nan")
        rows.append({"request": index, "prompt_tokens": len(seq.prompt_ids), "output_tokens": len(seq.output_ids),
                     "passes": spec.passes, "drafted": spec.drafted, "tested": sum(spec.tested_at),
                     "accepted": spec.accepted, "alpha": spec.alpha, "accepted_per_drafted": spec.acceptance_rate,
                     "tokens_per_pass": spec.tokens_per_pass,
                     "tokens_per_pass_theory": expected_tokens_per_pass(spec.alpha, k) if spec.drafted else
                     float("nan"), "decode_s": decode_s,
                     "tokens_per_s": (len(times) - 1) / decode_s if len(times) > 1 else float("nan")})
    return pd.DataFrame(rows), total, outputs


def _step_times(engine: LLMEngine) -> tuple[float, float, float, int]:
    """(mean decode step, mean target part of a verifying step, drafting seconds, draft positions)."""
    steps = engine.metrics.step_frame()
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_seqs"] > 0)]
    decode_step = float(decode["duration_s"].mean()) if len(decode) else float("nan")
    proposer = engine.proposer
    if not isinstance(proposer, TimedProposer):
        return decode_step, float("nan"), 0.0, 0
    verifying = decode[decode["num_drafted_tokens"] > 0]
    target_parts = []
    for start, duration in zip(verifying["start_time"], verifying["duration_s"], strict=True):
        drafting = sum(c.seconds for c in proposer.calls if start <= c.start <= start + duration)
        target_parts.append(duration - drafting)
    verify = sum(target_parts) / len(target_parts) if target_parts else float("nan")
    return (decode_step, verify, sum(c.seconds for c in proposer.calls),
            sum(c.max_drafts for c in proposer.calls))


@dataclass(slots=True)
class _Pending:
    label: str
    method: str
    k: int | None
    engine: LLMEngine
    ids: list[str] = field(default_factory=list)
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
    budget = max(1024, sum(len(p) for p in prompts))  # room for a whole group's prefill in one step
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
            generate_group(run.engine, [prompts[i] for i in group], params, run.k, ids)
            run.ids += ids
            seqs = [s for s in run.engine.metrics.finished if s.request_id in set(ids)]
            run.decode_tokens += sum(len(s.output_ids) - 1 for s in seqs)
            run.decode_seconds += max(s.token_times[-1] for s in seqs) - min(s.token_times[0] for s in seqs)
    if progress:
        progress(total, total, f"{len(prompts)} requests x {len(runs)} methods, batch {batch}")
    return Comparison([_finish(run, batch) for run in runs], max_tokens=max_tokens, temperature=temperature)


def _finish(run: _Pending, batch: int) -> MethodRun:
    k = run.k or 0
    requests, counters, outputs = _request_rows(run.engine, run.ids, k)
    decode_step, verify, draft_s, positions = _step_times(run.engine)
    return MethodRun(run.label, run.method, k, batch, requests, counters, outputs, run.decode_tokens,
                     run.decode_seconds, decode_step, verify, draft_s, positions, run.engine.metrics.step_frame())


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
                "speedup_model": speedup(alpha, run.k, c, r) if counters.drafted and c == c else float("nan"),
                "speedup_textbook": speedup(alpha, run.k, c) if counters.drafted and c == c else float("nan"),
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
