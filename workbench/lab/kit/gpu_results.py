"""Measurements made on a lent GPU, stored as dated files, for a chapter to draw beside the learner's device.

Why it exists: the workbench runs on a laptop CPU, and several of its lessons come out differently on a GPU (the
ridge point, what batching buys, what recomputing costs). GPUs are lent rarely and briefly, so their
measurements are made in one prepared run (`benchmarks/gpu_session.py`, `benchmarks/gpu_chapters.py`) and
kept in ``datasets/gpu_results/<date>-<device>/<chapter>.json``, each file carrying its device, dtype, date,
library versions and the command that made it. A chapter asks for its newest file and labels whatever it
draws from it with that device and date: the GPU's numbers are never mixed up with the ones measured live.

Widget-free: the chapters' ``runs`` modules may use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workbench.paths import DATASETS_DIR

GPU_RESULTS_DIR = DATASETS_DIR / "gpu_results"
REQUIRED = ("chapter", "device", "dtype", "date", "versions", "command", "measurement")


@dataclass(frozen=True, slots=True)
class GpuResult:
    """One chapter's measurement on one GPU, as stored."""

    chapter: str
    device: str
    dtype: str
    date: str
    versions: dict
    command: str
    measurement: dict
    path: Path
    note: str = ""  # how the file was made when not by its command alone (e.g. converted from an older log)

    @property
    def label(self) -> str:
        """What every figure or sentence drawn from this file says about where it comes from."""
        return f"{self.device}, {self.dtype}, {self.date}"

    @classmethod
    def load(cls, path: Path) -> GpuResult:
        data = json.loads(Path(path).read_text())
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise ValueError(f"{path} is not a GPU result file: it lacks {', '.join(missing)}")
        if data.get("tiny"):
            raise ValueError(f"{path} holds a dry run's tiny shapes, not a measurement to show")
        return cls(chapter=data["chapter"], device=data["device"], dtype=data["dtype"], date=data["date"],
                   versions=data["versions"], command=data["command"], measurement=data["measurement"],
                   path=Path(path), note=data.get("note", ""))


def gpu_results(chapter: str, folder: Path = GPU_RESULTS_DIR) -> list[GpuResult]:
    """Every stored GPU measurement of ``chapter`` (e.g. ``"ch04"``), newest first."""
    found = [GpuResult.load(path) for path in sorted(Path(folder).glob(f"*/{chapter}.json"))]
    return sorted(found, key=lambda r: (r.date, r.path.parent.name), reverse=True)


def latest_gpu_result(chapter: str, folder: Path = GPU_RESULTS_DIR) -> GpuResult | None:
    """The newest stored GPU measurement of ``chapter``, or None when no GPU has measured it yet."""
    results = gpu_results(chapter, folder)
    return results[0] if results else None
