"""Turns the scheduler's decision into one forward pass: flat token ids, positions and paged-cache metadata.

For every scheduled sequence the runner feeds tokens ``num_computed_tokens .. +num_new_tokens`` at their
absolute positions, maps each to the cache slot the block manager reserved, and asks for logits only where a
next token is due (the last row of a sequence whose tokens are now all computed). It makes no decisions:
what runs was decided by the scheduler, what the logits become is decided by the engine's sampler.
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
class ForwardResult:
    logits: torch.Tensor  # [len(sampled), vocab] float32
    sampled: list[ScheduledSeq]  # the sequences whose next token is due, in logits row order


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, blocks: BlockManager):
        self.model, self.cache, self.blocks = model, cache, blocks
        self.device = model.device

    def build(self, scheduled: list[ScheduledSeq], num_decode_seqs: int,
              ) -> tuple[torch.Tensor, torch.Tensor, PagedBatchMetadata, list[int], list[ScheduledSeq]]:
        """Flat inputs and metadata for ``scheduled`` (decodes first); also the rows that need logits."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        starts = [0]
        tables: list[list[int]] = []
        logit_rows: list[int] = []
        sampled: list[ScheduledSeq] = []
        for item in scheduled:
            seq, n = item.seq, item.num_new_tokens
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += self.blocks.slots(seq.seq_id, start, end)
            context_lens.append(end)
            starts.append(starts[-1] + n)
            tables.append(self.blocks.block_table(seq.seq_id))
            if end == seq.num_tokens:
                logit_rows.append(starts[-1] - 1)
                sampled.append(item)
        width = max(len(t) for t in tables)
        table = torch.zeros(len(tables), width, dtype=torch.int32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)

        def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = PagedBatchMetadata(
            slot_mapping=tensor(slots, torch.int64),
            block_tables=table.to(self.device),
            context_lens=tensor(context_lens, torch.int32),
            query_start_loc=tensor(starts, torch.int32),
            num_decode_seqs=num_decode_seqs,
        )
        return tensor(ids, torch.int64), tensor(positions, torch.int64), meta, logit_rows, sampled

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], num_decode_seqs: int,
                block_copies: list[tuple[int, int]] = ()) -> ForwardResult:
        """One forward over the whole mixed batch; logits for the sequences whose next token is due."""
        self.cache.copy_blocks(list(block_copies))
        ids, positions, meta, rows, sampled = self.build(scheduled, num_decode_seqs)
        attention = PagedAttention(self.cache, meta, self.model.attention_scale)
        hidden = self.model(ids, positions, attention)
        logits = self.model.compute_logits(hidden[rows]) if rows else hidden.new_empty(0, 0)
        return ForwardResult(logits, sampled)
