"""The book's chapter-4 numbers recomputed from the package: the decode floor of a model (weight bytes over
bandwidth), the book's 7B and 70B decode times beside it, where prefill and decode cross this device's ridge
point, and the book's streaming arithmetic. Computed, not timed (the ridge point is the measured one)."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import weight_bytes
from workbench.config import ModelSpec
from workbench.lab.kit.feasibility import DEVICES, check, smallest_feasible
from workbench.models import model_spec
from workbench.roofline import DevicePeaks, count_step, decode_work, prefill_work

# The book's decode claims: (model config, what it says a decode step takes on "a fast GPU", in ms).
SEED_DECODE_CLAIMS = (("llama-2-7b", 20.0, 30.0), ("llama-3-70b", 150.0, 200.0))
# A100 80GB: ~2 TB/s, the HBM bandwidth an A100 80GB is sold with (2.04 TB/s: workbench.lab.kit.feasibility).
A100_BYTES_PER_S = 2.0e12
SEED_GPU = "A100 80GB"  # the book's "fast GPU"


def decode_floor_ms(spec: ModelSpec, bytes_per_s: float, *, dtype: torch.dtype = torch.bfloat16) -> float:
    """Least time of a batch-1 decode step: every weight read once at ``bytes_per_s`` (KV and compute left out)."""
    if bytes_per_s <= 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return weight_bytes(spec, dtype) / bytes_per_s * 1e3


def seed_decode_claims(peaks: DevicePeaks, device: str = SEED_GPU) -> pd.DataFrame:
    """The book's 7B and 70B decode step times beside the floors weight bytes allow, and the bandwidth the
    book's times imply (weights / claimed time). The GPU floor is computed on the smallest deployment of
    ``device`` that holds the weights (`workbench.lab.kit.feasibility`): a 141 GB model on one 80 GB GPU is no
    deployment, so its floor is taken at the tensor-parallel degree it needs, each GPU reading half the weights."""
    rows = []
    for name, low, high in SEED_DECODE_CLAIMS:
        spec = model_spec(name)
        weights = weight_bytes(spec, torch.bfloat16)
        alone, fits = check(name, device), smallest_feasible(name, device)
        rows.append({"model (bf16)": name, "weights GB": weights / 1e9, "the book says (ms)": f"{low:.0f}-{high:.0f}",
                     "floor here (ms)": decode_floor_ms(spec, peaks.bytes_per_s),
                     f"on one {device}": "fits" if alone.fits else f"needs TP >= {alone.smallest_tp}",
                     "GPU floor (ms)": fits.decode_floor_ms,
                     "at TP": fits.tp,
                     "implied TB/s per GPU": f"{weights / fits.tp / high * 1e3 / 1e12:.2f}-"
                                             f"{weights / fits.tp / low * 1e3 / 1e12:.2f}"})
    return pd.DataFrame(rows).set_index("model (bf16)")


def implied_bandwidth_reading(table: pd.DataFrame, device: str = SEED_GPU) -> str:
    """How the bandwidth the book's times imply compares with the GPU's, read from ``seed_decode_claims``."""
    sold = DEVICES[device].bytes_per_s / 1e12
    top = max(float(v.split("-")[1]) for v in table["implied TB/s per GPU"])
    return (f"the book's times imply at most {top:.2f} TB/s per GPU, {top / sold:.0%} of the {sold:.2f} TB/s an "
            f"{device} is sold with")


def streaming_arithmetic(tokens: int = 300, tokens_per_s: float = 20.0, buffered_s: float = 3.0) -> dict[str, float]:
    """The book's streaming example: ``tokens`` at ``tokens_per_s`` take tokens / rate seconds; the rate that
    would make that equal to ``buffered_s``."""
    if tokens < 1 or tokens_per_s <= 0 or buffered_s <= 0:
        raise ValueError(f"need tokens >= 1, tokens_per_s > 0, buffered_s > 0; got {tokens}, {tokens_per_s}, "
                         f"{buffered_s}")
    return {"streamed_s": tokens / tokens_per_s, "buffered_s": buffered_s, "rate_for_equal_s": tokens / buffered_s}


def ridge_batch(spec: ModelSpec, peaks: DevicePeaks, *, context: int = 64, dtype: torch.dtype = torch.float32,
                limit: int = 4096) -> int:
    """Smallest decode batch whose arithmetic intensity reaches the ridge point (``limit`` + 1 if none does)."""
    for batch in range(1, limit + 1):
        if count_step(spec, decode_work(batch, context), dtype=dtype).intensity >= peaks.ridge:
            return batch
    return limit + 1


def ridge_prompt_length(spec: ModelSpec, peaks: DevicePeaks, *, dtype: torch.dtype = torch.float32,
                        limit: int = 1 << 16) -> int:
    """Shortest prompt whose whole-prompt prefill reaches the ridge point: shorter prefills are bandwidth-bound
    too (``limit`` + 1 if none up to ``limit`` does)."""
    lo, hi = 1, limit + 1  # intensity grows with the prompt length: bisect for the first length at the ridge
    while lo < hi:
        mid = (lo + hi) // 2
        if count_step(spec, prefill_work(mid), dtype=dtype).intensity >= peaks.ridge:
            hi = mid
        else:
            lo = mid + 1
    return lo
