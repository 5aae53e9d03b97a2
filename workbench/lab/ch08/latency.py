"""Two measurements the book states without telling apart, measured here:

- `token_latency` → `TokenLatency`: TPOT and ITL from the same run. TPOT is per request,
  ``(e2e - TTFT) / (output tokens - 1)``, an average over the request's decode; ITL is every gap between two
  streamed chunks. Under batching a newcomer's prefill stalls one step for everyone decoding: that gap is one ITL
  sample far in the tail, but only a small share of each request's TPOT. Under speculation one chunk carries
  several accepted tokens, so the gaps are step times while TPOT divides by tokens (lower, ~step/accepted).
- `prefill_cost` → `PrefillCost`: one request at a time, prefill unchunked, ms per prompt token at several
  lengths and the batch-1 decode step, fastest of ``repeats`` after an uncounted warm-up; its ``baseline()`` is
  the chapter's `Baseline` (the same figures chapter 1 measures), and it shows why the capacity fit's
  per-token cost is higher: the fit only sees chunks of at most 256 tokens mixed with decodes.

No widgets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.ch08.runs import CapacityFit, DashboardRun
from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.evidence import TIMING_FLOOR
from workbench.lab.kit.notebook import dtype_name
from workbench.progress import ProgressFn, no_progress
from workbench.roofline.steps import measure_decode_steps
from workbench.timing import describe_machine
from workbench.workloads import prompt_of_length

PREFILL_LENGTHS = (64, 256, 1024)


# ------------------------------------------------------------------------------------------ ITL vs TPOT
@dataclass(frozen=True)
class TokenLatency:
    """Per request TPOT and every inter-chunk gap (ITL), in ms, from one benchmark run."""

    tpot_ms: pd.Series  # one per request with >= 2 output tokens
    itl_ms: pd.Series  # one per gap between streamed chunks
    chunks_per_token: float  # streamed chunks over output tokens (1.0: one token per chunk, no speculation)

    def stats(self) -> pd.DataFrame:
        rows = {name: {"samples": len(s), "median": s.median(), "p90": s.quantile(0.9), "p99": s.quantile(0.99),
                       "max": s.max(), "mean": s.mean()}
                for name, s in (("TPOT (per request)", self.tpot_ms), ("ITL (per gap)", self.itl_ms))}
        return pd.DataFrame(rows).T

    @property
    def tpot_p99(self) -> float:
        return float(self.tpot_ms.quantile(0.99))

    @property
    def itl_p99(self) -> float:
        return float(self.itl_ms.quantile(0.99))

    @property
    def tpot_median(self) -> float:
        return float(self.tpot_ms.median())

    @property
    def itl_median(self) -> float:
        return float(self.itl_ms.median())

    @property
    def tail_ratio(self) -> float:
        """p99 ITL over p99 TPOT: how much of the tail averaging per request hides."""
        return self.itl_p99 / self.tpot_p99

    def population_reading(self, q: float = 0.9) -> str:
        """Why a TPOT percentile can sit above the ITL one: they are percentiles of two populations (requests and
        gaps), read from this run. Each request's TPOT is at most its own longest gap; the quantiles are not
        bound by that."""
        tpot, itl = self.tpot_ms.quantile(q), self.itl_ms.quantile(q)
        slow = float((self.tpot_ms > itl).mean())
        long_gaps = float((self.itl_ms > itl).mean())
        order = "above" if tpot > itl else "below"
        why = (" The requests that decoded during the burst have many long gaps each, so they fill the top of the "
               "per-request distribution, yet they own a small share of all gaps" if tpot > itl else
               " Here the long gaps are spread over many requests, and averaging dilutes them")
        return (f"p{q * 100:.0f} TPOT {tpot:.1f} ms is {order} p{q * 100:.0f} ITL {itl:.1f} ms: {slow:.0%} of the "
                f"{len(self.tpot_ms)} requests average more than {itl:.1f} ms per token, while {long_gaps:.0%} "
                f"of the {len(self.itl_ms)} gaps are that long.{why}")


def token_latency(run: DashboardRun) -> TokenLatency:
    r = run.bench.requests
    ok = r[r["success"].astype(bool) & (r["output_tokens"] > 1)]
    tpot = (ok["e2e_s"] - ok["ttft_s"]) / (ok["output_tokens"] - 1) * 1e3
    itl = run.bench.itl[run.bench.itl["index"].isin(ok["index"])]["itl_s"] * 1e3
    chunks = float(ok["num_chunks"].sum()) / float(ok["output_tokens"].sum())
    return TokenLatency(tpot.reset_index(drop=True), itl.reset_index(drop=True), chunks)


# ----------------------------------------------------------------------------- prefill cost, baseline
@dataclass(frozen=True)
class PrefillCost:
    """Prefill ms per prompt token by prompt length (one request, unchunked) and the batch-1 decode step."""

    frame: pd.DataFrame  # index prompt_tokens; prefill_ms, ms_per_token, decode_step_ms
    machine: str
    dtype: str
    repeats: int

    @property
    def longest(self) -> int:
        return int(self.frame.index[-1])

    def ms_per_token(self, tokens: int | None = None) -> float:
        return float(self.frame.loc[tokens or self.longest, "ms_per_token"])

    @property
    def decode_ms(self) -> float:
        return float(self.frame["decode_step_ms"].median())

    def fit_over_direct(self, fit: CapacityFit) -> float:
        """The capacity fit's per-token cost over the direct one at the longest prompt."""
        return fit.costs.prefill_ms_per_token / self.ms_per_token()

    def nearest_to_chunk(self, fit: CapacityFit) -> int:
        """The measured length nearest the fit's largest prefill chunk."""
        return min(self.frame.index, key=lambda n: abs(n - fit.largest_chunk))

    def rise_reading(self) -> str:
        """How the per-token prefill cost changes with the prompt, read from the direct measurements."""
        f = self.frame["ms_per_token"]
        rises = bool(f.iloc[-1] > f.iloc[-2] * (1 + TIMING_FLOOR))
        return (f"the direct cost per prompt token goes {' → '.join(f'{v:.2f}' for v in f)} ms at "
                f"{' / '.join(f'{n:,}' for n in f.index)} tokens"
                + (": it rises at the long end, where attention's share of a prefill grows" if rises else
                   ": no clear rise at the long end in this run (within the timing noise)"))

    def baseline(self, batch16_ms: float | None = None) -> Baseline:
        return Baseline(chapter="ch08", machine=self.machine, dtype=self.dtype,
                        source=f"section 5's prefill check: one request at a time through the engine, prefill "
                               f"unchunked, fastest of {self.repeats} runs per length after an uncounted warm-up; "
                               f"prefill = the {self.longest:,}-token prefill step / its tokens, decode = the "
                               "median batch-1 decode step of the fastest run, median over the prompt lengths",
                        decode_step_ms=self.decode_ms, prefill_ms_per_token=self.ms_per_token(),
                        prefill_tokens=self.longest, decode_step_b16_ms=batch16_ms)


