"""Drafting with a model: a small causal model, or an EAGLE-style head fed the target's hidden states.

The draft keeps its own paged KV cache but borrows the target's block tables: the draft's KV for position j
lives in the same slot as the target's, in the draft's own tensors. So the block manager's reservations,
rollbacks and frees serve both, and speculative tokens need no extra bookkeeping beyond "how many positions of
this sequence hold valid draft KV".

A step drafts k tokens in k batched forwards: the first catches the draft up on every real token it has not
seen (and yields draft 1), each further one feeds the previous draft. For an EAGLE head (``needs_target_features``)
the input at position j is the target's feature at j with the token at j + 1, so catching up needs the features
the engine hands over after each target forward (``observe``), and drafts beyond the first run on the head's
own predicted features.

A token tree (``propose_tree``) is drafted depth by depth the same way: after the catch-up, each forward reads
the frontier the `workbench.spec.tree_draft.TreeBuilder` chose (one node per row, at position ``depth`` past the
root's, fed its parent's predicted feature for a head), written into the draft's scratch slots after the
newest token in the order they are read, and seeing only the prefix and its own ancestors (the same tree mask
the target's verification uses). Only the real positions stay valid after a tree: the accepted path is fed
again by the next catch-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.cache.block_manager import BlockManager
from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import BatchEntry, build_paged_batch
from workbench.intmath import ceil_div
from workbench.sampling import probabilities
from workbench.spec.sequence_view import DraftingSequence
from workbench.spec.tree import DraftTree
from workbench.spec.tree_draft import TreeBuilder, TreeShape


class DraftProposer:
    def __init__(self, draft: torch.nn.Module, blocks: BlockManager, *, dtype: torch.dtype, device: torch.device):
        self.draft, self.blocks, self.device = draft, blocks, device
        self.cache = PagedKVCache(draft.spec, blocks.num_blocks, blocks.block_size, dtype=dtype, device=device)
        self.needs_target_features = bool(getattr(draft, "needs_target_features", False))
        self.taps: tuple[int, ...] = tuple(getattr(draft, "taps", ()))
        self._valid: dict[int, int] = {}  # positions of each sequence whose draft KV is valid
        self._tables: dict[int, list[int]] = {}  # block table when that KV was written
        self._features: dict[int, tuple[int, torch.Tensor]] = {}  # first position, target features from there

    # --------------------------------------------------------------------------------------- engine hooks
    @torch.inference_mode()
    def observe(self, seq: DraftingSequence, start: int, hidden: torch.Tensor) -> None:
        """Keep the target's features of positions start.. (those not yet fed to the head, and the rest of the
        block holding the first of them), already fused into the head's input width when it reads several layers.

        The rest of that block is kept because `_checked_valid` may send the head back to its start: when the
        block just filled turns out to hold what a cached block holds, the block manager swaps the table entry
        to the cached block, and the head must then catch up from the block's start (without those features it
        could not draft again for the rest of the sequence: a repeated prompt stopped drafting after ~30 tokens)."""
        hidden = self.draft.fuse_features(hidden)
        first, feats = self._features.get(seq.seq_id, (start, hidden[:0]))
        if first + len(feats) != start:  # a gap (e.g. after a preemption): restart the buffer here
            first, feats = start, hidden[:0]
        feats = torch.cat([feats, hidden])
        valid = self._valid.get(seq.seq_id, 0)
        keep_from = max(valid - valid % self.cache.block_size, first) - first
        self._features[seq.seq_id] = (first + keep_from, feats[keep_from:].clone())

    def rollback(self, seq: DraftingSequence, num_valid: int) -> None:
        if seq.seq_id in self._valid:
            self._valid[seq.seq_id] = min(self._valid[seq.seq_id], num_valid)

    def forget(self, seq_id: int) -> None:
        for store in (self._valid, self._tables, self._features):
            store.pop(seq_id, None)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.cache.copy_blocks(pairs)

    # ---------------------------------------------------------------------------------------- proposing
    @torch.inference_mode()
    def propose(self, items: list[tuple[DraftingSequence, int]]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Up to k drafts per (sequence, k), and the distributions they were drawn from (None when greedy)."""
        chains = [_Chain(seq, k, self._catch_up_plan(seq)) for seq, k in items]
        live = [chain for chain in chains if chain.plan is not None]  # row n of ``state`` is live[n]'s
        if live:
            entries = [chain.plan[0] for chain in live]
            hidden = self._forward(entries, [c.plan[1] for c in live] if self.needs_target_features else None)
            ends = torch.tensor([len(e.tokens) for e in entries]).cumsum(0) - 1
            state = hidden[ends.to(self.device)]  # each live chain's newest draft hidden state
        while live:
            self._sample_into(state, live)
            keep = [n for n, chain in enumerate(live) if not chain.done]
            if not keep:
                break
            state, live = state[keep], [live[n] for n in keep]
            entries = [BatchEntry(c.seq.seq_id, self._next_position(c.seq, len(c.tokens)), [c.tokens[-1]])
                       for c in live]
            state = self._forward(entries, list(state[:, None]) if self.needs_target_features else None)
        for chain in chains:
            if chain.plan is not None:
                self._after_propose(chain.seq, chain.k)
        return [chain.result() for chain in chains]

    @torch.inference_mode()
    def propose_tree(self, items: list[tuple[DraftingSequence, int, int]], shape: TreeShape) -> list[DraftTree | None]:
        """For each (sequence, slots, depth): a tree of ``shape`` within ``slots`` drafted nodes and ``depth``
        levels, or None when the draft cannot propose for it yet."""
        plans = [self._catch_up_plan(seq) for seq, _, _ in items]
        live = [i for i, plan in enumerate(plans) if plan is not None and items[i][1] > 0 and items[i][2] > 0]
        builders: dict[int, TreeBuilder] = {}
        states: dict[int, dict[int, torch.Tensor]] = {}  # item -> builder node -> the draft's state after it
        if live:
            entries = [plans[i][0] for i in live]
            hidden = self._forward(entries, [plans[i][1] for i in live] if self.needs_target_features else None)
            ends = torch.tensor([len(e.tokens) for e in entries]).cumsum(0) - 1
            roots = hidden[ends.to(self.device)]
            logits = self.draft.compute_logits(roots)
            for n, i in enumerate(live):
                seq, slots, depth = items[i]
                builders[i] = TreeBuilder(shape, seq.token_ids[-1], max_nodes=slots, max_depth=depth,
                                          params=seq.params, generator=seq.generator)
                builders[i].add_children([0], logits[n: n + 1])
                states[i] = {0: roots[n]}
        while builders:
            frontiers = {i: b.next_frontier() for i, b in builders.items()}
            reading = [i for i, f in frontiers.items() if f]
            if not reading:
                break
            entries = [self._frontier_entry(items[i][0], builders[i], frontiers[i]) for i in reading]
            feats = [torch.stack([states[i][builders[i].nodes[v].parent] for v in frontiers[i]]) for i in reading]
            hidden = self._forward(entries, feats if self.needs_target_features else None)
            logits = self.draft.compute_logits(hidden)
            row = 0
            for i in reading:
                count = len(frontiers[i])
                builders[i].add_children(frontiers[i], logits[row: row + count])
                states[i].update(zip(frontiers[i], hidden[row: row + count], strict=True))
                row += count
        for i in builders:
            self._after_propose(items[i][0], 0, tree=True)
        return [builders[i].tree() if i in builders else None for i in range(len(items))]

    def _frontier_entry(self, seq: DraftingSequence, builder: TreeBuilder, frontier: list[int]) -> BatchEntry:
        """The draft's batch entry for a tree frontier: scratch slots after the root's position, positions by
        depth, each row seeing the scratch nodes among its ancestors (and everything before them)."""
        base = len(seq.token_ids) - 1 - int(self.needs_target_features)  # the position the root's state came from
        width = builder.num_read
        visible = []
        for node in frontier:
            row = [False] * width
            for index in builder.read_ancestors(node):
                row[index - 1] = True
            visible.append(row)
        first = builder.nodes[frontier[0]].scratch
        return BatchEntry(seq.seq_id, base + first, [builder.nodes[v].token for v in frontier],
                          [base + builder.nodes[v].depth for v in frontier], visible)

    def _catch_up_plan(self, seq: DraftingSequence) -> tuple[BatchEntry, torch.Tensor | None] | None:
        """The draft's first forward for ``seq``: every real position it lacks (None if it cannot draft)."""
        tokens, seq_id = seq.token_ids, seq.seq_id
        valid = self._checked_valid(seq)
        if not self.needs_target_features:
            return BatchEntry(seq_id, valid, tokens[valid:]), None
        first, feats = self._features.get(seq_id, (0, None))
        end = len(tokens) - 1  # the head's position j pairs feature j with token j + 1
        if feats is None or first > valid or first + len(feats) < end or valid >= end:
            return None
        return BatchEntry(seq_id, valid, tokens[valid + 1: end + 1]), feats[valid - first: end - first]

    def _checked_valid(self, seq: DraftingSequence) -> int:
        """Valid positions, cut back to the first block whose id changed since the KV was written.

        A sequence the draft has not seen yet starts after its prefix-cache hit: those blocks are shared with
        the sequence that computed them, whose draft wrote its KV into them then. (For a head, the last cached
        position's KV paired its feature with that sequence's next token, which may differ: a slightly worse
        draft at worst, never a wrong output, since the target verifies every token.)"""
        seq_id = seq.seq_id
        if seq_id not in self._valid:
            self._valid[seq_id] = seq.num_cached_prompt_tokens
            self._tables[seq_id] = self.blocks.block_table(seq_id)
        valid, table = self._valid[seq_id], self.blocks.block_table(seq_id)
        old = self._tables.get(seq_id, [])
        size = self.cache.block_size
        for index in range(ceil_div(valid, size)):
            if index >= len(old) or old[index] != table[index]:
                return index * size
        return valid

    def _next_position(self, seq: DraftingSequence, num_drafted: int) -> int:
        # A small model feeds draft i at position len + i - 1; the head lags one (it pairs feature j, token j+1).
        return len(seq.token_ids) + num_drafted - 1 - int(self.needs_target_features)

    def _after_propose(self, seq: DraftingSequence, k: int, tree: bool = False) -> None:
        n = len(seq.token_ids)
        # Positions written from real inputs: everything for a small model (chain drafts become real if accepted,
        # and rollback() trims the rest; a tree's scratch slots do not line up with the accepted path); only the
        # caught-up ones for a head (later ones used its own features).
        self._valid[seq.seq_id] = n - 1 if self.needs_target_features else n if tree else n + k - 1
        self._tables[seq.seq_id] = self.blocks.block_table(seq.seq_id)

    def _forward(self, entries: list[BatchEntry], feats: list[torch.Tensor] | None) -> torch.Tensor:
        """The draft's hidden states for ``entries``, rows in the order of ``entries``."""
        batch = build_paged_batch(self.blocks, entries, self.device)
        attention = PagedAttention(self.cache, batch.metadata, self.draft.attention_scale)
        order = sorted(range(len(entries)), key=batch.first_rows.__getitem__)  # entries in batch order
        if feats is None:
            hidden = self.draft(batch.input_ids, batch.positions, attention)
        else:
            hidden = self.draft(batch.input_ids, torch.cat([feats[i] for i in order]), batch.positions, attention)
        return torch.cat([hidden[row: row + len(entry.tokens)] for entry, row in zip(entries, batch.first_rows,
                                                                                      strict=True)])

    def _sample_into(self, state: torch.Tensor, chains: list[_Chain]) -> None:
        """One more draft for each chain, from the draft's hidden state in the chain's row of ``state``."""
        logits = self.draft.compute_logits(state)
        for row, chain in enumerate(chains):
            params = chain.seq.params
            if params.greedy:
                chain.tokens.append(int(logits[row].argmax()))
                continue
            q = probabilities(logits[row], params)
            chain.probs.append(q)
            chain.tokens.append(int(torch.multinomial(q, 1, generator=chain.seq.generator)))


@dataclass(slots=True)
class _Chain:
    """One sequence's chain of drafts while ``propose`` grows it: the tokens, and the distributions they were drawn
    from (none when greedy)."""

    seq: DraftingSequence
    k: int  # the most drafts it may get
    plan: tuple[BatchEntry, torch.Tensor | None] | None  # the draft's catch-up forward (None: it cannot draft)
    tokens: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.k

    def result(self) -> tuple[list[int], torch.Tensor | None]:
        return self.tokens, torch.stack(self.probs) if self.probs else None
