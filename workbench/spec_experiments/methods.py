"""Chapter 7's engine runs: an engine per method, its proposer timed, and what each request and step did.

Speculation changes only the decode phase (the prompt's prefill is the same work either way), so speeds are
decode speeds: tokens after each request's first, over the time from its group's first token to its last.
Three ratios come out of the engine's own records and feed `workbench.spec.theory`: α from the per-request
`SpecCounters`, the draft cost ratio c (time spent proposing per draft step, over a plain decode step) and the
verification cost ratio r (a speculative step's target forward, over a plain decode step). The proposer is
timed by wrapping the engine's own, which changes nothing it does. `workbench.spec_experiments.compare` puts the
methods side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.outputs import RequestOutput
from workbench.spec.stats import SpecCounters, expected_tokens_per_pass

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
                   ids: list[str]) -> dict[str, RequestOutput]:
    """Send the prompts together, step the engine until they are all done; each request's final output."""
    for prompt, sp, request_id in zip(prompts, params, ids, strict=True):
        engine.add_request(prompt, sp, request_id=request_id, num_speculative_tokens=k)
    outputs: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        outputs.update((out.request_id, out) for out in engine.step())
    return outputs


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


def request_rows(engine: LLMEngine, outputs: dict[str, RequestOutput], ids: list[str],
                 k: int) -> tuple[pd.DataFrame, SpecCounters, list[list[int]]]:
    """Per request: tokens (from its output), the engine's counters and token times (from its finished sequence)."""
    by_id = {seq.request_id: seq for seq in engine.metrics.finished}
    rows, total, tokens = [], SpecCounters(), []
    for index, request_id in enumerate(ids):
        seq, out = by_id[request_id], outputs[request_id]
        spec, times = seq.spec, seq.token_times
        total.merge(spec)
        tokens.append(list(out.token_ids))
        decode_s = times[-1] - times[0] if len(times) > 1 else float("nan")
        rows.append({"request": index, "prompt_tokens": len(out.prompt_ids), "output_tokens": len(out.token_ids),
                     "passes": spec.passes, "drafted": spec.drafted, "tested": sum(spec.tested_at),
                     "accepted": spec.accepted, "alpha": spec.alpha, "accepted_per_drafted": spec.acceptance_rate,
                     "tokens_per_pass": spec.tokens_per_pass,
                     "tokens_per_pass_theory": expected_tokens_per_pass(spec.alpha, k) if spec.drafted else
                     float("nan"), "decode_s": decode_s,
                     "tokens_per_s": (len(times) - 1) / decode_s if len(times) > 1 else float("nan")})
    return pd.DataFrame(rows), total, tokens


def step_times(engine: LLMEngine) -> tuple[float, float, float, int]:
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
