"""Which sequences run in the next step, and how many tokens each brings.

One step is one forward pass over a flat batch of at most ``max_num_batched_tokens`` tokens:

1. running sequences first, decodes before unfinished prefills: each decode brings its one newest token, a
   prefill its next chunk (chunked prefill), so a long prompt can never stall the decoders for a whole step
   (with ``num_scheduler_steps`` > 1 and only greedy decodes running, each decode reserves slots for that many
   steps, which the runner decodes back to back);
2. then waiting sequences are admitted, oldest first, while tokens, sequence slots and blocks last.

Who is admitted and who is preempted first is the admission policy's call (`workbench.engine.admission_policy`:
FCFS by default, or by request priority, optionally preferring cached prefixes).

When blocks run out for a running sequence, the newest running sequence not yet scheduled this step is
preempted by recompute: its blocks are freed and it goes back to the front of the queue, to be prefilled
again (prompt and generated tokens) when there is room. No new sequence is admitted in a step that preempts.

A request for ``n`` completions enters as one sequence whose ``n - 1`` siblings wait until its prompt is in
the cache, then ``fork`` lets them share its blocks. Admission counts the siblings against ``max_num_seqs``.

The scheduler owns where each sequence is (waiting, running, waiting to be forked, finished), the admission
stamps, the preemption count and ``Sequence.num_computed_tokens``, and it is the only code that tells the block
manager about a sequence: admission, forks, slots, frees, and what each forward changed (``mark_computed``,
``append_token``, ``release_lookahead``, which the engine's bookkeeper calls). It moves sequences and integers,
never a tensor: what a step feeds beyond its decision (speculative drafts) is the engine's
(`workbench.spec.drafts`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from workbench.cache.block_manager import BlockManager
from workbench.config import SchedulerConfig
from workbench.engine.admission_policy import AdmissionPolicy
from workbench.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One sequence's part of the step, as decided; drafts, if any, are fed after its newest token on top."""

    seq: Sequence
    num_new_tokens: int  # known tokens fed this step, from seq.num_computed_tokens on (a chunk, or the newest one)
    lookahead: int = 0  # slots reserved beyond them: for speculative drafts, or the steps of a multi-step decode
    # Decode 1 + lookahead steps back to back on the device (SchedulerConfig.num_scheduler_steps), not drafts
    multi_step: bool = False


