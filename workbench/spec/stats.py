"""Acceptance statistics of speculative decoding, and the theory to hold them against.

If each drafted token is accepted with probability alpha independently, a verification pass with K drafts
emits on average

    E[tokens per target pass] = (1 - alpha^(K+1)) / (1 - alpha)

(the accepted prefix plus the one token the target always adds). The engine counts, per request and per draft
position, how many tokens were drafted and accepted, so the measured tokens per pass can sit next to this
formula evaluated at the measured alpha.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha); K + 1 when every draft is accepted."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(slots=True)
class SpecCounters:
    """Drafting outcome of one sequence (or summed over many)."""

    passes: int = 0  # verification passes (target forwards that checked drafts)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by those passes (accepted + one from the target each)
    drafted_at: list[int] = field(default_factory=list)  # per draft position 1..K
    accepted_at: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        self.passes += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.emitted += num_emitted
        self._widen(num_drafted)
        for i in range(num_drafted):
            self.drafted_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    def _widen(self, size: int) -> None:
        """Keep both per-position lists as long as the longest draft seen."""
        size = max(size, len(self.drafted_at))
        self.drafted_at.extend([0] * (size - len(self.drafted_at)))
        self.accepted_at.extend([0] * (size - len(self.accepted_at)))

    def merge(self, other: SpecCounters) -> None:
        self.passes += other.passes
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.emitted += other.emitted
        self._widen(len(other.drafted_at))
        for i, (d, a) in enumerate(zip(other.drafted_at, other.accepted_at, strict=True)):
            self.drafted_at[i] += d
            self.accepted_at[i] += a

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted: the per-token acceptance rate alpha."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted / self.passes if self.passes else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return self.emitted / self.passes if self.passes else float("nan")

    def per_position(self) -> pd.DataFrame:
        """Acceptance rate at each draft position (1 = the first drafted token)."""
        rows = [{"position": i + 1, "drafted": d, "accepted": a, "acceptance_rate": a / d if d else float("nan")}
                for i, (d, a) in enumerate(zip(self.drafted_at, self.accepted_at, strict=True))]
        return pd.DataFrame(rows, columns=["position", "drafted", "accepted", "acceptance_rate"])

    def summary(self, k: int) -> dict[str, float]:
        """Measured alpha and tokens per pass beside the formula's prediction for that alpha and K."""
        alpha = self.acceptance_rate
        return {"passes": self.passes, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": alpha, "mean_accepted_length": self.mean_accepted_length,
                "tokens_per_pass_measured": self.tokens_per_pass,
                "tokens_per_pass_theory": expected_tokens_per_pass(alpha, k) if self.drafted else float("nan")}
