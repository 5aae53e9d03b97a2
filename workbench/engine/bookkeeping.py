"""After each forward, everything its results change in the engine's state, in one place.

A step is: schedule, draft, forward, then ``Bookkeeper.commit``. Commit is the only code that advances a
sequence's computed KV (``_mark_computed``: the block manager owns that count), appends generated tokens
(``Sequence.append_token``), and lets sequences go (``finish``: the scheduler frees the blocks, the metrics
recorder keeps the timeline, the proposer forgets the sequence; aborts come through here too). For one forward:

1. the KV of every fed token is now in the cache, except drafts, which wait for their verdict;
2. a sequence whose prompt just completed forks its waiting siblings (n > 1), which share its logits row;
3. the next token is sampled wherever one is due, and drafts are verified (greedy, or rejection sampling):
   the newest token and the accepted drafts are now computed;
4. tokens are appended and stop conditions checked; slots reserved for drafts that were not used go back;
5. the proposer hears which positions are real now (with their target features, if it reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.block_manager import BlockManager
from workbench.engine.model_runner import ForwardResult, ItemRows
from workbench.engine.scheduler import Scheduler
from workbench.engine.sequence import FinishReason, Sequence
from workbench.metrics.recorder import MetricsRecorder
from workbench.metrics.step_ranges import step_range
from workbench.sampling import probabilities, sample_batch
from workbench.spec.proposer import Proposer
from workbench.spec.verify import verify_greedy, verify_sampled


@dataclass(slots=True)
class CommitResult:
    touched: list[str]  # ids of the requests that got tokens or finished, in order, each once
    num_accepted: int  # drafts accepted in this step


class Bookkeeper:
    def __init__(self, scheduler: Scheduler, blocks: BlockManager, metrics: MetricsRecorder, eos_ids: set[int],
                 proposer: Proposer | None):
        self.scheduler, self.blocks, self.metrics = scheduler, blocks, metrics
        self.eos_ids, self.proposer = set(eos_ids), proposer

    def commit(self, result: ForwardResult, now: float) -> CommitResult:
        due: list[tuple[Sequence, int]] = []  # (sequence, its logits row) for every token to sample
        verifying: list[ItemRows] = []
        for rows in result.items:
            seq = rows.item.seq
            if rows.item.drafts:
                verifying.append(rows)
                continue
            self._mark_computed(seq, seq.num_computed_tokens + rows.num_fed)
            if rows.num_logit_rows:
                due += [(s, rows.first_logit_row) for s in (seq, *self.scheduler.fork(seq))]
        with step_range("sample"):
            touched = self._sample_due_tokens(due, result.logits, now)
        accepted: dict[int, int] = {}
        with step_range("verify"):
            for rows in verifying:
                accepted[rows.item.seq.seq_id] = self._verify_drafts(rows, result.logits, now)
                touched.append(rows.item.seq.request_id)
        for rows in result.items:
            self._release_unused_lookahead(rows.item.seq, rows.item.lookahead)
        self._tell_proposer(result, accepted)
        return CommitResult(list(dict.fromkeys(touched)), sum(accepted.values()))

    def finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        """The one way out for a sequence: stopped, out of length, or aborted."""
        self.scheduler.finish(seq, reason, now)
        self.metrics.record_finished(seq)
        if self.proposer is not None:
            self.proposer.forget(seq.seq_id)

    # ----------------------------------------------------------------------------------------------------
    def _mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """The only place a sequence's computed KV advances."""
        self.blocks.mark_computed(seq.seq_id, num_tokens)

    def _sample_due_tokens(self, due: list[tuple[Sequence, int]], logits: torch.Tensor, now: float) -> list[str]:
        if not due:
            return []
        seqs = [seq for seq, _ in due]
        tokens = sample_batch(logits[[row for _, row in due]], [s.params for s in seqs], [s.generator for s in seqs])
        for seq, token in zip(seqs, tokens, strict=True):
            self._append(seq, token, now)
        return [seq.request_id for seq in seqs]

    def _verify_drafts(self, rows: ItemRows, logits: torch.Tensor, now: float) -> int:
        """Accept a prefix of the drafts, append it and the target's own next token; returns the accepted count."""
        item, seq = rows.item, rows.item.seq
        logits = logits[rows.first_logit_row: rows.first_logit_row + rows.num_logit_rows]
        if seq.params.greedy:
            accepted, emitted = verify_greedy(item.drafts, logits)
        else:
            accepted, emitted = verify_sampled(item.drafts, item.draft_probs, probabilities(logits, seq.params),
                                               seq.generator)
        seq.spec.record(len(item.drafts), accepted, len(emitted))
        computed = seq.num_computed_tokens + 1 + accepted  # the newest token and the accepted drafts have KV
        for token in emitted:
            if self._append(seq, token, now):
                return accepted
        self._mark_computed(seq, computed)
        return accepted

    def _append(self, seq: Sequence, token: int, now: float) -> bool:
        """Append one generated token; finish the sequence if it hit a stop condition (returns True then)."""
        seq.append_token(token, now)
        stop_ids = set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else self.eos_ids)
        stopped_on_text = seq.detokenizer is not None and seq.detokenizer.stopped_on is not None
        if token in stop_ids or stopped_on_text:
            reason = FinishReason.STOP
        elif seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= seq.max_total_tokens:
            reason = FinishReason.LENGTH
        else:
            return False
        self.finish(seq, reason, now)
        return True

    def _release_unused_lookahead(self, seq: Sequence, lookahead: int) -> None:
        """Slots reserved beyond the known tokens for drafts that were rejected or never proposed."""
        if lookahead and not seq.is_finished:
            self.blocks.truncate(seq.seq_id, seq.num_tokens)

    def _tell_proposer(self, result: ForwardResult, accepted: dict[int, int]) -> None:
        """Which positions are real now (and, if the proposer reads them, their target features)."""
        if self.proposer is None:
            return
        for rows in result.items:
            seq = rows.item.seq
            if seq.is_finished:
                continue
            valid = 1 + accepted[seq.seq_id] if rows.item.drafts else rows.num_fed
            computed = seq.num_computed_tokens
            if self.proposer.needs_target_features:
                self.proposer.observe(seq, computed - valid, result.features[rows.first_row: rows.first_row + valid])
            self.proposer.rollback(seq, computed)
