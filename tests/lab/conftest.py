"""Fixtures of the lab's tests. The real model and tokenizer come from tests/conftest.py; this adds the one tiny
random model the chapters' panels are exercised on (2 layers of SmolLM2's shape: real shapes, seconds a run)."""

from __future__ import annotations

import pytest

import workbench


@pytest.fixture(scope="module")
def tiny_model():
    return workbench.random_model("smollm2-135m", num_layers=2, device="cpu")
