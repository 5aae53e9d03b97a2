"""The speedup model, best K, break-even acceptance and forward cost, on cases worked out by hand."""

from __future__ import annotations

import math

import pytest

import workbench
from workbench.spec.theory import (
    best_k,
    break_even_alpha,
    forward_cost,
    linear_params,
    pass_timeline,
    speedup,
)


def test_speedup_with_free_verification_is_tokens_per_pass_over_draft_cost():
    # E(0.9, 4) = (1 - 0.9^5) / 0.1 = (1 - 0.59049) / 0.1 = 4.0951: the seed's "about 3.6" is wrong.
    assert speedup(0.9, 4, 0.0) == pytest.approx(4.0951)
    # E(0.5, 2) = 1 + 0.5 + 0.25 = 1.75, paid with 1 + 2 * 0.1 = 1.2 target steps.
    assert speedup(0.5, 2, 0.1) == pytest.approx(1.75 / 1.2)
    assert speedup(0.3, 0, 0.5) == 1.0  # no drafts, no change
    assert speedup(1.0, 3, 0.0) == pytest.approx(4.0)


def test_speedup_with_a_verification_cost_that_grows_with_k():
    # r(K) = 1 + K/4: verifying 3 positions costs 1.5 plain steps.
    assert speedup(0.5, 2, 0.0, verify_cost=lambda k: 1 + k / 4) == pytest.approx(1.75 / 1.5)
    assert speedup(0.5, 2, 0.1, verify_cost=1.3) == pytest.approx(1.75 / 1.5)


def test_best_k_on_hand_computed_cases():
    # alpha 0.5, c 0.1: K=1 1.5/1.1 = 1.364, K=2 1.75/1.2 = 1.458, K=3 1.875/1.3 = 1.442, then falling.
    k, best = best_k(0.5, 0.1)
    assert k == 2 and best == pytest.approx(1.75 / 1.2)
    # A poor draft that costs half a target step: no K pays, so do not speculate.
    assert best_k(0.1, 0.5) == (0, 1.0)
    # Free drafts and free verification: more is always better, up to the cap.
    assert best_k(0.8, 0.0, k_max=6)[0] == 6
    # Verification that grows linearly caps K even with free drafts: alpha 0.8, r = 1 + K/2 gives
    # K=1 1.8/1.5 = 1.2, K=2 2.44/2 = 1.22, K=3 2.952/2.5 = 1.18.
    k, best = best_k(0.8, 0.0, k_max=8, verify_cost=lambda k: 1 + k / 2)
    assert k == 2 and best == pytest.approx(1.22)


def test_break_even_alpha():
    # K = 1: E = 1 + alpha must reach 1 + c.
    assert break_even_alpha(1, 0.2) == pytest.approx(0.2, abs=1e-7)
    # K = 2: 1 + a + a^2 = 1.2  =>  a = (sqrt(1.8) - 1) / 2.
    assert break_even_alpha(2, 0.1) == pytest.approx((math.sqrt(1.8) - 1) / 2, abs=1e-7)
    assert break_even_alpha(4, 0.0) == 0.0  # free drafts, free verification: any acceptance pays
    assert math.isnan(break_even_alpha(2, 1.1))  # 1 + 2.2 > 3 tokens a pass could ever give
    # The threshold depends on K and c: there is no single "70%".
    assert break_even_alpha(4, 0.02) < 0.1 < break_even_alpha(4, 0.3)


def test_seed_timeline_recomputed():
    # The seed's example: 150 ms target step, ~20 ms to draft 4 tokens, alpha 0.9.
    line = pass_timeline(0.9, 4, target_ms=150, draft_ms_total=20)
    assert line.tokens_per_pass == pytest.approx(4.0951)
    assert line.pass_ms == 170 and line.ms_per_token == pytest.approx(170 / 4.0951)
    assert line.speedup == pytest.approx(150 * 4.0951 / 170)  # 3.61x, not the seed's 3.2x
    assert speedup(0.9, 4, 20 / 4 / 150) == pytest.approx(line.speedup)


def test_forward_cost_of_smollm2():
    spec = workbench.model_spec("smollm2-135m")
    # Per layer: q,k,v 576 x (576 + 2*192), o 576 x 576, gate/up/down 3 x 576 x 1536; LM head 576 x 49152.
    per_layer = 576 * 960 + 576 * 576 + 3 * 576 * 1536
    assert linear_params(spec) == 30 * per_layer + 576 * 49152 == 134_479_872
    one = forward_cost(spec, 1, bytes_per_param=4)
    assert one.weight_bytes == 4 * 134_479_872 and one.kv_bytes == 0
    assert one.flops == 2 * 134_479_872 + 4 * 30 * 9 * 64
    eighty = forward_cost(spec, 80, bytes_per_param=4)
    assert eighty.weight_bytes == one.weight_bytes  # the weights are read once however many positions
    assert eighty.intensity == pytest.approx(80 * one.intensity, rel=0.03)  # + attention over 80 positions
    assert one.intensity == pytest.approx(0.5, rel=0.01)  # fp32: 2 FLOPs per 4-byte weight


@pytest.mark.parametrize("call", [lambda: speedup(1.5, 4, 0.0), lambda: speedup(0.5, -1, 0.0),
                                  lambda: speedup(0.5, 4, -0.1), lambda: best_k(0.5, 0.1, k_max=-1),
                                  lambda: break_even_alpha(0, 0.1), lambda: speedup(0.5, 2, 0.0, verify_cost=0),
                                  lambda: forward_cost(workbench.model_spec("smollm2-135m"), 0, bytes_per_param=4)])
def test_bad_inputs_raise_value_errors(call):
    with pytest.raises(ValueError):
        call()
