"""``SpecConfig``: speculative decoding's proposer, its K, and token trees; the bounds they share with requests."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.checks import is_int as _is_int
from workbench.config.checks import require as _require

SPEC_METHODS = ("ngram", "draft")
# K, the drafts per step: one bound for the engine's config and for a request's own num_speculative_tokens (a
# draft is accepted only if every one before it was, so a long chain mostly drafts tokens its pass throws away).
MAX_SPECULATIVE_TOKENS = 16
# A tree pass verifies at most this many drafted nodes (a 65-position forward; EAGLE-2's default budget is 60).
MAX_TREE_NODES = 64
MAX_TREE_DEPTH = MAX_SPECULATIVE_TOKENS  # a tree's levels are its K


def static_tree_size(branching: tuple[int, ...]) -> int:
    """Drafted nodes of the full tree with these branching factors (children per node at each depth)."""
    total, width = 0, 1
    for b in branching:
        width *= b
        total += width
    return total


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """Speculative decoding: a cheap proposer drafts tokens, the target verifies them all in one forward.

    ``ngram`` (prompt lookup) proposes the continuation of the longest recent n-gram (``ngram_max`` down to
    ``ngram_min`` tokens) that already occurred in the sequence. ``draft`` runs a draft model on its own paged
    KV cache (by default the trained SmolLM2 draft in ``datasets/drafts``). ``num_speculative_tokens`` is K,
    the drafts per step; a request may ask for a different K (`LLMEngine.add_request`).

    Token trees (`workbench.spec.tree`) instead of a chain, one of:

    - ``tree_branching``: a static tree, children per node at each depth: ``(3, 2, 1)`` drafts 3 + 6 + 6 = 15
      nodes, 3 deep (``draft`` only; its depth replaces K);
    - ``tree_budget``: a dynamic tree of that many nodes, K deep: the draft grows it from its ``tree_top_k``
      most probable nodes per depth (EAGLE-2); prompt lookup merges up to ``tree_top_k`` earlier matches.

    A pass then verifies the tree's nodes plus the newest token in one forward (the verification budget).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 4
    tree_branching: tuple[int, ...] = ()
    tree_budget: int = 0
    tree_top_k: int = 4

    def __post_init__(self) -> None:
        _require(self.method in SPEC_METHODS, f"method must be one of {SPEC_METHODS}, got {self.method!r}")
        _require(isinstance(self.num_speculative_tokens, int)
                 and 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
                 f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                 f"got {self.num_speculative_tokens!r}")
        _require(isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                 and 1 <= self.ngram_min <= self.ngram_max,
                 f"need integers 1 <= ngram_min <= ngram_max, got {self.ngram_min!r} and {self.ngram_max!r}")
        self._check_tree()

    def _check_tree(self) -> None:
        branching = self.tree_branching
        _require(isinstance(branching, tuple | list),
                 f"tree_branching must be a tuple of children per depth, e.g. (3, 2, 1), got {branching!r}")
        branching = tuple(branching)
        object.__setattr__(self, "tree_branching", branching)
        if branching:
            _require(len(branching) <= MAX_TREE_DEPTH and all(_is_int(b) and 1 <= b <= 16 for b in branching),
                     f"tree_branching must hold 1..{MAX_TREE_DEPTH} integers in [1, 16] (children per node at each "
                     f"depth), got {branching!r}")
            nodes = static_tree_size(branching)
            _require(nodes <= MAX_TREE_NODES, f"tree_branching {branching} makes {nodes} nodes; a pass verifies at "
                                              f"most {MAX_TREE_NODES}")
            _require(self.method == "draft", "tree_branching needs method 'draft': prompt lookup proposes the "
                                             "continuations it finds, use tree_budget for it")
        _require(_is_int(self.tree_budget) and 0 <= self.tree_budget <= MAX_TREE_NODES,
                 f"tree_budget must be an integer in [0, {MAX_TREE_NODES}] (0: no dynamic tree), "
                 f"got {self.tree_budget!r}")
        _require(not (branching and self.tree_budget),
                 f"choose a static tree (tree_branching={branching}) or a dynamic one (tree_budget="
                 f"{self.tree_budget}), not both")
        _require(_is_int(self.tree_top_k) and 1 <= self.tree_top_k <= 16,
                 f"tree_top_k must be an integer in [1, 16], got {self.tree_top_k!r}")

    @property
    def is_tree(self) -> bool:
        return bool(self.tree_branching or self.tree_budget)

    @property
    def depth(self) -> int:
        """Most drafted tokens a pass can accept: K, or a static tree's number of levels."""
        return len(self.tree_branching) if self.tree_branching else self.num_speculative_tokens

    @property
    def verify_positions(self) -> int:
        """Positions per target pass for one sequence (the verification budget): the newest token and every
        drafted node."""
        if self.tree_branching:
            return 1 + static_tree_size(self.tree_branching)
        return 1 + (self.tree_budget or self.num_speculative_tokens)
