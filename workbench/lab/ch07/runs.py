"""Chapter 7's measurements and what it computes, without widgets: the book's arithmetic redone, today's vLLM
names for the same counters, and the result objects the panels, the prose and the closing table read
(`AcceptanceRun`: one task set with both proposers beside plain decoding; `BatchRun`: the same at several batch
sizes). The runs themselves live engine-side in `workbench.spec_experiments`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from workbench.lab.kit.baseline import Baseline
from workbench.lab.kit.feasibility import DEVICES, check, smallest_feasible
from workbench.models import model_spec
from workbench.roofline import count_step, decode_work
from workbench.spec.stats import SpecCounters, expected_draft_acceptance, expected_tokens_per_pass
from workbench.spec.theory import break_even_alpha, pass_timeline, speedup
from workbench.spec_experiments.compare import Comparison, compare
from workbench.spec_experiments.forward_cost import ForwardCurve
from workbench.spec_experiments.methods import PLAIN, PROPOSERS, TASKS, task_prompts
from workbench.timing import describe_machine

__all__ = ["PLAIN", "PROPOSERS", "TASKS", "AcceptanceRun", "BatchRun", "VLLM_NAMES", "acceptance_run", "batch_run",
           "load_draft", "physical_r", "seed_arithmetic", "seed_timeline_check", "task_prompts", "vllm_counters"]


def load_draft(model):
    """The trained EAGLE-style draft for SmolLM2-135M (trained on a lent H100: `datasets/drafts/README.md`)."""
    from workbench.spec.draft_head import load_draft as load

    return load(model)


# The book's worked example: a 150 ms target step, ~20 ms for the draft's 4 tokens, "90% acceptance"; a 70B
# target on "an A100" drafted by an 8B model.
SEED_TARGET_MS, SEED_DRAFT_MS, SEED_ALPHA, SEED_K = 150.0, 20.0, 0.9, 4
SEED_TARGET, SEED_DRAFT, SEED_GPU = "llama-3-70b", "llama-3-8b", "A100 80GB"


def physical_r(r: float) -> float:
    """A measured verification cost r, floored at 1: a forward over K + 1 positions cannot cost less than over
    one, so an r below 1 (0.96 once, here) is the clock's noise, and a break-even computed from it would be 0."""
    return max(float(r), 1.0)


def gpu_batch_reading(k: int = 4, device: str = "H100 SXM", model: str = "llama-3-8b", context: int = 64) -> str:
    """Where verification stops being free on a GPU: the largest batch whose verifying forward (B × (K + 1)
    positions) stays left of the device's bf16 ridge, counted from the config (no timing)."""
    dev = DEVICES[device]
    ridge = dev.bf16_flops / dev.bytes_per_s
    spec = model_spec(model)

    def intensity(rows: int) -> float:
        return count_step(spec, decode_work(rows, context), dtype=torch.bfloat16).intensity

    # Intensity grows with the rows but levels off where each sequence's own KV read dominates (at long contexts
    # it may never reach the ridge): look for the first batch past the ridge, at most 1,024 sequences.
    crossing = next((b for b in (2**i for i in range(11)) if intensity(b * (k + 1)) >= ridge), None)
    where = (f"until a batch of {crossing // 2}-{crossing} sequences" if crossing else
             "at every batch up to 1,024 sequences (each sequence's KV read keeps it left of the ridge)")
    return (f"on an {device} (bf16 ridge {ridge:.0f} FLOP/byte) a {model} verifying K={k} drafts for 16 sequences "
            f"feeds {16 * (k + 1)} positions at {intensity(16 * (k + 1)):.0f} FLOP/byte, still bandwidth-bound: "
            f"verification stays nearly free {where} (context {context})")


def seed_timeline_check() -> pd.DataFrame:
    """The book's timeline as a deployment (`workbench.lab.kit.feasibility`): where the 70B target fits, the
    floors of its step and of four 8B drafts, and the book's speedup recomputed at those floors."""
    target = smallest_feasible(SEED_TARGET, SEED_GPU)
    draft = smallest_feasible(SEED_DRAFT, SEED_GPU)
    drafts_ms = SEED_K * draft.decode_floor_ms
    alone = check(SEED_TARGET, SEED_GPU)
    at_floors = pass_timeline(SEED_ALPHA, SEED_K, target_ms=target.decode_floor_ms, draft_ms_total=drafts_ms)
    at_seed_step = pass_timeline(SEED_ALPHA, SEED_K, target_ms=SEED_TARGET_MS, draft_ms_total=drafts_ms)
    rows = [
        ("the 70B target on one A100 80GB", "(assumed)",
         "fits" if alone.fits else f"does not fit: needs TP >= {alone.smallest_tp}"),
        (f"the target step's floor (TP {target.tp})", f"{SEED_TARGET_MS:.0f} ms", f"{target.decode_floor_ms:.1f} ms"),
        ("4 draft tokens of an 8B model (one A100)", f"~{SEED_DRAFT_MS:.0f} ms",
         f"at least {drafts_ms:.1f} ms ({draft.decode_floor_ms:.1f} ms each): "
         + ("below the floor" if drafts_ms > SEED_DRAFT_MS else "possible")),
        ("speedup at α = 0.9 with the book's 150 ms step and feasible drafts", "3.2x", f"{at_seed_step.speedup:.2f}x"),
        ("speedup with both at their floors", "3.2x", f"{at_floors.speedup:.2f}x"),
    ]
    return pd.DataFrame(rows, columns=["claim", "the book", "computed here"])


