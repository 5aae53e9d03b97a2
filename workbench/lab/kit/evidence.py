"""What a verdict rests on: how many observations, how large the effect, how wide the noise around it, and the
settings that bounded the measurement.

A closing table once said "holds" from one target pass (16 vs 17 tokens), called a ratio of 0.96 a loss and
drew a TTFT verdict from single runs that the same notebook's next point reversed. So a verdict is no longer a
boolean: it is read off an ``Evidence``, which carries the effect, an interval around it and the value at which
the claim would neither hold nor fail (the *null*: 1 for a ratio, 0 for a difference, a threshold for a
rule). The claim is **resolved** only when that interval leaves the null out; then the side of the null the
effect lies on says "holds" or "wrong". Otherwise the row says "not measurable here" with n and the margin.

Where the interval comes from, one constructor each:

- ``exact``: arithmetic on configs, or counts the clock cannot move (a hit rate, a block count): no noise;
- ``repeats``: the same measurement taken several times (min, median, max of each arm);
- ``bootstrap``: many observations in one run (requests, token gaps), resampled for an interval of a statistic;
- ``proportions``: two rates from a few items each (recall at a length), with Wilson intervals;
- ``absent``: nothing here can measure it (the row can only be "not measurable here").

Timings on a shared 2-core machine wobble from run to run by more than a single run shows, so a timing's
interval is never narrower than ``TIMING_FLOOR`` of the effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# Identical work, timed in one stored run of chapter 4 (2026-11-25): decode steps of batch 1-8 at context 64,
# which cost the same FLOPs within 3%, took 32.3-38.5 ms (±9% around their median). A timing effect closer to its
# null than this is not read as a difference.
TIMING_FLOOR = 0.10
LEVEL = 0.90  # bootstrap and Wilson intervals: the central 90%
RESAMPLES = 2000

Expect = Literal["above", "below"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """One measured effect and its interval against the null at which the claim would flip.

    ``expect`` says on which side of the null the claim holds ("above": the effect must exceed it). ``n`` counts
    the observations behind the effect (``n_label`` says of what), ``basis`` how the interval was found,
    ``settings`` the configured limits the measurement ran under (a sweep's caps, a batch size)."""

    about: str
    effect: float
    low: float
    high: float
    null: float
    n: int
    n_label: str = "observations"
    expect: Expect = "above"
    unit: str = "x"
    basis: str = "exact"
    settings: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.about.strip():
            raise ValueError("evidence needs to say what its effect is (about)")
        if self.expect not in ("above", "below"):
            raise ValueError(f"expect must be 'above' or 'below', got {self.expect!r}")
        if self.n < 0:
            raise ValueError(f"n must be a count of observations >= 0, got {self.n}")
        if self.n and not (self.low <= self.effect <= self.high):
            raise ValueError(f"the interval [{self.low}, {self.high}] must contain the effect {self.effect}")

    # ------------------------------------------------------------------------------------------ constructors
    @classmethod
    def exact(cls, about: str, effect: float, null: float, *, expect: Expect = "above", n: int = 1,
              n_label: str = "", unit: str = "x", settings: Mapping[str, object] | None = None,
              basis: str = "exact") -> Evidence:
        """Arithmetic, or a count the clock cannot move: the interval is the effect itself."""
        return cls(about, float(effect), float(effect), float(effect), float(null), n, n_label, expect, unit, basis,
                   dict(settings or {}))

    @classmethod
    def repeats(cls, about: str, a: Sequence[float], b: Sequence[float] | None = None, *, null: float = 1.0,
                expect: Expect = "above", floor: float = TIMING_FLOOR, n_label: str = "runs",
                unit: str | None = None, settings: Mapping[str, object] | None = None) -> Evidence:
        """Repeated runs: the effect is median(a) (or median(a) / median(b)); the interval spans every repeat
        (min(a) / max(b) to max(a) / min(b)), and is at least ``floor`` of the effect either side."""
        a = _finite(a, "a")
        if b is None:
            effect, low, high, n = float(np.median(a)), min(a), max(a), len(a)
        else:
            b = _finite(b, "b")
            effect, low, high = float(np.median(a) / np.median(b)), min(a) / max(b), max(a) / min(b)
            n = min(len(a), len(b))
        low, high = _widen(effect, low, high, floor)
        label = f"{len(a)} vs {len(b)} {n_label}" if b is not None else f"{len(a)} {n_label}"
        return cls(about, effect, low, high, float(null), n, label, expect,
                   unit if unit is not None else ("x" if b is not None else ""),
                   f"min-max of repeats{_floor_note(floor)}", dict(settings or {}))

    @classmethod
    def bootstrap(cls, about: str, a: Sequence[float], b: Sequence[float] | None = None, *,
                  stat: Callable[[np.ndarray], float] = np.median, ratio: bool = True, null: float | None = None,
                  expect: Expect = "above", floor: float = TIMING_FLOOR, n_label: str = "requests",
                  unit: str | None = None, settings: Mapping[str, object] | None = None, seed: int = 0) -> Evidence:
        """Observations of one run resampled: the effect is stat(a), or stat(a) / stat(b) (``ratio``) or
        stat(a) - stat(b); the interval is the central ``LEVEL`` of ``RESAMPLES`` resampled effects."""
        xa = np.asarray(_finite(a, "a"))
        xb = None if b is None else np.asarray(_finite(b, "b"))
        rng = np.random.default_rng(seed)

        def effect_of(sa: np.ndarray, sb: np.ndarray | None) -> float:
            if sb is None:
                return float(stat(sa))
            return float(stat(sa) / stat(sb)) if ratio else float(stat(sa) - stat(sb))

        effect = effect_of(xa, xb)
        draws = [effect_of(rng.choice(xa, xa.size), None if xb is None else rng.choice(xb, xb.size))
                 for _ in range(RESAMPLES)]
        tail = (1 - LEVEL) / 2
        low, high = (float(np.quantile(draws, q)) for q in (tail, 1 - tail))
        low, high = _widen(effect, min(low, effect), max(high, effect), floor if (xb is None or ratio) else 0.0)
        if null is None:
            null = 1.0 if (xb is not None and ratio) else 0.0
        label = f"{xa.size} vs {xb.size} {n_label}" if xb is not None else f"{xa.size} {n_label}"
        return cls(about, effect, low, high, float(null), int(min(xa.size, xb.size) if xb is not None else xa.size),
                   label, expect, unit if unit is not None else ("x" if xb is not None and ratio else ""),
                   f"bootstrap {LEVEL:.0%}{_floor_note(floor)}", dict(settings or {}))

    @classmethod
    def proportions(cls, about: str, hits_a: int, n_a: int, hits_b: int, n_b: int, *, expect: Expect = "above",
                    n_label: str = "items", settings: Mapping[str, object] | None = None) -> Evidence:
        """A difference of two rates (a minus b) from a few items each, with Newcombe's interval built from each
        rate's Wilson interval: 2 items per length can never resolve a difference of one item."""
        if not (0 <= hits_a <= n_a and 0 <= hits_b <= n_b and n_a and n_b):
            raise ValueError(f"need 0 <= hits <= n and n > 0, got {hits_a}/{n_a} and {hits_b}/{n_b}")
        pa, pb = hits_a / n_a, hits_b / n_b
        (la, ua), (lb, ub) = _wilson(hits_a, n_a), _wilson(hits_b, n_b)
        diff = pa - pb
        low = diff - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
        high = diff + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
        return cls(about, diff, low, high, 0.0, min(n_a, n_b), f"{n_a} vs {n_b} {n_label}", expect, "",
                   f"Newcombe {LEVEL:.0%}", dict(settings or {}))

    @classmethod
    def rate_ratio(cls, about: str, events_a: float, count_a: int, events_b: float, count_b: int, *,
                   expect: Expect = "above", n_label: str = "passes",
                   settings: Mapping[str, object] | None = None) -> Evidence:
        """A ratio of two per-count rates (tokens per target pass: events over a Poisson count of passes), with
        the normal interval of its log, whose standard error is sqrt(1/count_a + 1/count_b): 16 against 17
        passes is a ratio of 1.06 give or take 0.5."""
        if count_a < 1 or count_b < 1 or events_a <= 0 or events_b <= 0:
            raise ValueError(f"need positive events and counts, got {events_a}/{count_a} and {events_b}/{count_b}")
        effect = (events_a / count_a) / (events_b / count_b)
        half = _Z * math.sqrt(1 / count_a + 1 / count_b)
        return cls(about, effect, effect * math.exp(-half), effect * math.exp(half), 1.0, min(count_a, count_b),
                   f"{count_a} vs {count_b} {n_label}", expect, "x", f"Poisson {LEVEL:.0%}", dict(settings or {}))

    @classmethod
    def absent(cls, about: str) -> Evidence:
        """Nothing here measures it: n = 0, and a row resting on it can only be 'not measurable here'."""
        return cls(about, math.nan, math.nan, math.nan, math.nan, 0, "observations", "above", "", "not measured")

    # ------------------------------------------------------------------------------------------- reading it
    @property
    def resolved(self) -> bool:
        """The interval leaves the null out: a rerun would put the effect on the same side of it. Exact evidence
        (no interval) is always resolved: an effect equal to the null is then a claim that did not hold."""
        return self.n > 0 and (self.low == self.high or not (self.low <= self.null <= self.high))

    @property
    def holds(self) -> bool:
        """The effect lies on the claim's side of the null (read only together with ``resolved``)."""
        return self.effect > self.null if self.expect == "above" else self.effect < self.null

    @property
    def margin(self) -> float:
        """The half-width of the interval on the null's side of the effect: how far noise may move it."""
        return self.effect - self.low if self.null <= self.effect else self.high - self.effect

    def _fmt(self, value: float) -> str:
        if self.unit == "x":
            return f"{value:.2f}x"
        if self.unit == "%":
            return f"{value:.0%}" if abs(value) >= 0.1 or value == 0 else f"{value:.2%}"
        if self.unit == "pts":
            return f"{100 * value:+.0f} points"
        return f"{value:.3g}{(' ' + self.unit) if self.unit else ''}"

    def text(self) -> str:
        """One line for the evidence column: n, effect against the null, margin and where the margin comes from."""
        if not self.n:
            return f"{self.about}: n = 0 (not measured here)"
        side = ">" if self.expect == "above" else "<"
        if self.low == self.high:
            spread = f"n = {self.n_label}, exact (no noise)" if self.n_label else "computed, exact (no noise)"
        else:
            spread = f"n = {self.n_label}, margin ±{self._fmt_margin()} ({self.basis})"
        caps = "; under " + ", ".join(f"{k} {v}" for k, v in self.settings.items()) if self.settings else ""
        return f"{self.about}: effect {self._fmt(self.effect)} (claim: {side} {self._fmt(self.null)}); {spread}{caps}"

    def _fmt_margin(self) -> str:
        if self.unit == "pts":
            return f"{100 * self.margin:.0f} points"
        if self.unit == "%":
            return f"{self.margin:.0%}"
        if self.unit == "x":
            return f"{self.margin:.2f}x"
        return f"{self.margin:.3g}{(' ' + self.unit) if self.unit else ''}"


def _finite(values: Sequence[float], name: str) -> list[float]:
    out = [float(v) for v in values]
    if not out or not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be a non-empty list of finite measurements, got {values!r}")
    return out


def _widen(effect: float, low: float, high: float, floor: float) -> tuple[float, float]:
    return min(low, effect - abs(effect) * floor), max(high, effect + abs(effect) * floor)


def _floor_note(floor: float) -> str:
    return f", at least ±{floor:.0%}" if floor else ""


_Z = 1.6448536269514722  # the normal quantile of LEVEL's upper tail (0.95)


def _wilson(hits: int, n: int) -> tuple[float, float]:
    z = _Z
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
