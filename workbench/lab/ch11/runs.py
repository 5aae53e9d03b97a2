"""Chapter 11's measurements without widgets: each tier's cost against the prefill (engine-side, in
`workbench.roofline.tier_costs`) and the same question on the GPUs whose files the project stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.roofline.tier_costs import (
    BLOCK_SIZE,
    LENGTHS,
    TIERS,
    TierCosts,
    crossover_frame,
    measure_tiers,
    slope,
)

__all__ = ["BLOCK_SIZE", "LENGTHS", "PCIE5_X16_BYTES_PER_S", "TIERS", "GpuCase", "TierCosts", "crossover_frame",
           "gpu_cases", "measure_tiers"]

# ------------------------------------------------------------------------------------------------ the GPU case
# PCIe 5.0 x16 (the H100 SXM's host link), per direction: 32 GT/s per lane, 16 lanes, 128b/130b encoding
# (PCI-SIG's base specification). A datasheet bound, not a measurement: no host-device copy has been timed on a
# lent GPU yet (benchmarks/gpu_chapters.py --chapter ch11 does).
PCIE5_X16_BYTES_PER_S = 32e9 * 16 / 8 * 128 / 130


@dataclass
class GpuCase:
    """Restore against recompute for a named model on a GPU, from stored measurements (and what is not one)."""

    model: str
    device: str
    source: str  # where the prefill times and bandwidths come from
    kv_bytes_per_token: int
    prefill: pd.DataFrame  # context, step_s (measured on that GPU)
    per_token_s: float
    host_bytes_per_s: float  # host-to-device
    host_measured: bool  # False: the PCIe datasheet figure
    hbm_bytes_per_s: float  # the device's measured copy bandwidth

    def recompute_s(self, tokens) -> np.ndarray:
        return np.asarray(tokens, dtype=float) * self.per_token_s

    def restore_s(self, tokens, bytes_per_s: float) -> np.ndarray:
        return np.asarray(tokens, dtype=float) * self.kv_bytes_per_token / bytes_per_s

    def ratio(self, tokens: int) -> float:
        """Recompute over restore from host memory, for a ``tokens``-token prefix."""
        return float(self.recompute_s(tokens) / self.restore_s(tokens, self.host_bytes_per_s))


def gpu_cases() -> list[GpuCase]:
    """Llama-3-8B (bf16) on every stored GPU roofline file (chapter 4's: the H100 of 2026-11-23, the H200 of
    2026-11-26): its measured prefill steps and copy bandwidth; the host link from a stored chapter-11 file of the
    same device when there is one, else PCIe 5.0's datasheet figure."""
    from workbench.cache.sizing import kv_bytes_per_token
    from workbench.lab.kit.gpu_results import gpu_results
    from workbench.models import model_spec

    links = {r.device: r for r in gpu_results("ch11")}
    cases = []
    for roofline in sorted(gpu_results("ch04"), key=lambda r: r.date):
        m = roofline.measurement
        steps = pd.DataFrame(m["steps"])
        prefill = steps[steps["kind"] == "prefill"][["context", "ms"]].assign(step_s=lambda f: f["ms"] / 1e3)
        link = links.get(roofline.device)
        host = link.measurement["host_to_device_bytes_per_s"] if link is not None else PCIE5_X16_BYTES_PER_S
        source = roofline.label + (f"; host link measured {link.label}" if link else "; host link: PCIe 5.0 datasheet")
        cases.append(GpuCase(m["model"], roofline.device, source, kv_bytes_per_token(model_spec(m["model"]),
                             torch.bfloat16), prefill[["context", "step_s"]].reset_index(drop=True),
                             slope(prefill), host, link is not None, m["peak_bytes_per_s"]))
    return cases