def seed_arithmetic() -> pd.DataFrame:
    """The book's numbers next to what its own assumptions give."""
    line = pass_timeline(SEED_ALPHA, SEED_K, target_ms=SEED_TARGET_MS, draft_ms_total=SEED_DRAFT_MS)
    c = SEED_DRAFT_MS / SEED_K / SEED_TARGET_MS
    alpha_be = break_even_alpha(SEED_K, c)
    rows = [
        ("tokens per target pass, α = 0.9, K = 4", "about 3.6", f"{expected_tokens_per_pass(0.9, 4):.2f}"),
        ("speedup of its own timeline (150 ms target, 20 ms of drafting)", "3.2x", f"{line.speedup:.2f}x"),
        ("ms per token in that timeline", "~47 ms", f"{line.ms_per_token:.1f} ms"),
        ("5 drafts, 4 accepted: tokens from the target pass (a source summary's example, not the book's)", "4",
         f"{4 + 1} (the 4 plus the target's own)"),
        ("acceptance below which it stops paying (K = 4, that draft)", "~70%",
         f"α = {alpha_be:.2f} (accepted ÷ drafted {expected_draft_acceptance(alpha_be, SEED_K):.2f})"),
    ]
    return pd.DataFrame(rows, columns=["claim", "the book", "computed here"])


# Current vLLM (V1 engine) names; checked against docs.vllm.ai (features/speculative_decoding, n-gram page,
# per-request acceptance metrics, 2025-2026). The book's flags and gauge belong to the 2024 V0 engine.
VLLM_NAMES = pd.DataFrame([
    ("choose the draft and K", "--speculative-model M --num-speculative-tokens 5",
     "--speculative-config '{\"model\": \"M\", \"num_speculative_tokens\": 5}'"),
    ("prompt lookup", "(not shown)",
     "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}'"),
    ("EAGLE-style head", "(not shown)",
     "--speculative-config '{\"method\": \"eagle3\", \"model\": \"<head>\", \"num_speculative_tokens\": 3}'"),
    ("acceptance metric", "vllm:spec_decode_draft_acceptance_rate (a gauge)",
     "counters vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total, "
     "_num_accepted_tokens_per_pos_total{position}"),
], columns=["what", "the book (vLLM 2024, V0)", "vLLM today (V1)"])


def vllm_counters(counters: SpecCounters) -> dict[str, float]:
    """What vLLM's counters would read for these drafts, and the rates a dashboard derives from them."""
    drafts, draft_tokens, accepted = counters.passes, counters.drafted, counters.accepted
    values: dict[str, float] = {"vllm:spec_decode_num_drafts_total": drafts,
                                "vllm:spec_decode_num_draft_tokens_total": draft_tokens,
                                "vllm:spec_decode_num_accepted_tokens_total": accepted}
    for i, n in enumerate(counters.accepted_at):
        values[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] = n
    values["acceptance rate = accepted ÷ draft tokens"] = accepted / draft_tokens if draft_tokens else math.nan
    values["mean acceptance length = 1 + accepted ÷ drafts"] = 1 + accepted / drafts if drafts else math.nan
    values["α = accepted ÷ tested (not a vLLM counter)"] = counters.alpha
    return values


@dataclass(slots=True)
class AcceptanceRun:
    """One task set run with both proposers beside plain decoding (greedy or sampled), K drafts per pass."""

    task: str
    k: int
    temperature: float
    num_prompts: int
    max_tokens: int
    comparison: Comparison
    summary: pd.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.summary = self.comparison.summary()

    def row(self, proposer: str) -> pd.Series:
        return self.summary.loc[proposer]

    def alpha(self, proposer: str) -> float:
        return float(self.summary.loc[proposer, "alpha"])

    def speedup(self, proposer: str) -> float:
        return float(self.summary.loc[proposer, "speedup"])

    def break_even(self, proposer: str) -> float:
        """α below which this proposer, at this run's measured c and r, is slower than plain decoding (r below 1
        is taken as 1: a forward over more positions cannot cost less than over one; below 1 is timing noise)."""
        row = self.summary.loc[proposer]
        return break_even_alpha(self.k, max(float(row["draft_cost_c"]), 0.0), physical_r(row["verify_cost_r"]))

    @property
    def workload(self) -> str:
        return f"{self.num_prompts} {self.task} prompt(s) × {self.max_tokens} tokens, K={self.k}"


