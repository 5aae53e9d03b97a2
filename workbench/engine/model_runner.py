"""Turns the scheduler's decision into one forward pass: flat token ids, positions and paged-cache metadata.

For every scheduled sequence the runner feeds tokens ``num_computed_tokens`` onwards (the rest of a prompt
chunk, the newest token, or the newest token plus speculative drafts, as a chain or a token tree) at their
absolute positions (a tree node's is its depth past the newest token's), maps each to
the cache slot the block manager reserved, and asks for logits only where they are needed: the last row of a
sequence whose tokens are now all computed, or every row of a sequence verifying drafts. It makes no
decisions: what runs was decided by the scheduler, what the logits become is decided by the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from workbench.cache.block_manager import BlockManager
from workbench.cache.grouped_attention import GroupedPagedAttention
from workbench.cache.invariant_attention import BatchInvariantAttention
from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import BatchEntry, PagedBatch, build_paged_batch, tree_entry
from workbench.engine.cuda_graphs import DecodeGraphs
from workbench.engine.scheduler import ScheduledSeq
from workbench.engine.sequence import Sequence
from workbench.metrics.step_ranges import step_range
from workbench.models.llama import LlamaModel
from workbench.models.row_invariant import row_invariant_products
from workbench.spec.drafts import Drafts
from workbench.spec.tree import DraftTree


def take_rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``t[rows]``, as a view when the rows are consecutive (the usual case): indexing by a Python list copies
    the list to the device first, and on CUDA that copy makes the host wait for the device's queue."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return t[rows[0]: rows[0] + len(rows)]
    if t.is_cuda:
        return t[torch.tensor(rows, pin_memory=True).to(t.device, non_blocking=True)]
    return t[rows]


@dataclass(frozen=True, slots=True)
class ForwardItem:
    """One sequence's part of a forward: the scheduler's decision and, for a decode that drafted, its drafts."""

    scheduled: ScheduledSeq
    drafts: Drafts | None = None

    @property
    def seq(self) -> Sequence:
        return self.scheduled.seq

    @property
    def lookahead(self) -> int:
        return self.scheduled.lookahead

    @property
    def multi_step(self) -> bool:
        return self.scheduled.multi_step

    @property
    def draft_tokens(self) -> list[int]:
        return self.drafts.tokens if self.drafts is not None else []

    @property
    def tree(self) -> DraftTree | None:
        return self.drafts.tree if self.drafts is not None else None

    @property
    def num_fed(self) -> int:
        """Tokens fed: the scheduler's count, or the newest token and its drafts."""
        return self.scheduled.num_new_tokens if self.drafts is None else self.drafts.num_fed


@dataclass(slots=True)
class ItemRows:
    """Where one scheduled sequence sits in a forward's outputs."""

    item: ForwardItem
    first_row: int  # its first row in ``hidden`` / ``features``
    num_fed: int  # rows it fed: a prompt chunk, the newest token, or the newest token and its drafts
    first_logit_row: int  # its first row in ``logits`` (meaningless when num_logit_rows is 0)
    # 0 for a prompt chunk with more to come, 1 for a sequence due its next token, 1 + len(drafts) when verifying
    num_logit_rows: int


