"""Chapter 7's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch07.csv)."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import weight_bytes
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import smallest_feasible
from workbench.models import model_spec
from workbench.spec.stats import expected_tokens_per_pass


def _step_70b() -> str:
    fits = smallest_feasible("llama-3-70b", "A100 80GB")
    return (f"a 70B model in bf16 does not fit one A100; on the {fits.tp} A100s it needs, a step's floor is "
            f"{fits.decode_floor_ms:.1f} ms; 200 tokens at 150-200 ms = 30-40 s (its arithmetic holds)")


def _weights_140() -> str:
    w = weight_bytes(model_spec("llama-3-70b"), torch.bfloat16)
    return f"{w / 1e9:.1f} GB of bf16 weights (holds), read once per step, split across the GPUs that hold them"


def _alpha_range() -> str:
    return ", ".join(f"α {a:.1f}: {expected_tokens_per_pass(a, 4):.2f}" for a in (0.8, 0.9)) + \
        " tokens per pass at K = 4 (1 + α + … + α⁴)"


def _draft_size() -> str:
    ratio = model_spec("llama-3-70b").num_parameters() / model_spec("llama-3-8b").num_parameters()
    return f"Llama-3-70B has {ratio:.1f}x Llama-3-8B's parameters: the book's own pair is below its '10-20x'"


def _tree_6_8() -> str:
    return ("a tree of depth d yields at most d + 1 tokens per pass: 6-8 need a tree 5-7 deep, far beyond the 4-node "
            "layouts section 8 can run; not measured here")


CHECKS = {"step_70b": _step_70b, "weights_140": _weights_140, "alpha_range": _alpha_range,
          "draft_size": _draft_size, "tree_6_8": _tree_6_8}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 7, with what this chapter finds for it."""
    return kit.table("ch07", CHECKS)
