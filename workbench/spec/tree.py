"""Token trees for speculative decoding: the drafted tree, its static shapes, and what one is expected to yield.

A chain drafts one guess per position; a tree drafts several at each node (the draft's top candidates, or
samples from it), so a pass survives a wrong first guess whenever another branch holds the target's token. All
nodes are verified in one target forward: flattened parents first into consecutive cache slots, each node at
position ``prefix + depth`` and seeing only the prefix and its ancestors (the paged prefill kernel's tree mask,
`workbench.cache.paged_batch.tree_entry`). The verifier (`workbench.spec.tree_verify`) then walks down from the
root and keeps one path.

Node 0 is the root: the newest real token, whose KV is computed in the same forward. Its children are the
drafted tokens of depth 1, and so on; siblings come in the order they were drafted (their *rank*: 0 is the
draft's first choice), which is the order the verifier tries them in.

Shapes:
- static, from branching factors per depth (``(3, 2, 1)``: three candidates after the root, two after each of
  those, one after each of those: 3 + 6 + 6 = 15 nodes), like Medusa's and EAGLE-1's fixed trees;
- dynamic (EAGLE-2): grown depth by depth from the most probable nodes and cut to a node budget
  (`workbench.spec.tree_draft`).

What a tree should yield follows from how often the draft's rank-r guess at depth d is the target's token
(p[d][r], once its parent is accepted): a node is accepted with the product of p along its path, and a pass
emits 1 + the sum of that over the nodes (Sequoia's positional-acceptance model; the chain's
(1 - a^(K+1)) / (1 - a) is the one-node-per-depth case with p[d][0] = a).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from workbench.config import static_tree_size

__all__ = ["DraftTree", "check_parents", "expected_tree_tokens", "rank_paths", "static_tree_parents",
           "static_tree_size", "tree_depths"]


@dataclass(slots=True)
class DraftTree:
    """A drafted token tree, node 0 the root; ``parents[i] < i`` (-1 for the root).

    ``child_probs[n]``: the distribution node ``n``'s children were sampled from, in sibling order, without
    replacement (or with replacement when ``with_replacement``, SpecInfer's scheme). A node absent from it chose
    its children deterministically (the draft's top-k, or prompt lookup): the verifier then treats each child as
    a point mass, which is exact whatever rule picked them."""

    tokens: list[int]
    parents: list[int]
    child_probs: dict[int, torch.Tensor] = field(default_factory=dict)
    with_replacement: bool = False

    def __post_init__(self) -> None:
        check_parents(self.parents)
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens for {len(self.parents)} parents")

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def num_drafted(self) -> int:
        return len(self.tokens) - 1

    @property
    def draft_tokens(self) -> list[int]:
        return self.tokens[1:]

    def depths(self) -> list[int]:
        return tree_depths(self.parents)

    def children(self) -> list[list[int]]:
        """Per node, its children in sibling (rank) order."""
        out: list[list[int]] = [[] for _ in self.parents]
        for node, parent in enumerate(self.parents[1:], start=1):
            out[parent].append(node)
        return out

    def rank_paths(self) -> list[tuple[int, ...]]:
        """Per drafted node (1..), the ranks along its path from the root: (0, 1) is the 2nd child of the 1st."""
        return rank_paths(self.parents)[1:]

    def nodes_per_depth(self) -> list[int]:
        depths = self.depths()
        counts = [0] * max(depths)
        for d in depths[1:]:
            counts[d - 1] += 1
        return counts


def check_parents(parents: Sequence[int]) -> None:
    if not parents or parents[0] != -1:
        raise ValueError(f"a tree starts with its root (parent -1), got parents {list(parents)[:8]}")
    for i, parent in enumerate(parents[1:], start=1):
        if not 0 <= parent < i:
            raise ValueError(f"node {i}'s parent must come before it (0 <= parent < {i}), got {parent}")


def tree_depths(parents: Sequence[int]) -> list[int]:
    depths = [0] * len(parents)
    for i, parent in enumerate(parents[1:], start=1):
        depths[i] = depths[parent] + 1
    return depths


def rank_paths(parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Per node, the sibling ranks along its path (the root's is ())."""
    paths: list[tuple[int, ...]] = [()]
    num_children = [0] * len(parents)
    for parent in parents[1:]:
        paths.append(paths[parent] + (num_children[parent],))
        num_children[parent] += 1
    return paths


def static_tree_parents(branching: Sequence[int]) -> list[int]:
    """Parents of the full static tree, breadth first (node 0 the root); siblings in rank order."""
    parents, frontier = [-1], [0]
    for b in branching:
        nxt = []
        for node in frontier:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def expected_tree_tokens(paths: Iterable[tuple[int, ...]], acceptance: Sequence[Sequence[float]]) -> float:
    """Tokens a pass emits on average, 1 + sum over the drafted nodes (given by their rank paths) of the product
    of ``acceptance[d][r]`` along the path: the probability that the target's token at depth d + 1 is the draft's
    rank-r candidate there, given the parent accepted. Ranks or depths beyond the table count as never accepted."""
    total = 1.0
    for path in paths:
        product = 1.0
        for depth, rank in enumerate(path):
            row = acceptance[depth] if depth < len(acceptance) else ()
            product *= row[rank] if rank < len(row) else 0.0
        total += product
    return total
