"""After each forward, everything its results change in the engine's state, in one place.

A step is: schedule, draft, forward, then ``Bookkeeper.commit``. Commit is the only code that advances a
sequence's computed KV (``_mark_computed``), appends generated tokens and gives back unused lookahead slots,
each through the scheduler, which keeps the sequence and the block manager in step (`Scheduler.mark_computed`,
``append_token``, ``release_lookahead``), and lets sequences go (``finish``: the scheduler frees the blocks, the metrics
recorder keeps the timeline, the proposer forgets the sequence; aborts come through here too). For one forward:

1. the KV of every fed token is now in the cache, except drafts, which wait for their verdict;
2. a sequence whose prompt just completed forks its waiting siblings (n > 1), which share its logits row;
3. the next token is sampled wherever one is due, and drafts are verified (greedy, or rejection sampling):
   the newest token and the accepted drafts are now computed; for a token tree, the accepted path's KV is first
   moved into the slots that follow the newest token (its nodes were verified in the tree's slots), and the
   rejected branches' slots are left to be released or overwritten like unused lookahead;
4. tokens are appended and stop conditions checked; slots reserved for drafts that were not used go back;
5. the proposer hears which positions are real now (with their target features, if it reads them).

A sequence that asked for prompt log-probabilities gets them from its prefill chunks' rows as they are computed
(``ForwardResult.prompt_logits``), in order, before its KV advances.

A multi-step decode (``ForwardResult.step_tokens``) commits like a verification whose every token is accepted.

A sequence whose next token cannot be drawn (`workbench.sampling.SamplingError`: its logits hold NaN) finishes
alone with ``FinishReason.ERROR`` (``fail``); every other sequence of the step is committed as if it were not there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.cache.block_manager import BlockManager
from workbench.config import SamplingParams
from workbench.engine.model_runner import ForwardResult, ItemRows, take_rows
from workbench.engine.scheduler import Scheduler
from workbench.engine.sequence import FinishReason, Sequence
from workbench.metrics.recorder import MetricsRecorder
from workbench.metrics.step_ranges import step_range
from workbench.sampling import (
    NAN_LOGITS,
    SamplingError,
    apply_history,
    check_distribution,
    probabilities,
    prompt_logprobs,
    sample_batch,
    token_logprob,
)
from workbench.spec.proposer import Proposer
from workbench.spec.tree_verify import verify_tree_greedy, verify_tree_sampled
from workbench.spec.verify import verify_greedy, verify_sampled


@dataclass(slots=True)
class CommitResult:
    touched: list[str]  # ids of the requests that got tokens or finished, in order, each once
    num_accepted: int  # drafts accepted in this step


class Bookkeeper:
    def __init__(self, scheduler: Scheduler, blocks: BlockManager, metrics: MetricsRecorder, eos_ids: set[int],
                 proposer: Proposer | None, move_kv: Callable[[list[int], list[int]], None] | None = None):
        """``move_kv(src_slots, dst_slots)`` copies KV between cache slots (the runner's; needed for token trees)."""
        self.scheduler, self.blocks, self.metrics = scheduler, blocks, metrics
        self.eos_ids, self.proposer = set(eos_ids), proposer
        self.move_kv = move_kv

    def commit(self, result: ForwardResult, now: float) -> CommitResult:
        if result.step_tokens is not None:
            return self._commit_steps(result, now)
        due: list[tuple[Sequence, int]] = []  # (sequence, its logits row) for every token to sample
        verifying: list[ItemRows] = []
        for rows in result.items:
            seq = rows.item.seq
            if rows.item.drafts is not None:
                verifying.append(rows)
                continue
            if seq.seq_id in result.prompt_logits:
                self._record_prompt_logprobs(seq, *result.prompt_logits[seq.seq_id])
            self._mark_computed(seq, seq.num_computed_tokens + rows.num_fed)
            if rows.num_logit_rows:
                due += [(s, rows.first_logit_row) for s in (seq, *self.scheduler.fork(seq))]
        with step_range("sample"):
            touched = self._sample_due_tokens(due, result.logits, now)
        kept: dict[int, list[int]] = {}  # seq_id -> the verified rows that stand: the newest token, accepted drafts
        with step_range("verify"):
            for rows in verifying:
                verify = self._verify_tree if rows.item.tree is not None else self._verify_drafts
                touched.append(rows.item.seq.request_id)
                try:
                    kept[rows.item.seq.seq_id] = verify(rows, result.logits, now)
                except SamplingError as exc:  # raised before the sequence changed
                    self.fail(rows.item.seq, exc, now)
        for rows in result.items:
            self._release_unused_lookahead(rows.item.seq, rows.item.lookahead)
        self._tell_proposer(result, kept)
        return CommitResult(list(dict.fromkeys(touched)), sum(len(k) - 1 for k in kept.values()))

    def _commit_steps(self, result: ForwardResult, now: float) -> CommitResult:
        """A multi-step decode: each sequence fed its newest token and the first ``steps - 1`` tokens it chose, so
        those have KV now, and all ``steps`` chosen tokens are appended as a verification's are (a stop on the
        way ends it there; the slots after are released like unused lookahead)."""
        with step_range("sample"):
            columns = result.step_tokens.T.tolist()  # the group's one read-back
        touched = []
        for rows, emitted in zip(result.items, columns, strict=True):
            seq = rows.item.seq
            self._append_verified(seq, emitted, seq.num_computed_tokens + len(emitted), now)
            self._release_unused_lookahead(seq, rows.item.lookahead)
            touched.append(seq.request_id)
        return CommitResult(touched, 0)

    def finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        """The one way out for a sequence: stopped, out of length, aborted, or failed."""
        self.scheduler.finish(seq, reason, now)
        self.metrics.record_finished(seq)
        if self.proposer is not None:
            self.proposer.forget(seq.seq_id)

    def fail(self, seq: Sequence, error: SamplingError, now: float) -> None:
        """End one sequence whose next token could not be drawn; its blocks go back to the pool."""
        seq.error = str(error)
        self.finish(seq, FinishReason.ERROR, now)

    # ----------------------------------------------------------------------------------------------------
    def _mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """The only place a sequence's computed KV advances."""
        self.scheduler.mark_computed(seq, num_tokens)

    @staticmethod
    def _record_prompt_logprobs(seq: Sequence, first: int, logits: torch.Tensor) -> None:
        """Prompt tokens ``first``, ``first + 1``, ...: their log-probabilities from the rows before them. Only
        the next missing ones are taken, in order, so a prompt recomputed after a preemption is not counted twice."""
        if first != len(seq.prompt_logprobs) + 1:
            return
        tokens = seq.token_ids[first: first + logits.shape[0]]
        seq.prompt_logprobs += prompt_logprobs(logits, tokens, seq.params.prompt_logprobs)

    def _sample_due_tokens(self, due: list[tuple[Sequence, int]], logits: torch.Tensor, now: float) -> list[str]:
        if not due:
            return []
        seqs = [seq for seq, _ in due]
        rows = take_rows(logits, [row for _, row in due])
        if any(seq.params.reads_history for seq in seqs):
            rows = rows.clone()  # penalties rewrite rows below; a view would rewrite the forward's logits
        # logprobs are read from the raw logits, before the penalties below change them
        raw = [rows[i].clone() if seq.params.logprobs is not None else None for i, seq in enumerate(seqs)]
        for i, seq in enumerate(seqs):
            if seq.params.reads_history:  # penalties, min_tokens
                rows[i] = apply_history(rows[i], seq.params, seq.token_ids, seq.num_prompt_tokens,
                                        seq.params.stop_ids(self.eos_ids))
        tokens = sample_batch(rows, [s.params for s in seqs], [s.generator for s in seqs])
        for seq, token, raw_row in zip(seqs, tokens, raw, strict=True):
            if isinstance(token, SamplingError):
                self.fail(seq, token, now)
                continue
            if raw_row is not None:
                seq.logprobs.append(token_logprob(raw_row, token, seq.params.logprobs))
            self._append(seq, token, now)
        return [seq.request_id for seq in seqs]

    def _verify_drafts(self, rows: ItemRows, logits: torch.Tensor, now: float) -> list[int]:
        """Accept a prefix of the drafts, append it and the target's own next token; returns the rows kept."""
        drafts, seq = rows.item.drafts, rows.item.seq
        logits = logits[rows.first_logit_row: rows.first_logit_row + rows.num_logit_rows]
        if seq.params.greedy:
            accepted, emitted = verify_greedy(drafts.tokens, _usable(logits))
        else:
            accepted, emitted = verify_sampled(drafts.tokens, drafts.probs, _distributions(logits, seq.params),
                                               seq.generator)
        seq.spec.record(len(drafts.tokens), accepted, len(emitted))
        computed = seq.num_computed_tokens + 1 + accepted  # the newest token and the accepted drafts have KV
        self._append_verified(seq, emitted, computed, now)
        return list(range(1 + accepted))

    def _verify_tree(self, rows: ItemRows, logits: torch.Tensor, now: float) -> list[int]:
        """Keep one root-to-node path of the tree, move its KV behind the newest token, append its tokens and the
        target's own next one; returns the rows kept (tree nodes: the root, then the path)."""
        tree, seq = rows.item.tree, rows.item.seq
        logits = logits[rows.first_logit_row: rows.first_logit_row + rows.num_logit_rows]
        if seq.params.greedy:
            verdict = verify_tree_greedy(tree, _usable(logits))
        else:
            verdict = verify_tree_sampled(tree, _distributions(logits, seq.params), seq.generator)
        paths = tree.rank_paths()
        seq.spec.record_tree(paths, list(paths[verdict.path[-1] - 1]) if verdict.path else [], verdict.tested_last,
                             len(verdict.emitted))
        start = seq.num_computed_tokens  # the root's position: node i was verified in the slot of start + i
        moved = [(node, start + 1 + depth) for depth, node in enumerate(verdict.path) if node != 1 + depth]
        if moved:
            self.move_kv([self.blocks.slot(seq.seq_id, start + node) for node, _ in moved],
                         [self.blocks.slot(seq.seq_id, position) for _, position in moved])
        self._append_verified(seq, verdict.emitted, start + 1 + verdict.accepted, now)
        return [0, *verdict.path]

    def _append_verified(self, seq: Sequence, emitted: list[int], computed: int, now: float) -> None:
        """Append a verification's tokens; unless one stops the sequence, the first ``computed`` have KV."""
        for token in emitted:
            if self._append(seq, token, now):
                return
        self._mark_computed(seq, computed)

    def _append(self, seq: Sequence, token: int, now: float) -> bool:
        """Append one generated token; finish the sequence if it hit a stop condition (returns True then)."""
        self.scheduler.append_token(seq, token, now)
        stop_ids = seq.params.stop_ids(self.eos_ids)
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
            self.scheduler.release_lookahead(seq)

    def _tell_proposer(self, result: ForwardResult, kept: dict[int, list[int]]) -> None:
        """Which positions are real now (and, if the proposer reads them, their target features)."""
        if self.proposer is None:
            return
        for rows in result.items:
            seq = rows.item.seq
            if seq.is_finished:
                continue
            valid = len(kept[seq.seq_id]) if rows.item.drafts is not None else rows.num_fed
            computed = seq.num_computed_tokens
            if self.proposer.needs_target_features:
                if rows.item.tree is None:
                    features = result.features[rows.first_row: rows.first_row + valid]
                else:  # the kept nodes' rows, wherever the tree put them
                    features = result.features[[rows.first_row + node for node in kept[seq.seq_id]]]
                self.proposer.observe(seq, computed - valid, features)
            self.proposer.rollback(seq, computed)


def _usable(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` ([rows, vocab]) unless they hold NaN (then ``SamplingError``: no token can be chosen)."""
    if bool(torch.isnan(logits).any()):
        raise SamplingError(NAN_LOGITS)
    return logits


def _distributions(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target distributions a verification draws from, checked (``SamplingError`` for an unusable row)."""
    probs = probabilities(_usable(logits), params)
    check_distribution(probs)
    return probs
