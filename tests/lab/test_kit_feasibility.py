"""The kit's feasibility check and its caps: a figure for a named model on a named GPU is computed on a deployment
that fits, and a limit a sweep finds says whether a configured cap set it."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.lab.kit.caps import Cap, Limit
from workbench.lab.kit.feasibility import check, smallest_feasible


def test_a_141_gb_model_does_not_fit_one_80_gb_gpu_and_needs_tp_2():
    one = check("llama-3-70b", "A100 80GB")
    assert not one.fits and one.smallest_tp == 2 and "needs TP >= 2" in one.label
    two = smallest_feasible("llama-3-70b", "A100 80GB")
    assert two.fits and two.tp == 2
    assert two.decode_floor_ms == pytest.approx(141.1e9 / 2 / 2.039e12 * 1e3, rel=0.01)  # 34.6 ms
    assert two.below_floor(20.0) and not two.below_floor(40.0)


def test_batch_and_context_enter_the_check():
    small = check("llama-3-70b", "H100 SXM", tp=4, batch=1, context=8192)
    big = check("llama-3-70b", "H100 SXM", tp=4, batch=256, context=8192)
    assert small.fits and not big.fits and big.smallest_tp is None
    assert big.kv_bytes_per_gpu == 256 * small.kv_bytes_per_gpu
    assert check("llama-3-8b", "A100 80GB", dtype=torch.bfloat16).fits
    with pytest.raises(ValueError, match="unknown device"):
        check("llama-3-8b", "A200")
    with pytest.raises(ValueError, match="TP degree"):
        check("llama-3-8b", "A100 80GB", tp=3)


def test_a_limit_at_or_above_a_cap_is_the_caps():
    caps = (Cap("max_num_seqs", 16), Cap("the sweep's last level", 32))
    at = Limit("continuous batching's knee", 16, "users", caps)
    assert at.set_by_cap and "max_num_seqs = 16" in at.sentence() and "not by the hardware" in at.sentence()
    below = Limit("continuous batching's knee", 8, "users", caps)
    assert not below.set_by_cap and "below every cap" in below.sentence()
    none = Limit("a knee", math.nan, "users", caps)
    assert not none.set_by_cap and "none inside the sweep" in none.sentence()
    with pytest.raises(ValueError, match="name the caps"):
        Limit("a knee", 4, "users", ())