def _one_request(model, tokenizer, prompt: list[int], decode_steps: int) -> tuple[float, float]:
    """(prefill step ms, median decode step ms) of one request alone in a fresh engine, prefill in one step. The
    median step of the run, as chapter 1 reads its decode step; the caller keeps the fastest run, as the other
    chapters do (the fastest single step would read low: it picks the luckiest of several)."""
    budget = max(2048, len(prompt) + 1)
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=max(64, len(prompt) // 16 + 16)),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=1))
    engine.add_request(prompt, SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True), chat=False)
    while engine.has_unfinished_requests():
        engine.step()
    steps = engine.metrics.step_frame()
    prefill = steps[steps["num_prefill_tokens"] > 0]
    if len(prefill) != 1:
        raise RuntimeError(f"the prefill took {len(prefill)} steps, expected one")
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_seqs"] == 1)]
    return float(prefill["duration_s"].iloc[0] * 1e3), float(np.median(decode["duration_s"]) * 1e3)


def prefill_cost(model, tokenizer, lengths: Sequence[int] = PREFILL_LENGTHS, *, repeats: int = 2,
                 decode_steps: int = 8, progress: ProgressFn = no_progress) -> PrefillCost:
    _one_request(model, tokenizer, prompt_of_length(tokenizer, min(lengths)), 1)  # warm-up, not counted
    rows = []
    for i, n in enumerate(lengths):
        progress(i, len(lengths), f"prefill of {n:,} tokens")
        runs = [_one_request(model, tokenizer, prompt_of_length(tokenizer, n), decode_steps) for _ in range(repeats)]
        prefill = min(r[0] for r in runs)
        rows.append({"prompt_tokens": n, "prefill_ms": prefill, "ms_per_token": prefill / n,
                     "decode_step_ms": min(r[1] for r in runs)})
    progress(len(lengths), len(lengths), "done")
    return PrefillCost(pd.DataFrame(rows).set_index("prompt_tokens"), describe_machine(model.device),
                       dtype_name(model.dtype), repeats)


@dataclass(frozen=True)
class BatchCheck:
    """Pure decode steps measured at batch 1 and 16 (engine, short context) against the capacity fit's plan."""

    measured_ms: dict[int, float]
    context: int

    def reading(self, fit: CapacityFit) -> str:
        parts = [f"batch {b}: measured {ms:.1f} ms, the fit's plan {fit.costs.step_ms(0, b):.1f} ms"
                 for b, ms in self.measured_ms.items()]
        largest = max(self.measured_ms)
        ratio = fit.costs.step_ms(0, largest) / self.measured_ms[largest]
        if abs(ratio - 1) <= TIMING_FLOOR:
            verdict = f"at batch {largest} the plan agrees with the measurement within the timing noise"
        else:
            verdict = (f"at batch {largest} the plan is {ratio:.2f}x the measurement: its per-decode term comes from "
                       "mixed steps at contexts of 16-320 tokens with prefill chunks beside them, not from pure decode "
                       "steps at a short context, so plan a batch's step from a direct measurement like this one")
        return "; ".join(parts) + f" (pure decode at context {self.context}); {verdict}"


def batch_check(model, batches: Sequence[int] = (1, 16), context: int = 64, steps: int = 4) -> BatchCheck:
    """The median pure decode step at each batch (`workbench.roofline.measure_decode_steps`, warm-up included)."""
    frame = measure_decode_steps(model, list(batches), [context], steps=steps)
    return BatchCheck({int(r["batch"]): float(r["step_s"]) * 1e3 for _, r in frame.iterrows()}, context)
