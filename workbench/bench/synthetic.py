"""Synthetic load for the load drivers (`workbench.bench.drive`): random-token prompts with forced output lengths.

Random tokens make every request's length exact and its prefix uncached, so a run measures batching and not the
model's choice of when to stop: chapter 5's panels and tests/bench/test_load_drivers.py build their workloads here.
"""

from __future__ import annotations

import random

from workbench.workloads import WorkloadRequest

SPREADS = ("fixed", "uniform", "log-uniform")


def random_requests(n: int, *, prompt_tokens: int = 32, output_tokens: tuple[int, int] = (4, 32),
                    seed: int = 0, spread: str = "log-uniform", vocab_size: int = 49152) -> list[WorkloadRequest]:
    """Random-token prompts of a fixed length and forced output lengths in ``output_tokens``: ``log-uniform``
    (many short, a few long), ``uniform`` or ``fixed`` (every request the rounded mean). Token ids stay below
    ``vocab_size`` and away from the first 100 (special tokens in SmolLM2's vocabulary)."""
    if n < 1:
        raise ValueError(f"the number of requests must be >= 1, got {n}")
    lo, hi = output_tokens
    if not 1 <= lo <= hi:
        raise ValueError(f"output_tokens must be (lo, hi) with 1 <= lo <= hi, got {output_tokens}")
    rng = random.Random(seed)
    draws = {"log-uniform": lambda: lo * (hi / lo) ** rng.random(), "uniform": lambda: rng.uniform(lo, hi),
             "fixed": lambda: (lo + hi) / 2}
    if spread not in draws:
        raise ValueError(f"spread must be one of {sorted(draws)}, got {spread!r}")
    low, high = min(100, vocab_size // 2), min(30000, vocab_size)
    return [WorkloadRequest([rng.randrange(low, high) for _ in range(prompt_tokens)], int(round(draws[spread]())),
                            ignore_eos=True, tags={"shape": spread}) for _ in range(n)]
