"""What a proposer drafted for one sequence in one step, cut to the slots the scheduler reserved for it.

The scheduler decides how many slots a decode may draft into (``ScheduledSeq.lookahead``) and never sees a draft;
the engine's drafting step turns each proposal into a ``Drafts`` (a chain of tokens with the distributions they
were drawn from, or a token tree), and the runner and the verifier read it beside the scheduler's decision
(`workbench.engine.model_runner.ForwardItem`). Nothing here changes after it is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.spec.tree import DraftTree


@dataclass(frozen=True, slots=True)
class Drafts:
    tokens: list[int]  # the drafted tokens: a chain in order, or a tree's nodes after its root, breadth first
    probs: torch.Tensor | None = None  # [len(tokens), vocab] distributions a chain was drawn from (None: chosen)
    tree: DraftTree | None = None  # when the tokens are a token tree's nodes

    @classmethod
    def chain(cls, tokens: list[int], probs: torch.Tensor | None, slots: int) -> Drafts | None:
        """At most ``slots`` of a chain's drafts, or None when none is left (a plain decode)."""
        tokens = tokens[:slots]
        if not tokens:
            return None
        return cls(tokens, probs[:len(tokens)] if probs is not None else None)

    @classmethod
    def of_tree(cls, tree: DraftTree | None, newest: int, slots: int) -> Drafts | None:
        """A tree rooted at the sequence's newest token within ``slots`` drafted nodes; None for no tree or a bare
        root (a plain decode). A tree that does not fit is the proposer's bug: RuntimeError."""
        if tree is None or not tree.num_drafted:
            return None
        if tree.num_drafted > slots or tree.tokens[0] != newest:
            raise RuntimeError(f"a tree of {tree.num_drafted} drafted nodes rooted at token {tree.tokens[0]} does "
                               f"not fit {slots} slots after token {newest}")
        return cls(tree.draft_tokens, None, tree)

    @property
    def num_fed(self) -> int:
        """Rows the verification feeds: the newest token, then every drafted token (a tree's nodes included)."""
        return 1 + len(self.tokens)
