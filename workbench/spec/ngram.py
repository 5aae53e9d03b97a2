"""Prompt lookup: propose what followed the last time the sequence's latest n-gram appeared.

Input-grounded tasks (summarize, edit, extract from a given text) copy long spans of their input, so the
n tokens just generated have often appeared before, followed by exactly what comes next. The proposer needs
no model and no memory beyond the sequence itself. It tries the longest n first (``ngram_max`` down to
``ngram_min``) and takes the most recent earlier occurrence.
"""

from __future__ import annotations

from workbench.spec.sequence_view import DraftingSequence


def propose_ngram(tokens: list[int], k: int, ngram_min: int = 1, ngram_max: int = 4) -> list[int]:
    """Up to ``k`` tokens continuing the latest earlier occurrence of the sequence's final n-gram."""
    if k <= 0:
        return []
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = tokens[length - n:]
        # Scan backwards from the most recent candidate; the match must end before the suffix itself.
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == pattern:
                follow = tokens[start + n: start + n + k]
                if follow:
                    return follow
    return []


class NgramProposer:
    """Stateless proposer over the sequences' own tokens."""

    needs_target_features = False
    taps = ()

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, items: list[tuple[DraftingSequence, int]]) -> list[tuple[list[int], None]]:
        """For each (sequence, max drafts): the drafts and their distributions (None: deterministic)."""
        return [(propose_ngram(seq.token_ids, k, self.ngram_min, self.ngram_max), None) for seq, k in items]

    # No per-sequence state and no cache: nothing to observe, roll back, forget or copy.
    def observe(self, seq: DraftingSequence, start: int, hidden: object) -> None:
        pass

    def rollback(self, seq: DraftingSequence, num_valid: int) -> None:
        pass

    def forget(self, seq_id: int) -> None:
        pass

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        pass
