"""Reading the project's own data files under ``datasets/`` (prompt sets, workloads, evaluation texts)."""

from __future__ import annotations

import json

from workbench.paths import DATASETS_DIR


def prompt_sets() -> list[str]:
    return sorted(p.stem for p in (DATASETS_DIR / "prompts").glob("*.json"))


def load_prompts(name: str = "varied") -> list[str]:
    """The prompts of ``datasets/prompts/<name>.json``."""
    path = DATASETS_DIR / "prompts" / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown prompt set {name!r}: choose one of {prompt_sets()}")
    return list(json.loads(path.read_text())["prompts"])
