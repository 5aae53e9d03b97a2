"""Shared fixtures. The real model is loaded once per test session; if it is missing the tests fail (with
the command that makes it) rather than skip, so a broken set-up can never pass as green."""

from __future__ import annotations

import os

import torch

# Without CUDA, Triton kernels run in its interpreter on CPU tensors. triton.jit reads this when a kernel is
# defined (at import of its module), so it must be set before anything imports workbench_kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import workbench  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """Tiny matrices: one thread beats two, and avoids thread spinning on a shared, loaded machine (measured
    12 ms against 170 ms per engine step with other jobs running). Test modules of tiny random models opt in
    with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def real_model():
    model, _ = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    return model


@pytest.fixture(scope="session")
def tokenizer():
    return workbench.load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def reference_model():
    """transformers' LlamaForCausalLM on the same converted weights."""
    return workbench.load_reference_model("smollm2-135m", dtype=torch.float32, device="cpu")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
