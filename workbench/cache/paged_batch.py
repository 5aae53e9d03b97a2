"""One flat batch over the paged KV cache: which tokens go in, in which row order, and where their KV lives.

Both forwards that read the paged cache build their batch here: the engine's model runner (target model) and
the speculative draft proposer (draft model, over the same block tables). Each caller lists what every sequence
feeds (``BatchEntry``: tokens at positions ``start..``) in its own order; ``build_paged_batch`` puts the
single-token entries first, because the attention backend runs the decode kernel over that leading group and
the prefill kernel over the rest, and reports where each entry's rows landed so the caller never has to know.
The block manager answers the slots and block tables; nothing here decides what runs.

A speculative token tree is one entry too (`tree_entry`): its nodes, flattened parents first, take consecutive
slots from ``start`` but sit at positions ``start + depth``, and each sees the keys before the tree and its own
ancestors only. Such an entry carries its ``positions`` and a ``visible`` matrix over its context's last keys;
the batch turns those into the prefill kernel's ``tree_mask`` and never sends the entry down the decode path
(which cannot mask), even when it has a single token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.cache.block_manager import BlockManager


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a flat batch: ``tokens`` into the slots of positions ``start..`` of ``seq_id``.

    ``positions``: the rotary positions of the tokens when they are not ``start..`` (a tree's ``start + depth``).
    ``visible``: per token, which of the context's last ``len(visible[0])`` keys it may see (the keys before
    those are not restricted, causality always applies); None for an ordinary causal chunk."""

    seq_id: int
    start: int
    tokens: list[int]
    positions: list[int] | None = None
    visible: list[list[bool]] | None = None

    @property
    def is_decode(self) -> bool:
        """One unrestricted token: the decode kernel's kind of row."""
        return len(self.tokens) == 1 and self.visible is None


def tree_entry(seq_id: int, start: int, tokens: list[int], parents: list[int]) -> BatchEntry:
    """A token tree as a batch entry: node ``i`` (``parents[i] < i``, -1 for the root, which is node 0) goes into
    the slot of position ``start + i`` and sits at position ``start + depth(i)``; it sees the keys before
    ``start`` and its ancestors."""
    if len(parents) != len(tokens) or not tokens or parents[0] != -1:
        raise ValueError(f"a tree needs one parent per token and a root (parent -1) first, got {parents}")
    depths, visible = [], []
    for i, parent in enumerate(parents):
        if i and not 0 <= parent < i:
            raise ValueError(f"node {i}'s parent must come before it (0 <= parent < {i}), got {parent}")
        row = list(visible[parent]) if i else [False] * len(tokens)
        row[i] = True
        visible.append(row)
        depths.append(depths[parent] + 1 if i else 0)
    return BatchEntry(seq_id, start, tokens, [start + d for d in depths], visible)


@dataclass(slots=True)
class PagedBatchMetadata:
    """Where each token of the flat batch lives. Tensors are on the model's device.

    Sequences ``0 .. num_decode_seqs-1`` bring exactly one query token each and come first."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot receiving each new token's K/V
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor  # [num_seqs] int32: keys each sequence attends to, new tokens included
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    num_decode_seqs: int
    # [prefill rows, W] bool: which of each sequence's last W keys a prefill row sees (token trees); None: causal
    tree_mask: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]


@dataclass(slots=True)
class PagedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64, in batch order
    positions: torch.Tensor  # [num_tokens] int64
    metadata: PagedBatchMetadata
    first_rows: list[int]  # first row of each entry, indexed like the caller's entries

    def to(self, device: torch.device) -> PagedBatch:
        """The same batch on ``device`` (copies from pinned host memory do not wait for the device)."""
        if self.input_ids.device == device:
            return self
        meta = self.metadata

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        moved = PagedBatchMetadata(move(meta.slot_mapping), move(meta.block_tables), move(meta.context_lens),
                                   move(meta.query_start_loc), meta.num_decode_seqs, move(meta.tree_mask))
        return PagedBatch(move(self.input_ids), move(self.positions), moved, self.first_rows)


def decodes_first(entries: list[BatchEntry]) -> list[int]:
    """Indices of ``entries`` in batch order: decode entries first, each group in the caller's order."""
    return sorted(range(len(entries)), key=lambda i: not entries[i].is_decode)


def build_paged_batch(blocks: BlockManager, entries: list[BatchEntry], device: torch.device, *,
                      on_host: bool = False) -> PagedBatch:
    """Flat ids, positions and paged metadata for ``entries`` (every position's slot already reserved).

    ``on_host``: leave the tensors in host memory (pinned where CUDA is present), for a caller that copies them
    into buffers of its own without waiting for the device (`workbench.engine.cuda_graphs`); ``PagedBatch.to``
    moves them later if needed. Otherwise they are built on ``device``: from pinned memory on CUDA, so building
    a batch never makes the host wait for the device's queue (a pageable host-to-device copy does)."""
    device = torch.device(device)
    pinned = (on_host or device.type == "cuda") and torch.cuda.is_available()
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
        positions += range(entry.start, end) if entry.positions is None else entry.positions
        slots += blocks.slots(entry.seq_id, entry.start, end)
        context_lens.append(end)
        starts.append(starts[-1] + len(entry.tokens))
        tables.append(blocks.block_table(entry.seq_id))
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, pin_memory=pinned)
    target = torch.device("cpu") if on_host else device

    def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(target, non_blocking=True)

    num_single = sum(entry.is_decode for entry in entries)
    meta = PagedBatchMetadata(slot_mapping=tensor(slots, torch.int64), block_tables=table.to(target, non_blocking=True),
                              context_lens=tensor(context_lens, torch.int32),
                              query_start_loc=tensor(starts, torch.int32), num_decode_seqs=num_single,
                              tree_mask=_tree_mask([entries[i] for i in order[num_single:]], target))
    return PagedBatch(tensor(ids, torch.int64), tensor(positions, torch.int64), meta, first_rows)


def _tree_mask(prefill: list[BatchEntry], device: torch.device) -> torch.Tensor | None:
    """The prefill kernel's ``tree_mask`` over the prefill rows, None when no entry restricts its keys: each
    entry's ``visible`` rows right-aligned (the columns stand for the last keys), everything else True."""
    width = max((len(e.visible[0]) for e in prefill if e.visible is not None), default=0)
    if not width:
        return None
    mask = torch.ones(sum(len(e.tokens) for e in prefill), width, dtype=torch.bool)
    row = 0
    for entry in prefill:
        if entry.visible is not None:
            if len(entry.visible) != len(entry.tokens):
                raise ValueError(f"seq {entry.seq_id}: {len(entry.visible)} visibility rows for {len(entry.tokens)} "
                                 "tokens")
            mask[row: row + len(entry.tokens), width - len(entry.visible[0]):] = torch.tensor(entry.visible)
        row += len(entry.tokens)
    return mask.to(device)