@dataclass(slots=True)
class ForwardResult:
    hidden: torch.Tensor  # [num_tokens, hidden]: final hidden states of every fed token
    # What a feature-reading draft gets for every fed token: the tapped layers (`LlamaModel.forward_with_taps`)
    # when the runner has ``taps``, else ``hidden`` itself.
    features: torch.Tensor
    logits: torch.Tensor  # [num_logit_rows, vocab] float32
    items: list[ItemRows]  # one per scheduled sequence, in the order they were passed to ``execute``
    # A multi-step decode (`ModelRunner.execute` with ``ScheduledSeq.multi_step``): [steps, num_seqs] greedy tokens,
    # row i decoded from row i - 1 on the device; ``hidden``, ``features`` and ``logits`` are the last step's.
    step_tokens: torch.Tensor | None = None
    # Sequences that asked for prompt log-probabilities (``Sequence.needs_prompt_logits``): seq_id -> (the position
    # of the first prompt token predicted, [rows, vocab] float32 logits of the fed rows predicting the next ones)
    prompt_logits: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ModelRunner:
    """``taps``: target layers whose residual a draft head reads (`workbench.spec.proposer.Proposer.taps`).
    ``graphs``: captured decode forwards (`workbench.engine.cuda_graphs`, CUDA only) that pure decode batches
    replay instead of launching every kernel; None runs every step eagerly. ``batch_invariant``: every row's
    logits independent of the rest of the batch (`workbench.models.row_invariant`), at a cost in speed."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, blocks: BlockManager, taps: tuple[int, ...] = (),
                 graphs: DecodeGraphs | None = None, batch_invariant: bool = False):
        self.model, self.cache, self.blocks = model, cache, blocks
        self.batch_invariant = batch_invariant
        # Called with every forward's result before the engine uses it (read-only): how a measurement such as
        # `workbench.quality.determinism` sees the logits each request got, without changing the step.
        self.observers: list[Callable[[ForwardResult], None]] = []
        self.device = model.device
        self.taps = tuple(taps)
        self.graphs = graphs

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy the KV of token slots ``src`` into ``dst`` (a verified tree's accepted path into place)."""
        self.cache.copy_slots(src, dst)

    @torch.inference_mode()
    def execute(self, scheduled: list[ForwardItem], block_copies: list[tuple[int, int]] = ()) -> ForwardResult:
        """One forward over the whole mixed batch (the batch builder puts single-token rows first)."""
        with step_range("prepare"):
            self.cache.copy_blocks(list(block_copies))
            entries = []
            for item in scheduled:
                seq, start = item.seq, item.seq.num_computed_tokens
                drafts = item.draft_tokens
                tokens = seq.token_ids[start: start + item.num_fed - len(drafts)] + drafts
                if item.tree is None:
                    entries.append(BatchEntry(seq.seq_id, start, tokens))
                else:  # one node per slot from ``start`` on, at positions start + depth
                    entries.append(tree_entry(seq.seq_id, start, tokens, item.tree.parents))
            steps = _decode_steps(scheduled)
            if steps > 1:
                return self._execute_steps(scheduled, entries, steps)
            # A batch a captured graph can replay stays in pinned host memory: the graph copies it into its own
            # buffers without the host waiting for the device (`workbench.engine.cuda_graphs`).
            graphable = self.graphs is not None and all(entry.is_decode for entry in entries)
            batch = build_paged_batch(self.blocks, entries, self.device, on_host=graphable)
            logit_rows: list[int] = []
            items = []
            for item, entry, row in zip(scheduled, entries, batch.first_rows, strict=True):
                count = len(entry.tokens)
                if item.drafts is not None:  # verifying: the distribution after the newest token and after each draft
                    wanted = range(row, row + count)
                elif entry.start + count == item.seq.num_tokens:  # every known token computed: the next is due
                    wanted = range(row + count - 1, row + count)
                else:
                    wanted = range(0)
                items.append(ItemRows(item, row, count, len(logit_rows), len(wanted)))
                logit_rows += wanted
        with step_range("forward"):
            hidden, tapped, logits = self._forward(batch, entries, logit_rows, graphable)
            result = ForwardResult(hidden, hidden if tapped is None else tapped, logits, items)
            result.prompt_logits = self._prompt_logits(scheduled, entries, batch.first_rows, hidden)
        return self._observed(result)

    def _prompt_logits(self, scheduled: list[ForwardItem], entries: list[BatchEntry], first_rows: list[int],
                       hidden: torch.Tensor) -> dict[int, tuple[int, torch.Tensor]]:
        """For each sequence that asked for prompt log-probabilities, the logits of its fed rows that predict a
        prompt token not reported yet (the row at position p predicts token p + 1), and the first such token's
        position. The same rows a plain prefill computes and drops: the cost is the LM head over them."""
        out = {}
        for item, entry, row in zip(scheduled, entries, first_rows, strict=True):
            seq = item.seq
            if item.drafts is not None or not seq.needs_prompt_logits:
                continue
            first = max(entry.start, len(seq.prompt_logprobs))
            end = min(entry.start + len(entry.tokens), seq.num_prompt_tokens - 1)
            if end > first:
                rows = hidden[row + first - entry.start: row + end - entry.start]
                out[seq.seq_id] = (first + 1, self.model.compute_logits(rows).float())
        return out

    def _observed(self, result: ForwardResult) -> ForwardResult:
        for observe in self.observers:
            observe(result)
        return result

    def _forward(self, batch: PagedBatch, entries: list[BatchEntry], logit_rows: list[int], graphable: bool,
                 input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One forward: a captured graph's replay when one can run the batch, else eager. ``input_ids``: token ids
        already on the device, used instead of the batch's (a multi-step decode's previous tokens)."""
        if graphable and self.graphs.can_run(batch):
            hidden, tapped, all_logits = self.graphs.run(batch, input_ids=input_ids)
            # The graph's outputs are overwritten by its next replay: keep copies.
            hidden, tapped = hidden.clone(), None if tapped is None else tapped.clone()
            logits = take_rows(all_logits, logit_rows) if logit_rows else hidden.new_empty(0, 0)
            return hidden, tapped, logits
        batch = batch.to(self.device)
        ids = batch.input_ids if input_ids is None else input_ids
        if self.cache.layout is not None:  # KV groups (sliding windows): each group's tables and window
            attention = GroupedPagedAttention.for_batch(self.cache, self.blocks, entries, batch.metadata,
                                                        self.model.attention_scale, self.device)
        else:
            backend = BatchInvariantAttention if self.batch_invariant else PagedAttention
            attention = backend(self.cache, batch.metadata, self.model.attention_scale)
        with row_invariant_products() if self.batch_invariant else nullcontext():
            hidden, tapped = self.model.forward_with_taps(ids, batch.positions, attention, self.taps)
            logits = (self.model.compute_logits(take_rows(hidden, logit_rows)) if logit_rows
                      else hidden.new_empty(0, 0))
        return hidden, tapped, logits

    def _execute_steps(self, scheduled: list[ForwardItem], entries: list[BatchEntry], steps: int) -> ForwardResult:
        """``steps`` greedy decode steps back to back: step i feeds the tokens step i - 1 chose, without their
        values ever reaching the host; the caller reads all of them at once (``ForwardResult.step_tokens``).
        Every slot was reserved by the scheduler (``ScheduledSeq.lookahead``)."""
        graphable = self.graphs is not None
        rows = list(range(len(entries)))
        tokens = torch.empty(steps, len(entries), dtype=torch.int64, device=self.device)
        for i in range(steps):
            with step_range("prepare"):
                step_entries = [BatchEntry(e.seq_id, e.start + i, e.tokens) for e in entries]
                batch = build_paged_batch(self.blocks, step_entries, self.device, on_host=graphable)
            with step_range("forward"):
                hidden, tapped, logits = self._forward(batch, step_entries, rows, graphable,
                                                       None if i == 0 else tokens[i - 1])
                tokens[i] = logits.argmax(-1)
        items = [ItemRows(item, row, 1, row, 1) for row, item in enumerate(scheduled)]
        return self._observed(ForwardResult(hidden, hidden if tapped is None else tapped, logits, items, tokens))


def _decode_steps(scheduled: list[ForwardItem]) -> int:
    """Steps to decode back to back: 1 unless every scheduled sequence is a multi-step decode (then as many as the
    one with the fewest reserved slots allows)."""
    if not scheduled or not all(item.multi_step and item.num_fed == 1 for item in scheduled):
        return 1
    return 1 + min(item.lookahead for item in scheduled)
