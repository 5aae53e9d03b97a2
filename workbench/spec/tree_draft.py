"""Growing a token tree from a draft's distributions: a static shape, or a dynamic one under a node budget.

The draft proposer (`workbench.spec.draft_proposer`) runs the model; this module only decides, from the
logits it gets back, which tokens become nodes and which nodes the draft must read next. One `TreeBuilder` per
sequence and pass:

1. ``add_children(nodes, logits)``: each listed node gets its children from the draft's distribution after it;
2. ``next_frontier()``: the nodes the draft must now read (to get *their* children), in the order they take
   the draft's scratch slots (``scratch_index``); empty when the tree is complete;
3. ``tree()``: the final `DraftTree`, breadth first, for the target to verify.

Static (``branching``, e.g. (3, 2, 1)): every node of depth d gets ``branching[d]`` children: the draft's top
candidates when greedy, or samples without replacement from its distribution q when sampling (the tree keeps
q, so verification is recursive rejection sampling against it). Dynamic (EAGLE-2, Li et al. 2024): the root's
``top_k`` best tokens, then at each depth the ``top_k`` nodes with the highest path probability (the product of
the draft's probabilities from the root) get their ``top_k`` best tokens each, ``depth`` times; the tree is then
cut to the ``budget`` most probable nodes (a parent is always at least as probable as its child, so the cut
keeps paths whole). Its nodes are chosen from the draft's probabilities, so they are kept deterministic even
when sampling: a child picked by a rule that looks at its probability is not a sample from q, and only
point-mass verification stays exact for it.

Both fit the slots the scheduler reserved (``max_nodes``: nodes verified, and nodes the draft reads) and the
tokens the sequence may still emit (``max_depth``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench.config import SamplingParams
from workbench.sampling import probabilities
from workbench.spec.tree import DraftTree, static_tree_parents, tree_depths


@dataclass(frozen=True, slots=True)
class TreeShape:
    """``branching`` for a static tree; else a dynamic one: ``budget`` nodes, ``top_k`` wide, ``depth`` deep."""

    branching: tuple[int, ...] = ()
    budget: int = 0
    top_k: int = 0
    depth: int = 0

    @property
    def is_static(self) -> bool:
        return bool(self.branching)

    @property
    def max_depth(self) -> int:
        return len(self.branching) if self.is_static else self.depth

    @property
    def num_slots(self) -> int:
        """Slots beyond the newest token a pass needs: the tree's drafted nodes, and the nodes the draft reads."""
        if self.is_static:
            return len(static_tree_parents(self.branching)) - 1
        return max(self.budget, (self.depth - 1) * self.top_k)


@dataclass(slots=True)
class _Node:
    token: int
    parent: int
    depth: int
    score: float  # log of the draft's path probability
    probs: torch.Tensor | None = None  # the distribution its children were sampled from (static, sampling)
    scratch: int = 0  # 1-based order in which the draft read it (0: not read)


