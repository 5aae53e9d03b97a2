"""One flat batch over the paged KV cache: which tokens go in, in which row order, and where their KV lives.

Both forwards that read the paged cache build their batch here: the engine's model runner (target model) and
the speculative draft proposer (draft model, over the same block tables). Each caller lists what every sequence
feeds (``BatchEntry``: tokens at positions ``start..``) in its own order; ``build_paged_batch`` puts the
single-token entries first, because the attention backend runs the decode kernel over that leading group and
the prefill kernel over the rest, and reports where each entry's rows landed so the caller never has to know.
The block manager answers the slots and block tables; nothing here decides what runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.block_manager import BlockManager


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a flat batch: ``tokens`` at positions ``start..`` of sequence ``seq_id``."""

    seq_id: int
    start: int
    tokens: list[int]


@dataclass(slots=True)
class PagedBatchMetadata:
    """Where each token of the flat batch lives. Tensors are on the model's device.

    Sequences ``0 .. num_decode_seqs-1`` bring exactly one query token each and come first."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot receiving each new token's K/V
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor  # [num_seqs] int32: keys each sequence attends to, new tokens included
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    num_decode_seqs: int

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]


@dataclass(slots=True)
class PagedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64, in batch order
    positions: torch.Tensor  # [num_tokens] int64
    metadata: PagedBatchMetadata
    first_rows: list[int]  # first row of each entry, indexed like the caller's entries


def decodes_first(entries: list[BatchEntry]) -> list[int]:
    """Indices of ``entries`` in batch order: single-token entries first, each group in the caller's order."""
    return sorted(range(len(entries)), key=lambda i: len(entries[i].tokens) != 1)


def build_paged_batch(blocks: BlockManager, entries: list[BatchEntry], device: torch.device) -> PagedBatch:
    """Flat ids, positions and paged metadata for ``entries`` (every position's slot already reserved)."""
    order = decodes_first(entries)
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    context_lens: list[int] = []
    starts = [0]
    tables: list[list[int]] = []
    first_rows = [0] * len(entries)
    for index in order:
        entry = entries[index]
        end = entry.start + len(entry.tokens)
        first_rows[index] = starts[-1]
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

    num_single = sum(len(entry.tokens) == 1 for entry in entries)
    meta = PagedBatchMetadata(slot_mapping=tensor(slots, torch.int64), block_tables=table.to(device),
                              context_lens=tensor(context_lens, torch.int32),
                              query_start_loc=tensor(starts, torch.int32), num_decode_seqs=num_single)
    return PagedBatch(tensor(ids, torch.int64), tensor(positions, torch.int64), meta, first_rows)
