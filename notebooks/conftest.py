"""nbval settings for the chapter notebooks: the sanitize file is found next to this conftest, so the
notebooks can be tested from any working directory (`pytest notebooks/ch02_kv_cache.ipynb`)."""

from __future__ import annotations

from pathlib import Path

SANITIZE_FILE = Path(__file__).with_name("nbval_sanitize.cfg")


def pytest_configure(config):
    if getattr(config.option, "nbval_sanitize_with", None) is None:
        config.option.nbval_sanitize_with = str(SANITIZE_FILE)
