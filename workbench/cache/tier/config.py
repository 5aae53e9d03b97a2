"""What a second KV tier is and how it behaves, validated where it is written.

The second tier sits under the prefix cache: blocks the cache evicts are kept there instead of being dropped,
and a request whose prefix misses the device's cache but hits the tier gets those blocks copied back instead of
recomputed. Names follow the engines a user graduates to where they have one (vLLM's ``--kv-offloading-size`` in
GiB; SGLang HiCache's write policies ``write_back`` and ``write_through``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TIER_KINDS = ("host", "disk")
# write_back: a block is written to the tier when the prefix cache evicts it (and, at a clean shutdown, every cached
# block); write_through: every computed full block is written as soon as it is computed, so a crash loses nothing
# the tier had room for. HiCache offers the same two (``--hicache-write-policy``).
WRITE_POLICIES = ("write_back", "write_through")
# auto: restore when the measured restore time is below the measured recompute time (`workbench.cache.tier.rule`);
# always / never: for experiments that set one side against the other.
RESTORE_MODES = ("auto", "always", "never")
MAX_GIB = 4096.0


@dataclass(slots=True, frozen=True)
class KVOffloadConfig:
    """A second KV tier of ``size_gib`` GiB: ``host`` memory (pinned under a CUDA cache), or files on ``disk`` in
    ``directory`` (which survive a restart of the server). ``write_policy`` defaults to write_back for host memory
    (lost at exit anyway) and write_through for disk (what a restart finds does not depend on a clean shutdown)."""

    kind: str
    size_gib: float = 4.0
    directory: str | Path | None = None
    write_policy: str | None = None
    restore: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in TIER_KINDS:
            raise ValueError(f"kind must be one of {TIER_KINDS}, got {self.kind!r}")
        if not (isinstance(self.size_gib, int | float) and not isinstance(self.size_gib, bool)
                and 0 < self.size_gib <= MAX_GIB):
            raise ValueError(f"size_gib must be a number in (0, {MAX_GIB:g}] GiB, got {self.size_gib!r}")
        if self.kind == "disk" and not self.directory:
            raise ValueError("a disk tier needs a directory (--kv-offload-dir DIR)")
        if self.kind == "host" and self.directory:
            raise ValueError(f"a host-memory tier keeps no files: drop directory={str(self.directory)!r} "
                             "or use kind='disk'")
        policy = self.write_policy or ("write_through" if self.kind == "disk" else "write_back")
        if policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {self.write_policy!r}")
        object.__setattr__(self, "write_policy", policy)
        if self.restore not in RESTORE_MODES:
            raise ValueError(f"restore must be one of {RESTORE_MODES}, got {self.restore!r}")
        if self.directory is not None:
            object.__setattr__(self, "directory", Path(self.directory))

    @property
    def size_bytes(self) -> int:
        return int(self.size_gib * 2**30)