def acceptance_run(model, tokenizer, draft, *, task: str, k: int, temperature: float = 0.0, num_prompts: int = 2,
                   max_tokens: int = 40, progress=None) -> AcceptanceRun:
    comparison = compare(model, tokenizer, task_prompts(task, num_prompts), [(label, k) for label in PROPOSERS],
                         max_tokens=max_tokens, temperature=temperature, draft=draft, progress=progress)
    return AcceptanceRun(task, k, temperature, num_prompts, max_tokens, comparison)


@dataclass(slots=True)
class BatchRun:
    """Both proposers and plain decoding at several batch sizes (``b`` prompts of the task sent together)."""

    task: str
    k: int
    max_tokens: int
    batches: tuple[int, ...]
    frame: pd.DataFrame  # one row per (batch, method)

    def speedups(self, proposer: str) -> list[float]:
        rows = self.frame[self.frame["method"] == proposer].set_index("batch")
        return [float(rows.loc[b, "speedup"]) for b in self.batches]

    def at(self, batch: int, proposer: str) -> pd.Series:
        return self.frame[(self.frame["batch"] == batch) & (self.frame["method"] == proposer)].iloc[0]

    def falls(self, proposer: str) -> bool:
        """The speedup at the largest batch is below the one at the smallest."""
        s = self.speedups(proposer)
        return s[-1] < s[0]

    def monotonic(self, proposer: str) -> bool:
        s = self.speedups(proposer)
        return all(a >= b for a, b in zip(s, s[1:], strict=False))

    def workload(self, batch: int) -> str:
        return f"{batch} {self.task} prompt(s) × {self.max_tokens} tokens, K={self.k}"

    def baseline(self, model) -> Baseline:
        """Plain decoding's step at batch 1 and 16 (engine, decode phase), for the cross-chapter registry."""
        plain = self.frame[self.frame["method"] == PLAIN].set_index("batch")["decode_tokens_per_s"]
        steps = {b: b / float(plain.loc[b]) * 1e3 for b in plain.index}
        return Baseline(chapter="ch07", machine=describe_machine(model.device),
                        dtype=str(model.dtype).removeprefix("torch."),
                        source=f"section 7's batch panel: plain decoding of {self.task} prompts sent together, "
                               f"{self.max_tokens} tokens each; a step = batch / decode-phase tokens per second",
                        decode_step_ms=steps.get(1), decode_step_b16_ms=steps.get(16))


def batch_run(model, tokenizer, draft, curve: ForwardCurve, *, task: str = "open chat", k: int = 4,
              batches: tuple[int, ...] = (1, 4, 16), max_tokens: int = 16, progress=None) -> BatchRun:
    """Each batch size in turn; the model's speedup at each uses r read off the forward curve at that batch."""
    rows = []
    for i, b in enumerate(batches):
        if progress is not None:
            progress(i, len(batches), f"batch {b}")
        summary = compare(model, tokenizer, task_prompts(task, b), [(label, k) for label in PROPOSERS],
                          max_tokens=max_tokens, batch=b, draft=draft).summary()
        r_curve = curve.ratio(b * (k + 1), b)
        for method, row in summary.iterrows():
            model_speedup = (speedup(row["alpha"], k, row["draft_cost_c"], r_curve)
                             if method != PLAIN and math.isfinite(row["alpha"]) and math.isfinite(row["draft_cost_c"])
                             else float("nan"))
            rows.append({"batch": b, "method": method, "decode_tokens_per_s": row["decode_tokens_per_s"],
                         "speedup": row["speedup"], "alpha": row["alpha"], "tokens_per_pass": row["tokens_per_pass"],
                         "draft_cost_c": row["draft_cost_c"], "verify_cost_r": row["verify_cost_r"],
                         "r_forward_curve": r_curve, "speedup_model": model_speedup,
                         "same_as_plain": row["same_as_plain"]})
    if progress is not None:
        progress.finish(f"batches {list(batches)} done")
    return BatchRun(task, k, max_tokens, tuple(batches), pd.DataFrame(rows))


def same_draft_two_runs(chat: AcceptanceRun, batch: BatchRun, proposer: str = "trained draft") -> str:
    """Why the acceptance panel and the batch panel's batch-1 point give the same proposer, on the same task, two
    different speedups: they decode different prompts for different lengths, so α and its cost differ."""
    one = batch.at(batch.batches[0], proposer)
    return (f"{proposer} on {chat.task}: the acceptance panel ran {chat.workload}: α {chat.alpha(proposer):.2f}, "
            f"{float(chat.row(proposer)['tokens_per_pass']):.2f} tokens per pass, c = "
            f"{float(chat.row(proposer)['draft_cost_c']):.3f}, r = {float(chat.row(proposer)['verify_cost_r']):.2f} "
            f"→ {chat.speedup(proposer):.2f}x; the batch panel at batch {batch.batches[0]} ran "
            f"{batch.workload(batch.batches[0])}: α {float(one['alpha']):.2f}, {float(one['tokens_per_pass']):.2f} "
            f"tokens per pass, c = {float(one['draft_cost_c']):.3f}, r = {float(one['verify_cost_r']):.2f} → "
            f"{float(one['speedup']):.2f}x")
