"""Where the workbench finds its data and keeps its converted models.

``datasets/`` ships in the repository (configs, workloads, evaluation sets, draft weights). Converted model
weights are too large to commit and are made once per machine into a cache directory, which
``WORKBENCH_CACHE`` overrides (default ``~/.cache/kv-workbench``).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATASETS_DIR = REPO_ROOT / "datasets"
CONFIGS_DIR = DATASETS_DIR / "configs"


def cache_dir() -> Path:
    """Root of converted models; read from the environment each call so tests can redirect it."""
    env = os.environ.get("WORKBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kv-workbench"