@dataclass(slots=True)
class SchedulerOutput:
    decodes: list[ScheduledSeq] = field(default_factory=list)
    prefills: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write, before the forward
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # joined the running batch this step

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        """Decodes, then prefills (the batch builder, `workbench.cache.paged_batch`, orders the rows)."""
        return self.decodes + self.prefills

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.blocks = block_manager
        self.policy = AdmissionPolicy(config)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last one is preempted first
        self._forks: dict[int, list[Sequence]] = {}  # seq_id -> siblings waiting for its prompt's KV

    # ----------------------------------------------------------------------------------------------------
    def add(self, seq: Sequence, siblings: list[Sequence] | None = None) -> None:
        """Queue ``seq``; its ``siblings`` (the other completions of an n > 1 request) fork from it later."""
        siblings = siblings or []
        if len(siblings) + 1 > self._admission_limit():
            raise ValueError(f"n = {len(siblings) + 1} completions cannot run together: at most "
                             f"{self._admission_limit()} sequences run at once; lower n or raise max_num_seqs")
        self.waiting.append(seq)
        if siblings:
            self._forks[seq.seq_id] = list(siblings)

    def has_pending_forks(self, seq: Sequence) -> bool:
        return seq.seq_id in self._forks

    def fork(self, parent: Sequence) -> list[Sequence]:
        """The parent's waiting siblings share its blocks from now on and join the running batch."""
        children = self._forks.pop(parent.seq_id, [])
        for child in children:
            self.blocks.fork(parent.seq_id, child.seq_id, child.token_ids)
            self._sync_computed(child)
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            child.first_scheduled_time = parent.first_scheduled_time
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        return children

    def finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        """Let a sequence go, wherever it is, releasing its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.free(seq.seq_id)
            seq.num_computed_tokens = 0
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._forks.pop(seq.seq_id, None)
        seq.finish(reason, now)

    # ------------------------------------------------------------------------- what a forward changed
    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """The KV of ``seq``'s first ``num_tokens`` tokens is in the cache now."""
        self.blocks.mark_computed(seq.seq_id, num_tokens)
        self._sync_computed(seq)

    def append_token(self, seq: Sequence, token: int, now: float) -> None:
        """A token ``seq`` generated: the sequence and the block manager's copy of its tokens both get it."""
        seq.append_token(token, now)
        self.blocks.append_tokens(seq.seq_id, (token,))

    def release_lookahead(self, seq: Sequence) -> None:
        """Slots reserved beyond ``seq``'s known tokens (drafts rejected or never proposed) go back."""
        self.blocks.truncate(seq.seq_id, seq.num_tokens)
        self._sync_computed(seq)

    def _sync_computed(self, seq: Sequence) -> None:
        """The sequence's count of computed tokens, from the block manager that knows it (ValueError if not)."""
        seq.num_computed_tokens = self.blocks.num_computed_tokens(seq.seq_id)

    # ----------------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out)
        if not out.preempted and self._may_admit(now):
            self._admit_waiting(out, budget, now)
        return out

    def _schedule_running(self, out: SchedulerOutput) -> int:
        budget = self.config.max_num_batched_tokens
        scheduled: set[int] = set()
        order = [s for s in self.running if s.is_decoding] + [s for s in self.running if not s.is_decoding]
        multi = self._multi_step()
        for seq in order:
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed_tokens, budget, self.config.chunk_limit)
            if n == 0:
                break
            if multi:  # slots for the steps after this one; each step feeds one token, so no budget is charged
                lookahead = min(self.config.num_scheduler_steps - 1, seq.num_remaining_tokens - 1)
            else:
                lookahead = min(seq.lookahead, max(budget - 1, 0))
            if not self._reserve_or_preempt(seq, n + lookahead, scheduled, out):
                continue
            target = out.decodes if seq.is_decoding else out.prefills
            target.append(ScheduledSeq(seq, n, lookahead, multi_step=multi))
            scheduled.add(seq.seq_id)
            budget -= n + (0 if multi else lookahead)
        return budget

    def _multi_step(self) -> bool:
        """Several decode steps this time: asked for, every running sequence decoding greedily, nobody waiting to
        join (a group delays admission by its length) and no siblings waiting to fork."""
        return (self.config.num_scheduler_steps > 1 and not self.waiting and not self._forks and bool(self.running)
                and all(s.is_decoding and s.takes_multi_step for s in self.running))

    def _reserve_or_preempt(self, seq: Sequence, n: int, scheduled: set[int], out: SchedulerOutput) -> bool:
        """Reserve slots for ``n`` more tokens of ``seq``, preempting newer sequences while blocks lack."""
        need = seq.num_computed_tokens + n
        while not self.blocks.can_reserve(seq.seq_id, need):
            victim = self.policy.victim(self.running, scheduled)  # seq itself is always a candidate
            self._preempt(victim, out)
            if victim is seq:
                return False
        out.block_copies += self.blocks.reserve(seq.seq_id, need)
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    # ----------------------------------------------------------------------------------------------------
    def _may_admit(self, now: float) -> bool:
        mode = self.config.batching
        if mode == "continuous" or not self.waiting:
            return bool(self.waiting)
        if self.running:  # static and dynamic batches run to completion before anything joins
            return False
        if mode == "static":
            return True
        oldest_wait = now - self.waiting[0].arrival_time
        return len(self.waiting) >= self.config.dynamic_batch_size or oldest_wait >= self.config.dynamic_max_wait_s

    def _num_running_or_promised(self) -> int:
        """Running sequences plus the siblings they will fork once their prompts are cached."""
        running = {s.seq_id for s in self.running}
        return len(self.running) + sum(len(c) for parent, c in self._forks.items() if parent in running)

    def _admission_limit(self) -> int:
        limit = self.config.max_num_seqs
        if self.config.batching == "dynamic":
            limit = min(limit, self.config.dynamic_batch_size)
        return limit

    def _admit_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        chunked = self.config.enable_chunked_prefill
        self.policy.order_waiting(self.waiting, self.blocks)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if self._num_running_or_promised() + 1 + len(self._forks.get(seq.seq_id, ())) > self._admission_limit():
                break
            # Admit only if the whole known sequence fits in the free blocks (prefix hits counted), so that
            # chunks of admitted prompts do not preempt each other in a loop.
            # A prompt whose log-probabilities are asked for is prefilled whole: cached blocks have no logits.
            lookup = not seq.needs_prompt_logits
            if self.blocks.blocks_needed(seq.token_ids if lookup else seq.num_tokens) > self.blocks.num_free_blocks:
                break
            if not chunked and seq.num_tokens > budget:
                break
            seq.num_cached_prompt_tokens = self.blocks.add_sequence(seq.seq_id, seq.token_ids, lookup=lookup)
            self._sync_computed(seq)
            n = min(seq.num_uncomputed_tokens, budget, self.config.chunk_limit if chunked else budget)
            out.block_copies += self.blocks.reserve(seq.seq_id, seq.num_computed_tokens + n)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            self.running.append(seq)
            out.admitted.append(seq)
            out.prefills.append(ScheduledSeq(seq, n))
            budget -= n
