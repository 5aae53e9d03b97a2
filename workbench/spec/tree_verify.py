"""Verifying a drafted token tree against the target, exactly: keep one root-to-node path, then one more token.

The target scores every node in one forward, giving after node n the distribution p_n of the token that
follows it. The walk starts at the root:

* Greedy: move to the child whose token is the target's argmax after the current node; when none is, emit that
  argmax and stop (also at a leaf). The output is plain greedy decoding's, token for token.
* Sampling: recursive rejection sampling over siblings (SpecInfer, Miao et al. 2024; EAGLE). At node n, with
  p = p_n, try the children in their drafted order: child c, drawn from q_c, is accepted with probability
  min(1, p(c) / q_c(c)) and the walk moves to it; on rejection p becomes max(0, p - q_c) renormalized and the
  next sibling is tried. When every child is rejected (or n is a leaf), a token drawn from the current p is
  emitted and the pass ends. Each step emits a token distributed exactly as p_n (the residual carries what the
  rejected siblings could not), so the output has the target's distribution whatever the draft did.
  q_c is the draft's distribution at n for i.i.d. children; for children drawn without replacement it is that
  distribution with the earlier siblings removed and renormalized (Sequoia's variant: no duplicate siblings);
  for children chosen deterministically (top-k, prompt lookup) it is a point mass on c, so the test becomes
  "accept c with the probability p gives it, else remove it from p".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.spec.tree import DraftTree


@dataclass(frozen=True, slots=True)
class TreeVerdict:
    path: list[int]  # accepted nodes, depth 1 first (indices into the tree)
    emitted: list[int]  # their tokens, then the target's own next token
    tested_last: bool  # the last node reached (the root when path is empty) had children that were tried

    @property
    def accepted(self) -> int:
        return len(self.path)


def verify_tree_greedy(tree: DraftTree, target_logits: torch.Tensor) -> TreeVerdict:
    """target_logits: [num_nodes, V], row n the target's logits after node n."""
    best = target_logits.argmax(-1).tolist()
    children = tree.children()
    node, path = 0, []
    while True:
        match = next((c for c in children[node] if tree.tokens[c] == best[node]), None)
        if match is None:
            return TreeVerdict(path, [tree.tokens[n] for n in path] + [best[node]], bool(children[node]))
        path.append(match)
        node = match


def verify_tree_sampled(tree: DraftTree, target_probs: torch.Tensor,
                        generator: torch.Generator | None = None) -> TreeVerdict:
    """target_probs: [num_nodes, V] (temperature, top-k and top-p already applied)."""
    children = tree.children()
    node, path = 0, []
    while True:
        p = target_probs[node]
        accepted = None
        for index, child in enumerate(children[node]):
            q = _proposal(tree, node, children[node][:index], child, p)
            token = tree.tokens[child]
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[token]) / max(float(q[token]), 1e-30)):
                accepted = child
                break
            residual = (p - q).clamp_min(0)
            total = float(residual.sum())
            # total == 0 means p <= q everywhere, i.e. p == q up to rounding, where rejection has probability 0.
            p = residual / total if total > 1e-12 else p
        if accepted is None:
            emitted = [tree.tokens[n] for n in path] + [int(torch.multinomial(p, 1, generator=generator))]
            return TreeVerdict(path, emitted, bool(children[node]))
        path.append(accepted)
        node = accepted


def _proposal(tree: DraftTree, node: int, earlier: list[int], child: int, like: torch.Tensor) -> torch.Tensor:
    """q_c: the distribution ``child`` was drawn from, given its earlier siblings."""
    q = tree.child_probs.get(node)
    if q is None:
        return torch.nn.functional.one_hot(torch.tensor(tree.tokens[child]), like.shape[-1]).to(like.dtype)
    if tree.with_replacement or not earlier:
        return q
    q = q.clone()
    q[[tree.tokens[c] for c in earlier]] = 0
    return q / q.sum()
