"""A limit a sweep finds (a knee, a plateau, a saturation) belongs to the system only if no configured cap sets it.

Chapter 5 once found its batching modes' knees at 16 and 4 users and credited the CPU's ridge point; 16 was
``max_num_seqs`` and 4 the dynamic batcher's size. Chapter 6 ran every KV format at a batch of 16 sequences
and so never tested "a smaller cache, a larger batch, more throughput". So a sweep names the caps it ran under,
and a limit it reports is checked against them: a cap at or below the limit sets it (the engine could not go
past the cap, so nothing at or beyond it can be the hardware's), and the sentence says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cap:
    """One configured limit of a run: ``max_num_seqs`` 16, a dynamic batch of 4, a 64-block pool, a sweep's last
    level. ``value`` is in the unit of the limit it is compared with (sequences, users, tokens)."""

    name: str
    value: float

    def __post_init__(self) -> None:
        if not self.name.strip() or not self.value > 0:
            raise ValueError(f"a cap needs a name and a positive value, got {self.name!r} = {self.value!r}")

    def __str__(self) -> str:
        return f"{self.name} = {self.value:g}"


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit a measurement found (``what`` at ``value`` ``unit``) and the caps its run was configured with."""

    what: str
    value: float
    unit: str
    caps: tuple[Cap, ...]

    def __post_init__(self) -> None:
        if not self.caps:
            raise ValueError(f"{self.what}: name the caps the run ran under (there is always at least one)")
        object.__setattr__(self, "caps", tuple(self.caps))

    @property
    def binding(self) -> tuple[Cap, ...]:
        """The caps at or below the limit: each alone could have produced it."""
        return tuple(c for c in self.caps if not math.isnan(self.value) and c.value <= self.value)

    @property
    def set_by_cap(self) -> bool:
        return bool(self.binding)

    def sentence(self) -> str:
        """What sets the limit, said with the caps: the cap's, or below every cap."""
        if math.isnan(self.value):
            return f"{self.what}: none inside the sweep (caps: {_names(self.caps)})"
        where = f"{self.what} at {self.value:g} {self.unit}"
        if self.set_by_cap:
            return f"{where} is set by the configuration ({_names(self.binding)}), not by the hardware"
        return f"{where} lies below every cap ({_names(self.caps)}): the hardware and the workload set it"


def _names(caps: Iterable[Cap]) -> str:
    return ", ".join(str(c) for c in caps)
