"""Named ranges around the parts of an engine step, for profilers: ``schedule``, ``prepare``, ``forward``,
``sample``, ``verify``, ``postprocess`` (the names `workbench.monitoring.profiling` tabulates).

Under ``torch.profiler`` each range is a ``record_function`` (it shows as a row of ``key_averages()`` and a
span in the Chrome/Perfetto trace); on CUDA it is also an NVTX range, which Nsight Systems shows on its
timeline. With no profiler running a range must cost nothing measurable: ``record_function`` costs ~12 µs per
enter/exit on this project's 2-core CPU even when nothing records it (measured with ``timeit``, torch 2.13),
against ~1 µs for the flag check below, so the range is only opened when a profiler is on (or NVTX was
asked for, ``enable_nvtx``, which is what ``nsys profile`` needs since it does not turn torch's profiler on).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.profiler import record_function

# "draft" (the proposer; a draft model's own forward with speculation) is not in the list, but without it
# the ranges would not add up to the step when speculating.
STEP_RANGES = ("schedule", "draft", "prepare", "forward", "sample", "verify", "postprocess")
PREFIX = "engine."  # the profiler sees "engine.forward" etc., apart from torch's own operator names

_nvtx: dict[str, bool] = {"on": False}


def enable_nvtx(on: bool = True) -> None:
    """Emit NVTX ranges too (for ``nsys profile``); only has an effect where CUDA is available."""
    _nvtx["on"] = bool(on) and torch.cuda.is_available()


def _cuda() -> bool:
    if "cuda" not in _nvtx:
        _nvtx["cuda"] = torch.cuda.is_available()
    return _nvtx["cuda"]


def profiler_active() -> bool:
    return torch._C._autograd._profiler_enabled()


@contextmanager
def _profiled(name: str) -> Iterator[None]:
    nvtx = _nvtx["on"] or _cuda()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


def step_range(name: str):
    """A context manager naming one part of the step; a no-op unless a profiler (or NVTX) is on."""
    if name not in STEP_RANGES:
        raise ValueError(f"unknown step range {name!r}; the ranges are {STEP_RANGES}")
    if _nvtx["on"] or profiler_active():
        return _profiled(PREFIX + name)
    return nullcontext()
