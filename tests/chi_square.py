"""Pearson's chi-square goodness of fit, for the tests that check a sampler leaves a distribution unchanged
(speculative decoding's rejection sampling, chains and trees). A helper beside the tests, importable from any
test folder."""

from __future__ import annotations

import math

import torch


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.09 is the normal 99.9% point."""
    c = 2 / (9 * df)
    return df * (1 - c + z * math.sqrt(c)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Statistic and degrees of freedom over cells with expected count >= 5 (rare cells pooled)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
