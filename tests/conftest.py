"""Shared fixtures. The real model is loaded once per test session; if it is missing the tests fail (with
the command that makes it) rather than skip, so a broken set-up can never pass as green."""

from __future__ import annotations

import os

# `make test` runs the suite on pytest-xdist workers (see the Makefile). Each worker takes an equal share of the
# cores for torch: two workers at two threads each on 2 cores spin against each other (see one_torch_thread
# below for what spinning costs). Set in the environment before torch is imported, so that the kernels nbval and
# JupyterLab start inherit the same share (notebooks/conftest.py does the same when only notebooks are run).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(max(1, _cores // _WORKERS))

import torch  # noqa: E402

if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

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


# The longest files, handed out first under xdist (`--dist loadfile --no-loadscope-reorder` in the Makefile), so
# that the short ones fill in at the end instead of one worker finishing a notebook alone: each notebook under
# nbval (1-4 minutes on one thread), the browser and docs-site files (their Chromium and JupyterLab start-up), and
# lm-eval's (its three backends in a process of its own, 1-2 minutes).
_LONG_FILES = ("test_browser.py", "test_docs_site.py", "test_lm_eval.py")


def _long_first(item) -> int:
    return 0 if item.path.suffix == ".ipynb" else 1 if item.path.name in _LONG_FILES else 2


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_long_first)  # stable: cells and tests keep their order within a file
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
