"""How long one target forward takes for 1, 5, 20, 80 ... positions: why verifying drafts starts out free.

A decode step reads every weight once to produce one token per sequence. Verifying K drafts feeds K + 1
positions through the same weights, so while the forward is bound by that read the extra positions cost almost
nothing; once the positions (a batch of sequences, each with K + 1 of them) bring enough arithmetic per byte,
the forward becomes compute-bound and its time grows with the positions. This module measures the forward's
time against the number of positions on the notebook's device, and fits the two roofline ceilings to it: the
bandwidth the one-position forward implies, and the arithmetic rate the largest one reaches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.config import ModelSpec
from workbench.models.attention import NoCacheAttention
from workbench.spec.theory import forward_cost

POSITIONS = (1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64, 80, 128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def forward_seconds(model, positions: int, *, repeats: int = 2) -> float:
    """Fastest of ``repeats`` forwards over ``positions`` tokens, logits for every position included (verification
    needs a distribution at each). The minimum, because on a shared machine noise only ever adds time."""
    ids = torch.randint(0, model.spec.vocab_size, (positions,), generator=torch.Generator().manual_seed(positions))
    ids, pos = ids.to(model.device), torch.arange(positions, device=model.device)
    attention = NoCacheAttention([positions], model.attention_scale)
    times = []
    for _ in range(repeats):
        _sync(model.device)
        start = time.perf_counter()
        model.compute_logits(model(ids, pos, attention))
        _sync(model.device)
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass(slots=True)
class ForwardCurve:
    """Measured forward times and the roofline fitted to them."""

    frame: pd.DataFrame  # positions, ms, flops, bytes
    bandwidth: float  # bytes/s the one-position forward implies (weights over its time)
    flops_rate: float  # FLOP/s the largest forward reaches
    spec: ModelSpec
    bytes_per_param: float

    def ms(self, positions: float) -> float:
        """Measured time at ``positions``, interpolated between the measured points (log-log)."""
        frame = self.frame
        return float(np.exp(np.interp(np.log(positions), np.log(frame["positions"]), np.log(frame["ms"]))))

    def ratio(self, positions: int, baseline: int = 1) -> float:
        """Time of a forward over ``positions`` relative to one over ``baseline`` positions."""
        return self.ms(positions) / self.ms(baseline)

    def verify_cost(self, batch: int) -> Callable[[int], float]:
        """r(K) at a batch size: B sequences verifying K drafts each, against B sequences decoding one token."""
        return lambda k: self.ratio(batch * (k + 1), batch)

    def roofline_ms(self, positions: int) -> float:
        row = self.frame.iloc[0]
        cost = forward_cost(self.spec, positions, bytes_per_param=self.bytes_per_param)
        return 1e3 * max(row["bytes"] / self.bandwidth, cost.flops / self.flops_rate)

    @property
    def ridge_positions(self) -> float:
        """Positions where the two ceilings meet: below them a forward waits on memory."""
        one = self.frame.iloc[0]
        return self.flops_rate * one["bytes"] / self.bandwidth / one["flops"]


def forward_curve(model, positions: tuple[int, ...] = POSITIONS, *, repeats: int = 2,
                  progress=None) -> ForwardCurve:
    """Time the forward at each number of positions and fit bandwidth and arithmetic ceilings."""
    bytes_per_param = torch.empty(0, dtype=model.dtype).element_size()
    rows = []
    for i, n in enumerate(positions):
        if progress:
            progress(i, len(positions), f"forward over {n} positions")
        cost = forward_cost(model.spec, n, bytes_per_param=bytes_per_param)
        rows.append({"positions": n, "ms": 1e3 * forward_seconds(model, n, repeats=repeats), "flops": cost.flops,
                     "bytes": cost.bytes})
    _retime_stalls(model, rows, repeats)
    if progress:
        progress(len(positions), len(positions), f"{len(positions)} forward sizes timed")
    frame = pd.DataFrame(rows)
    first, last = frame.iloc[0], frame.iloc[-1]
    return ForwardCurve(frame, first["bytes"] / (first["ms"] / 1e3), last["flops"] / (last["ms"] / 1e3),
                        model.spec, bytes_per_param)


def _retime_stalls(model, rows: list[dict], repeats: int, *, retries: int = 3) -> None:
    """Time again any forward that came out slower than a forward over more positions (a subset of its work).

    On a shared CPU a forward now and then stalls for seconds (measured: 3.6 s for a 96-position forward whose
    other runs took 0.27 s), and one such point would bend every r read off the curve. The new timing is kept only
    if faster: noise only ever adds time."""
    for _ in range(retries):
        slow = [i for i, row in enumerate(rows) if any(row["ms"] > later["ms"] for later in rows[i + 1:])]
        if not slow:
            return
        for i in slow:
            rows[i]["ms"] = min(rows[i]["ms"], 1e3 * forward_seconds(model, rows[i]["positions"], repeats=repeats))

