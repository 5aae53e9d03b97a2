"""Turns the scheduler's decision into one forward pass: flat token ids, positions and paged-cache metadata.

For every scheduled sequence the runner feeds tokens ``num_computed_tokens`` onwards (the rest of a prompt
chunk, the newest token, or the newest token plus speculative drafts) at their absolute positions, maps each to
the cache slot the block manager reserved, and asks for logits only where they are needed: the last row of a
sequence whose tokens are now all computed, or every row of a sequence verifying drafts. It makes no
decisions: what runs was decided by the scheduler, what the logits become is decided by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.block_manager import BlockManager
from workbench.cache.paged import PagedKVCache
from workbench.engine.paged_attention import PagedAttention, PagedBatchMetadata
from workbench.engine.scheduler import ScheduledSeq
from workbench.models.llama import LlamaModel


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a flat batch: ``tokens`` at positions ``start..`` of sequence ``seq_id``."""

    seq_id: int
    start: int
    tokens: list[int]


def build_metadata(blocks: BlockManager, entries: list[BatchEntry], num_single_token: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, PagedBatchMetadata]:
    """Flat ids, positions and paged metadata for ``entries`` (the first ``num_single_token`` bring 1 token)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    context_lens: list[int] = []
    starts = [0]
    tables: list[list[int]] = []
    for entry in entries:
        end = entry.start + len(entry.tokens)
        ids += entry.tokens
        positions += range(entry.start, end)
        slots += blocks.slots(entry.seq_id, entry.start, end)
        context_lens.append(end)
        starts.append(starts[-1] + len(entry.tokens))
        tables.append(blocks.block_table(entry.seq_id))
    table = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)

    def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    meta = PagedBatchMetadata(slot_mapping=tensor(slots, torch.int64), block_tables=table.to(device),
                              context_lens=tensor(context_lens, torch.int32),
                              query_start_loc=tensor(starts, torch.int32), num_decode_seqs=num_single_token)
    return tensor(ids, torch.int64), tensor(positions, torch.int64), meta


@dataclass(slots=True)
class ForwardResult:
    hidden: torch.Tensor  # [num_tokens, hidden]: final hidden states of every fed token
    # What a feature-reading draft gets for every fed token: the tapped layers (`LlamaModel.forward_with_taps`)
    # when the runner has ``taps``, else ``hidden`` itself.
    features: torch.Tensor
    logits: torch.Tensor  # [num_logit_rows, vocab] float32
    # (item, first row in hidden, first row in logits, number of logit rows) for items that get logits:
    # 1 row for a sequence due a next token, 1 + len(drafts) rows for one verifying drafts.
    outputs: list[tuple[ScheduledSeq, int, int, int]]
    # (item, first row in hidden) for every item, in batch order.
    rows: list[tuple[ScheduledSeq, int]]


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, blocks: BlockManager):
        self.model, self.cache, self.blocks = model, cache, blocks
        self.device = model.device
        self.taps: tuple[int, ...] = ()  # layers whose residual a draft head reads (set by the engine)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], num_single_token: int,
                block_copies: list[tuple[int, int]] = ()) -> ForwardResult:
        """One forward over the whole mixed batch (single-token decodes first, as ``scheduled`` is ordered)."""
        self.cache.copy_blocks(list(block_copies))
        entries, logit_rows, outputs, rows = [], [], [], []
        row = 0
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            tokens = seq.token_ids[start: start + item.num_new_tokens - len(item.drafts)] + item.drafts
            entries.append(BatchEntry(seq.seq_id, start, tokens))
            rows.append((item, row))
            if item.drafts:  # verification: the distribution after the newest token and after every draft
                outputs.append((item, row, len(logit_rows), len(tokens)))
                logit_rows += range(row, row + len(tokens))
            elif start + len(tokens) == seq.num_tokens:
                outputs.append((item, row + len(tokens) - 1, len(logit_rows), 1))
                logit_rows.append(row + len(tokens) - 1)
            row += len(tokens)
        ids, positions, meta = build_metadata(self.blocks, entries, num_single_token, self.device)
        attention = PagedAttention(self.cache, meta, self.model.attention_scale)
        hidden, tapped = self.model.forward_with_taps(ids, positions, attention, self.taps)
        logits = self.model.compute_logits(hidden[logit_rows]) if logit_rows else hidden.new_empty(0, 0)
        return ForwardResult(hidden, hidden if tapped is None else tapped, logits, outputs, rows)
