"""``SchedulerConfig``: what one engine step may contain, and how requests join the running batch."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.checks import require as _require

BATCHING_MODES = ("continuous", "static", "dynamic")
SCHEDULING_POLICIES = ("fcfs", "priority")
# A step group's tokens reach the caller together: past a few dozen, what the host saves per token is noise and a
# waiting request's delay is not.
MAX_SCHEDULER_STEPS = 64


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """What one engine step may contain, and how requests join the running batch.

    ``batching`` is for teaching: ``continuous`` lets requests join and leave every step; ``static`` runs a
    fixed batch to completion before admitting more; ``dynamic`` also runs batches to completion, but starts
    one once ``dynamic_batch_size`` requests wait or the oldest has waited ``dynamic_max_wait_s``.
    ``scheduling_policy`` and ``cache_aware_admission`` choose who is admitted and preempted first
    (`workbench.engine.admission_policy`). ``num_scheduler_steps`` > 1 runs that many decode steps back to back on
    the device per engine step whenever every running sequence is decoding greedily and nothing waits: each step's
    tokens feed the next on the device, and the host schedules, reads tokens back and does its bookkeeping once
    per group instead of once per token (vLLM 0.6's ``--num-scheduler-steps``). Tokens then reach the caller in
    groups, and a request that arrives waits for the group to end.
    """

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    enable_chunked_prefill: bool = True
    max_prefill_chunk: int | None = None  # tokens of one prompt per step (None: whatever budget is left)
    batching: str = "continuous"
    dynamic_batch_size: int = 8
    dynamic_max_wait_s: float = 0.05
    scheduling_policy: str = "fcfs"
    cache_aware_admission: bool = False
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        _require(isinstance(self.num_scheduler_steps, int) and 1 <= self.num_scheduler_steps <= MAX_SCHEDULER_STEPS,
                 f"num_scheduler_steps must be an integer in [1, {MAX_SCHEDULER_STEPS}], got "
                 f"{self.num_scheduler_steps!r}")
        _require(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
                 f"max_num_seqs must be an integer >= 1, got {self.max_num_seqs!r}")
        _require(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= self.max_num_seqs,
                 f"max_num_batched_tokens must be an integer >= max_num_seqs ({self.max_num_seqs}) so every "
                 f"running sequence can decode each step, got {self.max_num_batched_tokens!r}")
        _require(self.max_prefill_chunk is None or (isinstance(self.max_prefill_chunk, int)
                                                    and self.max_prefill_chunk >= 1),
                 f"max_prefill_chunk must be an integer >= 1 or None, got {self.max_prefill_chunk!r}")
        _require(self.batching in BATCHING_MODES,
                 f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        _require(isinstance(self.dynamic_batch_size, int) and self.dynamic_batch_size >= 1,
                 f"dynamic_batch_size must be an integer >= 1, got {self.dynamic_batch_size!r}")
        _require(self.dynamic_max_wait_s >= 0, f"dynamic_max_wait_s must be >= 0, got {self.dynamic_max_wait_s!r}")
        _require(self.scheduling_policy in SCHEDULING_POLICIES,
                 f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        _require(isinstance(self.cache_aware_admission, bool),
                 f"cache_aware_admission must be True or False, got {self.cache_aware_admission!r}")

    @property
    def chunk_limit(self) -> int:
        """Most prompt tokens one sequence may bring to a single step."""
        return self.max_prefill_chunk or self.max_num_batched_tokens
