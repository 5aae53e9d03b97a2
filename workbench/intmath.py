"""Integer helpers the engine's CPU side shares: stdlib only, so the block managers import them without torch."""

from __future__ import annotations


def ceil_div(num: int, den: int) -> int:
    """``num / den`` rounded up, in integers: whole blocks for tokens, groups for values, steps for work."""
    return -(-num // den)
