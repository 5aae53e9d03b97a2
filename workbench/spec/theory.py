"""What speculative decoding should buy, from three numbers: acceptance, draft cost and verification cost.

A plain decode step costs one target forward over one position per sequence; call its time t. A speculative
step runs K draft steps and then one target forward over the newest token plus the K drafts, and emits on
average E = (1 - α^(K+1)) / (1 - α) tokens (`workbench.spec.stats`). With the draft's cost per drafted token
c·t and the verifying forward r(K)·t, the time per emitted token falls from t to (r + K·c)·t / E:

    speedup = E(α, K) / (r(K) + K·c)

The textbook form takes r = 1: verifying K + 1 positions costs what one position costs, which holds while a
forward is bound by reading the weights (one read serves every position). Once a forward has enough positions
to be bound by arithmetic instead — a batch of sequences, each verifying K + 1 — r grows with K and the gain
shrinks; ``forward_cost`` gives the FLOPs and bytes that decide which side of that line a forward is on.

Everything here is arithmetic on numbers measured elsewhere (α from the engine's counters, c and r from its
step times); nothing imports a plotting library, so the engine can use it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from workbench.config import ModelSpec
from workbench.spec.stats import expected_tokens_per_pass

VerifyCost = float | Callable[[int], float]


def _check(alpha: float, k: int, c: float) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if not c >= 0:
        raise ValueError(f"the draft cost ratio c must be >= 0, got {c}")


def verify_ratio(verify_cost: VerifyCost, k: int) -> float:
    """r(K): a constant, or a function of K (e.g. measured forward times over K + 1 positions)."""
    r = float(verify_cost(k) if callable(verify_cost) else verify_cost)
    if not r > 0:
        raise ValueError(f"the verification cost ratio must be > 0, got {r} at K = {k}")
    return r


def speedup(alpha: float, k: int, c: float, verify_cost: VerifyCost = 1.0) -> float:
    """E(α, K) / (r(K) + K·c): decode speed with K drafts per pass relative to plain decoding (K = 0 gives 1)."""
    _check(alpha, k, c)
    if k == 0:
        return 1.0
    return expected_tokens_per_pass(alpha, k) / (verify_ratio(verify_cost, k) + k * c)


def best_k(alpha: float, c: float, *, k_max: int = 16, verify_cost: VerifyCost = 1.0) -> tuple[int, float]:
    """The K in 0..k_max with the highest modelled speedup, and that speedup (K = 0: do not speculate)."""
    if not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    options = [(speedup(alpha, k, c, verify_cost), -k) for k in range(k_max + 1)]
    best, negative_k = max(options)  # ties go to the smaller K: the same speed for less drafting work
    return -negative_k, best


def break_even_alpha(k: int, c: float, verify_cost: VerifyCost = 1.0, *, tol: float = 1e-9) -> float:
    """The per-token acceptance α below which K drafts per pass make decoding slower than plain decoding.

    E(α, K) grows from 1 (α = 0) to K + 1 (α = 1), so the break-even point E = r + K·c exists when
    1 <= r + K·c <= K + 1; below that range any acceptance pays (0.0), above it none does (nan)."""
    _check(0.0, k, c)
    if k == 0:
        raise ValueError("k must be >= 1: with no drafts there is nothing to break even on")
    cost = verify_ratio(verify_cost, k) + k * c
    if cost <= 1:
        return 0.0
    if cost > k + 1:
        return math.nan
    low, high = 0.0, 1.0
    while high - low > tol:
        mid = (low + high) / 2
        if expected_tokens_per_pass(mid, k) < cost:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True, slots=True)
class PassTimeline:
    """One speculative pass in milliseconds: K draft steps, one verifying forward, and what it yields."""

    tokens_per_pass: float
    pass_ms: float
    ms_per_token: float
    plain_ms_per_token: float

    @property
    def speedup(self) -> float:
        return self.plain_ms_per_token / self.ms_per_token


def pass_timeline(alpha: float, k: int, *, target_ms: float, draft_ms_total: float,
                  verify_ms: float | None = None) -> PassTimeline:
    """Time per token for a pass that drafts K tokens in ``draft_ms_total`` and verifies them in ``verify_ms``
    (default: ``target_ms``, verification as cheap as one plain step)."""
    if target_ms <= 0 or draft_ms_total < 0:
        raise ValueError(f"need target_ms > 0 and draft_ms_total >= 0, got {target_ms} and {draft_ms_total}")
    verify_ms = target_ms if verify_ms is None else verify_ms
    c = draft_ms_total / k / target_ms if k else 0.0
    _check(alpha, k, c)
    tokens = expected_tokens_per_pass(alpha, k)
    pass_ms = draft_ms_total + verify_ms
    return PassTimeline(tokens, pass_ms, pass_ms / tokens, target_ms)


@dataclass(frozen=True, slots=True)
class ForwardCost:
    """Arithmetic and memory traffic of one target forward (weights once, plus the KV it reads)."""

    positions: int
    flops: float
    weight_bytes: float
    kv_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: below the machine's ridge point the forward waits on memory."""
        return self.flops / self.bytes


def linear_params(spec: ModelSpec) -> int:
    """Weights every position multiplies through: the layers' projections and the LM head."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    per_layer = spec.hidden_size * (q + 2 * kv) + q * spec.hidden_size + 3 * spec.hidden_size * spec.intermediate_size
    return spec.num_layers * per_layer + spec.hidden_size * spec.vocab_size


def forward_cost(spec: ModelSpec, positions: int, *, bytes_per_param: float, context_tokens: int = 0,
                 kv_bytes_per_token: float = 0.0) -> ForwardCost:
    """FLOPs and bytes of one forward over ``positions`` new tokens that attend over ``context_tokens``.

    2 FLOPs per weight per position for the matrix products, plus QK^T and PV over the context; the weights
    are read once per forward however many positions share it, which is why extra positions start out free."""
    if not isinstance(positions, int) or positions < 1:
        raise ValueError(f"positions must be an integer >= 1, got {positions!r}")
    if context_tokens < 0 or bytes_per_param <= 0 or kv_bytes_per_token < 0:
        raise ValueError(f"need context_tokens >= 0, bytes_per_param > 0, kv_bytes_per_token >= 0, got "
                         f"{context_tokens}, {bytes_per_param}, {kv_bytes_per_token}")
    params = linear_params(spec)
    attention = 4 * spec.num_layers * spec.num_heads * spec.head_dim * (context_tokens + positions)
    return ForwardCost(positions, positions * (2 * params + attention), params * bytes_per_param,
                       (context_tokens + positions) * kv_bytes_per_token)