class TreeBuilder:
    def __init__(self, shape: TreeShape, root_token: int, *, max_nodes: int, max_depth: int,
                 params: SamplingParams, generator: torch.Generator | None = None):
        self.shape, self.params, self.generator = shape, params, generator
        self.max_nodes, self.max_depth = max_nodes, min(max_depth, shape.max_depth)
        self.nodes = [_Node(root_token, -1, 0, 0.0)]
        self.children: list[list[int]] = [[]]
        self.num_read = 0
        self._template: list[int] = []  # static: parents of the (cut) full tree, breadth first
        if shape.is_static:
            parents = static_tree_parents(shape.branching)
            depths = tree_depths(parents)
            self._template = [p for p, d in zip(parents, depths, strict=True) if d <= self.max_depth][: max_nodes + 1]
        self._template_of = [0]  # builder node -> template node (static)
        self._pending: list[int] = []
        self.kept: list[int] = []  # after tree(): the builder nodes it kept, in tree order

    # ------------------------------------------------------------------------------------------ growing
    def add_children(self, nodes: list[int], logits: torch.Tensor) -> None:
        """Children for each of ``nodes`` from the draft's logits after it (rows in the same order)."""
        for node, row in zip(nodes, logits, strict=True):
            count = self._num_children(node)
            if count:
                self._pending.append(node)
                self._grow(node, row, count)

    def next_frontier(self) -> list[int]:
        """Nodes the draft reads next (each gets its scratch index), [] when the tree is complete."""
        if self.shape.is_static:
            frontier = [c for n in self._pending for c in self.children[n] if self._num_children(c)]
        else:
            new = [c for n in self._pending for c in self.children[n]]
            room = self.max_nodes - self.num_read
            frontier = sorted(new, key=lambda c: -self.nodes[c].score)[: min(self.shape.top_k, room)]
            if not frontier or self.nodes[frontier[0]].depth >= self.max_depth:
                frontier = []
        self._pending = []
        for node in frontier:
            self.num_read += 1
            self.nodes[node].scratch = self.num_read
        return frontier

    def read_ancestors(self, node: int) -> list[int]:
        """Scratch indices of the node and its ancestors that the draft read (the root is not one of them)."""
        out = []
        while node > 0:
            out.append(self.nodes[node].scratch)
            node = self.nodes[node].parent
        return out

    def _num_children(self, node: int) -> int:
        if self.shape.is_static:
            template = self._template_of[node]
            return sum(1 for p in self._template if p == template)
        if self.nodes[node].depth >= self.max_depth:
            return 0
        return self.shape.top_k

    def _grow(self, node: int, logits: torch.Tensor, count: int) -> None:
        sampled = self.shape.is_static and not self.params.greedy
        probs = torch.softmax(logits.float(), -1) if self.params.greedy else probabilities(logits, self.params)
        if sampled:
            tokens = self._sample_without_replacement(probs, count)
            self.nodes[node].probs = probs
        else:
            count = min(count, int((probs > 0).sum()))
            tokens = torch.topk(probs, count).indices.tolist()
        template_children = [i for i, p in enumerate(self._template) if p == self._template_of[node]]
        for rank, token in enumerate(tokens):
            p = float(probs[token])
            score = self.nodes[node].score + (math.log(p) if p > 0 else -math.inf)
            self.nodes.append(_Node(token, node, self.nodes[node].depth + 1, score))
            self.children.append([])
            self.children[node].append(len(self.nodes) - 1)
            self._template_of.append(template_children[rank] if template_children else -1)

    def _sample_without_replacement(self, q: torch.Tensor, count: int) -> list[int]:
        """Draws in order, each from q with the earlier draws removed (what the verifier assumes)."""
        tokens, rest = [], q.clone()
        for _ in range(min(count, int((q > 0).sum()))):
            token = int(torch.multinomial(rest, 1, generator=self.generator))
            tokens.append(token)
            rest[token] = 0
        return tokens

    # ------------------------------------------------------------------------------------------- result
    def tree(self) -> DraftTree:
        """The tree to verify: static as drafted; dynamic cut to the most probable nodes. Breadth first."""
        keep = list(range(1, len(self.nodes)))
        if not self.shape.is_static:
            order = sorted(keep, key=lambda n: (-self.nodes[n].score, self.nodes[n].depth, n))
            chosen: set[int] = {0}
            for n in order:
                if len(chosen) > min(self.shape.budget, self.max_nodes):
                    break
                if self.nodes[n].parent in chosen:
                    chosen.add(n)
            keep = [n for n in keep if n in chosen]
        keep = [0] + sorted(keep, key=lambda n: (self.nodes[n].depth, n))[: self.max_nodes]
        self.kept = keep  # builder nodes, in tree order
        index = {n: i for i, n in enumerate(keep)}
        tokens = [self.nodes[n].token for n in keep]
        parents = [-1] + [index[self.nodes[n].parent] for n in keep[1:]]
        probs = {index[n]: self.nodes[n].probs for n in keep if self.nodes[n].probs is not None}
        return DraftTree(tokens, parents, probs)
