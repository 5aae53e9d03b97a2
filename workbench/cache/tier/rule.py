"""When restoring blocks from the tier beats recomputing them, from costs measured on this machine at start-up.

Restoring ``k`` blocks costs a fixed part (a call, a file opened, a transfer set up) plus ``k`` times the time
one block's bytes take to move: ``restore(k) = fixed + k * per_block``. Recomputing them costs the prefill of
their ``k * block_size`` tokens, ``k * block_size * prefill_s_per_token`` (the marginal cost: the forward that
computes the rest of the prompt runs either way). Both are measured when the tier starts — the transfer by
storing and restoring real blocks through the tier itself, the prefill by timing two prompt lengths on the engine
— so the rule answers for this device, this model and this tier, not for a constant in the source. Where restoring
a block is cheaper than recomputing it but the fixed part is not, short prefixes are recomputed and long ones
restored: ``crossover_blocks`` is where the two meet.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from workbench.cache.tier.config import RESTORE_MODES


@dataclass(frozen=True, slots=True)
class TransferCost:
    """``fixed_s + blocks * per_block_s`` seconds to move ``blocks`` blocks of ``bytes_per_block`` bytes."""

    fixed_s: float
    per_block_s: float
    bytes_per_block: int

    def seconds(self, blocks: int) -> float:
        return self.fixed_s + blocks * self.per_block_s if blocks else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_per_block / self.per_block_s if self.per_block_s > 0 else math.inf

    @classmethod
    def fit(cls, one_s: float, many_s: float, many: int, bytes_per_block: int) -> TransferCost:
        """From the time of 1 block and of ``many`` blocks: the slope per block, the rest fixed (never below 0)."""
        per_block = (many_s - one_s) / (many - 1) if many > 1 else many_s
        if per_block <= 0:  # noise larger than the difference: charge it all per block
            per_block = many_s / many
        return cls(max(0.0, one_s - per_block), per_block, bytes_per_block)


@dataclass(frozen=True, slots=True)
class RestoreRule:
    """Restore the blocks a tier holds, or recompute them: ``blocks_to_restore(available)``."""

    restore: TransferCost | None
    store: TransferCost | None
    prefill_s_per_token: float | None
    block_size: int
    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in RESTORE_MODES:
            raise ValueError(f"mode must be one of {RESTORE_MODES}, got {self.mode!r}")
        if self.mode == "auto" and (self.restore is None or self.prefill_s_per_token is None):
            raise ValueError("the auto rule needs the measured restore cost and prefill cost")

    def restore_s(self, blocks: int) -> float:
        return self.restore.seconds(blocks) if self.restore else math.nan

    def recompute_s(self, blocks: int) -> float:
        return blocks * self.block_size * self.prefill_s_per_token if self.prefill_s_per_token else math.nan

    def blocks_to_restore(self, available: int) -> int:
        if self.mode == "always":
            return available
        if self.mode == "never" or available <= 0:
            return 0
        return available if self.restore_s(available) < self.recompute_s(available) else 0

    @property
    def crossover_blocks(self) -> float:
        """The fewest blocks whose restore beats their recompute (inf: never; 1: always)."""
        if self.restore is None or not self.prefill_s_per_token:
            return math.nan
        gain = self.block_size * self.prefill_s_per_token - self.restore.per_block_s
        if gain <= 0:
            return math.inf
        return max(1, math.floor(self.restore.fixed_s / gain) + 1)

    def describe(self) -> str:
        if self.mode != "auto":
            return f"restore {self.mode}"
        r = self.restore
        return (f"restore {r.fixed_s * 1e3:.2f} ms + {r.per_block_s * 1e3:.3f} ms per block "
                f"({r.bytes_per_s / 1e9:.2f} GB/s) against recompute {self.prefill_s_per_token * 1e3:.2f} ms per "
                f"token: restore from {self.crossover_blocks:g} block(s) on")


def time_transfers(store_fn: Callable[[list[int], list[bytes]], None],
                   restore_fn: Callable[[list[int], list[bytes]], None], discard_fn: Callable[[list[bytes]], None],
                   blocks: list[int], bytes_per_block: int, repeats: int = 2) -> tuple[TransferCost, TransferCost]:
    """Store and restore 1 and ``len(blocks)`` blocks through the tier under scratch names, ``repeats`` times, the
    fastest kept (noise only adds time); the scratch entries are discarded after."""
    best: dict[tuple[str, int], float] = {}
    for _ in range(repeats):
        for count in (1, len(blocks)):
            names = [secrets.token_bytes(32) for _ in range(count)]
            start = time.perf_counter()
            store_fn(blocks[:count], names)
            middle = time.perf_counter()
            restore_fn(blocks[:count], names)
            end = time.perf_counter()
            discard_fn(names)
            for kind, seconds in (("store", middle - start), ("restore", end - middle)):
                best[kind, count] = min(best.get((kind, count), math.inf), seconds)
    many = len(blocks)
    return tuple(TransferCost.fit(best[kind, 1], best[kind, many], many, bytes_per_block)  # type: ignore[return-value]
                 for kind in ("store", "restore"))
