"""What the engine asks of a speculative proposer, and how to build one from a ``SpecConfig``.

Per step the engine calls ``propose`` (``propose_tree`` when the config asks for token trees) for the decoding
sequences that may draft (each with its own maximum),
then runs the target over the newest token plus the drafts, verifies, and tells the proposer what stands:
``observe`` hands over the target's features of the positions that are now real (its final hidden states, or
the residuals of the layers the proposer names in ``taps``; only proposers that condition on them, like an
EAGLE head, keep them), ``rollback`` marks the proposer's own state beyond the
accepted positions invalid, ``forget`` drops a finished or preempted sequence, and ``copy_blocks`` mirrors the
block manager's copy-on-write in a proposer's own paged cache.
"""

from __future__ import annotations

from typing import Protocol

import torch

from workbench.cache.block_manager import BlockManager
from workbench.config import SpecConfig
from workbench.models.llama import LlamaModel
from workbench.spec.draft_head import load_draft
from workbench.spec.draft_proposer import DraftProposer
from workbench.spec.ngram import NgramProposer
from workbench.spec.sequence_view import DraftingSequence
from workbench.spec.tree import DraftTree
from workbench.spec.tree_draft import TreeShape


class Proposer(Protocol):
    needs_target_features: bool
    taps: tuple[int, ...]  # target layers whose residual ``observe`` should get; () for the final hidden state

    def propose(self, items: list[tuple[DraftingSequence, int]]) -> list[tuple[list[int], torch.Tensor | None]]:
        ...

    def propose_tree(self, items: list[tuple[DraftingSequence, int, int]], shape: TreeShape) -> list[DraftTree | None]:
        """Per (sequence, slots, depth): a token tree within that many drafted nodes and levels, or None."""
        ...

    def observe(self, seq: DraftingSequence, start: int, hidden: torch.Tensor) -> None: ...

    def rollback(self, seq: DraftingSequence, num_valid: int) -> None: ...

    def forget(self, seq_id: int) -> None: ...

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None: ...


def build_proposer(config: SpecConfig, *, target: LlamaModel, blocks: BlockManager,
                   draft_model: torch.nn.Module | None = None) -> Proposer:
    """The proposer a config names; ``draft`` uses ``draft_model`` or the trained SmolLM2 draft, with a paged KV
    cache of its own laid out like the target's pool (``blocks``)."""
    if config.method == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max)
    if draft_model is None:
        draft_model = load_draft(target)
    return DraftProposer(draft_model, blocks, dtype=target.dtype, device=target.device)
