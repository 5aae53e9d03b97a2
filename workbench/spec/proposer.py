"""What the engine asks of a speculative proposer, and how to build one from a ``SpecConfig``.

Per step the engine calls ``propose`` for the decoding sequences that may draft (each with its own maximum),
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

from workbench.config import SpecConfig


class Proposer(Protocol):
    needs_target_features: bool
    taps: tuple[int, ...]  # target layers whose residual ``observe`` should get; () for the final hidden state

    def propose(self, items: list[tuple[object, int]]) -> list[tuple[list[int], torch.Tensor | None]]: ...

    def observe(self, seq: object, start: int, hidden: torch.Tensor) -> None: ...

    def rollback(self, seq: object, num_valid: int) -> None: ...

    def forget(self, seq_id: int) -> None: ...

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None: ...


def build_proposer(config: SpecConfig, engine, draft_model=None) -> Proposer:
    """The proposer a config names; ``draft`` uses ``draft_model`` or the trained SmolLM2 draft."""
    if config.method == "ngram":
        from workbench.spec.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max)
    from workbench.spec.draft_proposer import DraftProposer

    if draft_model is None:
        from workbench.spec.draft_head import load_draft

        draft_model = load_draft(engine.model)
    return DraftProposer(draft_model, engine.blocks, engine.cache.num_blocks, engine.cache.block_size,
                         dtype=engine.model.dtype, device=engine.model.device)
