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

Token trees (`workbench.spec.tree`) are counted per depth the same way (drafted = nodes at that depth; tested =
the pass reached that depth with candidates to try; accepted = it kept one), and also by the rank of the
candidate kept, with the rank paths of every node drafted: enough to hold the measured tokens per pass against
the tree's expected yield, 1 + the sum over its nodes of the product of per-depth, per-rank acceptance along
the path (`expected_tokens_by_rank`; for a chain this is the same independence model with alpha per depth).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from workbench.spec.tree import expected_tree_tokens


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
    accepted_rank_at: list[list[int]] = field(default_factory=list)  # per depth: passes that kept a rank-r candidate
    node_paths: dict[tuple[int, ...], int] = field(default_factory=dict)  # rank path -> passes that drafted it

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
            self._count_rank(i, 0)
        for i in range(num_drafted):
            path = (0,) * (i + 1)
            self.node_paths[path] = self.node_paths.get(path, 0) + 1

    def record_tree(self, rank_paths: list[tuple[int, ...]], accepted_ranks: list[int], tested_last: bool,
                    num_emitted: int) -> None:
        """One tree pass: the rank path of every drafted node, the ranks of the candidates kept from depth 1 on,
        whether the last node reached had candidates that were tried, and the tokens emitted."""
        depth = max((len(p) for p in rank_paths), default=0)
        accepted = len(accepted_ranks)
        if accepted > depth or tuple(accepted_ranks) not in set(rank_paths) | {()}:
            raise ValueError(f"accepted ranks {accepted_ranks} are not a path of the drafted tree")
        self.passes += 1
        self.drafted += len(rank_paths)
        self.accepted += accepted
        self.emitted += num_emitted
        self._widen(depth)
        for path in rank_paths:
            self.drafted_at[len(path) - 1] += 1
            self.node_paths[path] = self.node_paths.get(path, 0) + 1
        for i in range(min(depth, accepted + int(tested_last))):
            self.tested_at[i] += 1
        for i, rank in enumerate(accepted_ranks):
            self.accepted_at[i] += 1
            self._count_rank(i, rank)

    def _count_rank(self, depth: int, rank: int, n: int = 1) -> None:
        while len(self.accepted_rank_at) <= depth:
            self.accepted_rank_at.append([])
        row = self.accepted_rank_at[depth]
        row.extend([0] * (rank + 1 - len(row)))
        row[rank] += n

    def acceptance_by_rank(self) -> list[list[float]]:
        """p[d][r]: how often, once the pass reached depth d + 1 with candidates, it kept the rank-r one."""
        return [[n / self.tested_at[d] if self.tested_at[d] else 0.0 for n in row]
                for d, row in enumerate(self.accepted_rank_at)]

    def expected_tokens_by_rank(self, acceptance: list[list[float]] | None = None) -> float:
        """Tokens per pass the drafted trees should yield under the per-depth, per-rank independence model, at
        the acceptance measured here (`acceptance_by_rank`) or at ``acceptance`` measured elsewhere (another
        run's table predicts what these trees would yield)."""
        if not self.passes:
            return float("nan")
        p = self.acceptance_by_rank() if acceptance is None else acceptance
        extra = sum(n * (expected_tree_tokens([path], p) - 1) for path, n in self.node_paths.items())
        return 1 + extra / self.passes

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
        for depth, row in enumerate(other.accepted_rank_at):
            for rank, n in enumerate(row):
                self._count_rank(depth, rank, n)
        for path, n in other.node_paths.items():
            self.node_paths[path] = self.node_paths.get(path, 0) + n

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
