"""Chain against token trees at the same verification budget, for section 8 of the chapter: a chain of K drafts,
a static tree of K nodes and a dynamic (EAGLE-2-style) tree of K nodes all verify K + 1 positions per target
pass; which turns them into more tokens? The comparison itself is
`workbench.spec_experiments.tree_compare.compare_layouts` (also run by ``benchmarks/bench_spec_decode.py``); this module
picks the chapter's workload and shapes the result the panel, the prose and the closing table read.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from workbench.config import CacheConfig, SchedulerConfig, SpecConfig
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.evidence import Evidence
from workbench.spec_experiments.tree_compare import compare_layouts, layouts_at_budget

COLUMNS = ["positions", "passes", "tokens_per_pass", "expected_tokens", "expected_from_probe", "alpha_depth1",
           "draft_ms", "verify_ms", "r", "speedup"]


@dataclass(slots=True)
class TreeComparison:
    """One row per layout (plain decoding first), columns as in `workbench.spec_experiments.tree_compare`."""

    budget: int
    num_prompts: int
    max_tokens: int
    frame: pd.DataFrame  # indexed by layout label
    probe: str | None

    @property
    def chain(self) -> str:
        return next(label for label in self.frame.index if label.startswith("chain"))

    @property
    def trees(self) -> list[str]:
        return [label for label in self.frame.index if label.startswith(("static", "dynamic"))]

    @property
    def best_tree(self) -> str:
        """The tree layout with the most tokens per target pass."""
        return max(self.trees, key=lambda label: self.frame.loc[label, "tokens_per_pass"])

    def tokens(self, label: str) -> float:
        return float(self.frame.loc[label, "tokens_per_pass"])

    def gain(self) -> float:
        """Tokens per pass of the best tree over the chain's, at the same positions per pass."""
        return self.tokens(self.best_tree) / self.tokens(self.chain)

    @property
    def trees_raise_yield(self) -> bool:
        return self.tokens(self.best_tree) > self.tokens(self.chain)

    @property
    def faster_too(self) -> bool:
        """The best-yield tree is also faster end to end than the chain (drafting and verifying included)."""
        return float(self.frame.loc[self.best_tree, "speedup"]) > float(self.frame.loc[self.chain, "speedup"])

    def most_per_pass(self) -> dict[str, int]:
        """The most tokens one target pass can yield per layout: its depth (longest accepted branch) plus the
        target's own token. A chain of K is K deep; a tree of the same nodes spends them on width."""
        return {label: depth_of(label, self.budget) + 1 for label in (self.chain, *self.trees)}

    def yield_reading(self) -> str:
        """The yield difference read against the pass counts' noise, and what the layouts can reach at most."""
        tokens = self.num_prompts * self.max_tokens
        best, chain = self.best_tree, self.chain
        e = Evidence.rate_ratio("yield", tokens, int(self.frame.loc[best, "passes"]), tokens,
                                int(self.frame.loc[chain, "passes"]))
        ceiling = ", ".join(f"{label} {n}" for label, n in self.most_per_pass().items())
        noise = (f"{e.effect:.2f}x is within the pass counts' noise (±{e.margin:.2f}x over {e.n_label})"
                 if not e.resolved else f"{e.effect:.2f}x clears the pass counts' noise (±{e.margin:.2f}x)")
        return (f"The best tree's yield over the chain's, {noise}. At most a pass can yield, with {self.budget} "
                f"nodes: {ceiling} tokens, so the book's '6-8 tokens per pass' for trees (4-5 for EAGLE-2) is out "
                "of reach of this budget whatever the acceptance")

    def model_error(self) -> float:
        """Largest |measured − expected| tokens per pass over the speculative layouts (expected: the independence
        model at the acceptance each run measured)."""
        rows = self.frame.loc[[self.chain, *self.trees]]
        return float((rows["tokens_per_pass"] - rows["expected_tokens"]).abs().max())

    def sentence(self) -> str:
        parts = [f"{label}: {self.frame.loc[label, 'tokens_per_pass']:.2f} tokens per pass (expected "
                 f"{self.frame.loc[label, 'expected_tokens']:.2f}), r = {self.frame.loc[label, 'r']:.2f}, "
                 f"{self.frame.loc[label, 'speedup']:.2f}x" for label in (self.chain, *self.trees)]
        return (f"{self.budget} drafted nodes ({self.budget + 1} positions per pass), {self.num_prompts} held-out chat "
                f"prompts × {self.max_tokens} tokens: " + "; ".join(parts))


def depth_of(label: str, budget: int) -> int:
    """A layout's depth from its label: chain K=k is k deep, static (a, b, ...) one level per entry, the dynamic
    tree its stated depth."""
    if label.startswith("chain"):
        return int(label.split("K=")[1].split()[0])
    if label.startswith("static"):
        inside = label[label.index("(") + 1:label.index(")")]
        return len([part for part in inside.split(",") if part.strip()])
    if "depth" in label:
        return int(label.split("depth")[1].split()[0])
    return budget


def engine_factory(model, tokenizer, draft):
    """``make_engine(spec)`` for `compare_layouts`: one sequence at a time, the draft only when speculating."""
    def make_engine(spec: SpecConfig | None) -> LLMEngine:
        return LLMEngine(model, tokenizer, spec_config=spec, draft_model=draft if spec is not None else None,
                         cache_config=CacheConfig(memory_budget_bytes=256 * 2**20),
                         scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2048))
    return make_engine


def compare_trees(model, tokenizer, draft, *, budget: int = 4, num_prompts: int = 2, max_tokens: int = 16,
                  progress=None) -> TreeComparison:
    """Plain decoding, a chain of ``budget`` drafts, a static and a dynamic tree of ``budget`` nodes on the first
    ``num_prompts`` held-out chat prompts (never used to train the draft), greedy, batch 1, all drafted by
    ``draft`` (a static tree needs a draft model: prompt lookup proposes only the continuations it finds)."""
    if progress is not None:
        progress(0, 1, f"plain, chain and two trees of {budget} nodes")
    prompts = load_prompts("draft_heldout")[:num_prompts]
    frame = compare_layouts(engine_factory(model, tokenizer, draft), prompts, layouts_at_budget(budget),
                            max_tokens=max_tokens)
    if progress is not None:
        progress.finish(f"{len(frame) - 1} layouts")
    return TreeComparison(budget, num_prompts, max_tokens, frame.set_index("layout"), frame.attrs.get("probe"))
