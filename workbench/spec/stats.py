"""Acceptance statistics of speculative decoding, and the theory to hold them against.

If each drafted token is accepted with probability alpha, independently, *given that the ones before it were*,
a verification pass with K drafts emits on average

    E[tokens per target pass] = (1 - alpha^(K+1)) / (1 - alpha)

(the accepted prefix plus the one token the target always adds). That alpha is not accepted / drafted: the
drafts after the first rejection are never tested, and counting them as failures drags the ratio down (at
alpha = 0.5 and K = 4 the ratio is 0.23). Its estimate from the counts (the maximum-likelihood one for the
independence model) is accepted / tested, where a drafted token is *tested* when every draft before it was
accepted. The engine counts, per request and per draft position, how many tokens were drafted, tested and
accepted, so both rates and the measured tokens per pass can sit next to the formula at the measured alpha.
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


def expected_draft_acceptance(alpha: float, k: int) -> float:
    """accepted / drafted that the independence model predicts for per-token ``alpha`` and K drafts a pass."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return (expected_tokens_per_pass(alpha, k) - 1) / k


@dataclass(slots=True)
class SpecCounters:
    """Drafting outcome of one sequence (or summed over many)."""

    passes: int = 0  # verification passes (target forwards that checked drafts)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens produced by those passes (accepted + one from the target each)
    drafted_at: list[int] = field(default_factory=list)  # per draft position 1..K
    tested_at: list[int] = field(default_factory=list)  # drafted there with every earlier draft accepted
    accepted_at: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} must be within 0..drafted ({num_drafted})")
        self.passes += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.emitted += num_emitted
        self._widen(num_drafted)
        for i in range(num_drafted):
            self.drafted_at[i] += 1
        for i in range(min(num_drafted, num_accepted + 1)):
            self.tested_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    def _widen(self, size: int) -> None:
        """Keep the per-position lists as long as the longest draft seen."""
        size = max(size, len(self.drafted_at))
        for counts in (self.drafted_at, self.tested_at, self.accepted_at):
            counts.extend([0] * (size - len(counts)))

    def merge(self, other: SpecCounters) -> None:
        self.passes += other.passes
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.emitted += other.emitted
        self._widen(len(other.drafted_at))
        for mine, theirs in ((self.drafted_at, other.drafted_at), (self.tested_at, other.tested_at),
                             (self.accepted_at, other.accepted_at)):
            for i, n in enumerate(theirs):
                mine[i] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted: the share of drafted tokens that ended up in the output."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def alpha(self) -> float:
        """Accepted / tested: the per-token acceptance probability of the formula (see the module docstring)."""
        tested = sum(self.tested_at)
        return self.accepted / tested if tested else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted / self.passes if self.passes else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return self.emitted / self.passes if self.passes else float("nan")

    def per_position(self) -> pd.DataFrame:
        """Per draft position (1 = the first drafted token): how often a token drafted there was accepted
        (``acceptance_rate``), and how often it was accepted once tested (``alpha``)."""
        rows = [{"position": i + 1, "drafted": d, "tested": t, "accepted": a,
                 "acceptance_rate": a / d if d else float("nan"), "alpha": a / t if t else float("nan")}
                for i, (d, t, a) in enumerate(zip(self.drafted_at, self.tested_at, self.accepted_at, strict=True))]
        return pd.DataFrame(rows, columns=["position", "drafted", "tested", "accepted", "acceptance_rate", "alpha"])

    def summary(self, k: int) -> dict[str, float]:
        """Measured rates and tokens per pass beside the formula's prediction at the measured alpha and K."""
        alpha = self.alpha
        return {"passes": self.passes, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate, "alpha": alpha,
                "mean_accepted_length": self.mean_accepted_length,
                "tokens_per_pass_measured": self.tokens_per_pass,
                "tokens_per_pass_theory": expected_tokens_per_pass(alpha, k) if self.drafted else float("nan")}
