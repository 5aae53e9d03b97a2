"""Prompt lookup: propose what followed the last time the sequence's latest n-gram appeared.

Input-grounded tasks (summarize, edit, extract from a given text) copy long spans of their input, so the
n tokens just generated have often appeared before, followed by exactly what comes next. The proposer needs
no model and no memory beyond the sequence itself. It tries the longest n first (``ngram_max`` down to
``ngram_min``) and takes the most recent earlier occurrence.

As a tree (`propose_ngram_tree`), it keeps looking after the first match: each further earlier occurrence (of
the same n-gram, then of shorter ones) whose continuation differs adds a branch, and the continuations are
merged into one trie under the newest token. The first branch is the chain's proposal, so the tree never
verifies less than the chain would; the others are the text's other ways of going on.
"""

from __future__ import annotations

from workbench.spec.sequence_view import DraftingSequence
from workbench.spec.tree import DraftTree
from workbench.spec.tree_draft import TreeShape


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


def ngram_continuations(tokens: list[int], depth: int, ngram_min: int = 1, ngram_max: int = 4):
    """Continuations (up to ``depth`` tokens) of earlier occurrences of the sequence's final n-gram: longest n
    first, most recent occurrence first."""
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == pattern and start + n < length:
                yield tokens[start + n: start + n + depth]


def propose_ngram_tree(tokens: list[int], max_nodes: int, max_depth: int, max_branches: int, ngram_min: int = 1,
                       ngram_max: int = 4) -> DraftTree | None:
    """Up to ``max_branches`` distinct continuations merged into a tree of at most ``max_nodes`` drafted nodes
    (earlier branches first), ``max_depth`` deep, under the newest token; None when nothing matches."""
    if max_nodes <= 0 or max_depth <= 0:
        return None
    node_tokens, parents = [tokens[-1]], [-1]
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    branches = 0
    for follow in ngram_continuations(tokens, max_depth, ngram_min, ngram_max):
        node, added = 0, False
        for token in follow:
            if (node, token) not in child:
                if len(node_tokens) > max_nodes:
                    break
                child[(node, token)] = len(node_tokens)
                node_tokens.append(token)
                parents.append(node)
                added = True
            node = child[(node, token)]
        branches += added
        if branches >= max_branches or len(node_tokens) > max_nodes:
            break
    if len(node_tokens) == 1:
        return None
    return _breadth_first(node_tokens, parents)


def _breadth_first(tokens: list[int], parents: list[int]) -> DraftTree:
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    order = sorted(range(len(parents)), key=lambda i: (depths[i], i))
    index = {node: i for i, node in enumerate(order)}
    return DraftTree([tokens[n] for n in order], [-1] + [index[parents[n]] for n in order[1:]])


class NgramProposer:
    """Stateless proposer over the sequences' own tokens."""

    needs_target_features = False
    taps = ()

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, items: list[tuple[DraftingSequence, int]]) -> list[tuple[list[int], None]]:
        """For each (sequence, max drafts): the drafts and their distributions (None: deterministic)."""
        return [(propose_ngram(seq.token_ids, k, self.ngram_min, self.ngram_max), None) for seq, k in items]

    def propose_tree(self, items: list[tuple[DraftingSequence, int, int]], shape: TreeShape) -> list[DraftTree | None]:
        """For each (sequence, slots, depth): a tree of the continuations found (``shape.top_k`` of them at most,
        within ``shape.budget`` nodes), or None."""
        return [propose_ngram_tree(seq.token_ids, min(slots, shape.budget), depth, shape.top_k, self.ngram_min,
                                   self.ngram_max) for seq, slots, depth in items]

    # No per-sequence state and no cache: nothing to observe, roll back, forget or copy.
    def observe(self, seq: DraftingSequence, start: int, hidden: object) -> None:
        pass

    def rollback(self, seq: DraftingSequence, num_valid: int) -> None:
        pass

    def forget(self, seq_id: int) -> None:
        pass

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        pass
