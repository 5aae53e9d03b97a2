"""One registry of the costs every chapter that times the model measures, so that each can be compared with the
others.

The same model on the same CPU must cost the same in every chapter. Chapters measure it in their own ways (a
roofline step, a TTFT sweep, a fitted cost model, an engine run), and once disagreed 2x without a word; later a
cache hit made the rest of its prompt cost 39% more per token than another chapter's miss, unregistered and
unexplained. So each chapter shows the figures it measured in one line (a ``Baseline``), and the output carries
them as metadata (``workbench_baseline``); ``notebooks/refresh_outputs.py`` lifts them into the stored notebook's
metadata, and ``tests/test_stored_notebooks.py`` fails when two chapters differ by more than 25% on the same
figure, unless one of them stores an explanation of the difference with the figure (``explain``). Warm-up
runs are never part of these numbers.

The figures (``FIGURES``), each optional, each with the prompt length it was measured at where length matters:

- ``decode_step_ms``: one decode step at batch 1;
- ``decode_step_b16_ms``: one decode step at batch 16 (short contexts);
- ``prefill_ms_per_token``: a prefill of ``prefill_tokens`` (~1k) with nothing cached, over its tokens;
- ``prefill_cached_ms_per_token``: the prompt's new tokens after a cached prefix, over those tokens
  (``prefill_cached_tokens`` of them);
- ``ttft_miss_ms``: the time to first token of a ``ttft_tokens``-token (~1k) prompt with nothing cached.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

METADATA_KEY = "workbench_baseline"
FIGURES = ("decode_step_ms", "decode_step_b16_ms", "prefill_ms_per_token", "prefill_cached_ms_per_token",
           "ttft_miss_ms")
LENGTHS = {"prefill_ms_per_token": "prefill_tokens", "prefill_cached_ms_per_token": "prefill_cached_tokens",
           "ttft_miss_ms": "ttft_tokens"}
TOLERANCE = 1.25  # the same figure may differ by at most 25% between chapters, or explain why


@dataclass(frozen=True, slots=True)
class Baseline:
    """What one chapter measured (None: not measured here), where each figure comes from (``source``), on which
    machine and dtype, and ``explanations``: for a figure that is expected to differ from the other chapters',
    why (e.g. "replicas run one thread each"). A figure measured at a prompt length needs that length."""

    chapter: str
    machine: str
    dtype: str
    source: str
    decode_step_ms: float | None = None
    decode_step_b16_ms: float | None = None
    prefill_ms_per_token: float | None = None
    prefill_tokens: int | None = None
    prefill_cached_ms_per_token: float | None = None
    prefill_cached_tokens: int | None = None
    ttft_miss_ms: float | None = None
    ttft_tokens: int | None = None
    explanations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if all(getattr(self, name) is None for name in FIGURES):
            raise ValueError(f"a baseline needs at least one measured figure of {FIGURES}")
        for name in FIGURES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive measured time, got {value!r}")
            if value is not None and name in LENGTHS and not getattr(self, LENGTHS[name]):
                raise ValueError(f"{name} needs the prompt length it was measured at ({LENGTHS[name]})")
        unknown = set(self.explanations) - set(FIGURES)
        if unknown:
            raise ValueError(f"explanations name unknown figures {sorted(unknown)}: choose from {FIGURES}")

    def explain(self, **why: str) -> Baseline:
        """The same baseline with explanations stored beside figures that differ from other chapters'."""
        return Baseline(**{**asdict(self), "explanations": {**self.explanations, **why}})

    def line(self) -> str:
        parts = []
        if self.decode_step_ms is not None:
            parts.append(f"batch-1 decode step {self.decode_step_ms:.1f} ms")
        if self.decode_step_b16_ms is not None:
            parts.append(f"batch-16 decode step {self.decode_step_b16_ms:.1f} ms")
        if self.prefill_ms_per_token is not None:
            parts.append(f"prefill {self.prefill_ms_per_token:.2f} ms per token at {self.prefill_tokens:,} tokens")
        if self.prefill_cached_ms_per_token is not None:
            parts.append(f"{self.prefill_cached_ms_per_token:.2f} ms per new token after a cached prefix "
                         f"({self.prefill_cached_tokens:,} new tokens)")
        if self.ttft_miss_ms is not None:
            parts.append(f"TTFT {self.ttft_miss_ms:,.0f} ms for a {self.ttft_tokens:,}-token miss")
        why = "".join(f" Why {name} differs: {text}." for name, text in self.explanations.items())
        return (f"Baseline costs measured in this chapter ({self.dtype}, {self.machine}): " + ", ".join(parts)
                + f". Source: {self.source}.{why}")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display({"text/plain": self.line(), "text/html": f"<p><i>{html.escape(self.line())}</i></p>"}, raw=True,
                metadata={METADATA_KEY: asdict(self)})


def stored_baselines(nb) -> list[dict]:
    """Every baseline a notebook's outputs carry (what refresh_outputs.py lifts into its metadata)."""
    return [out["metadata"][METADATA_KEY] for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if METADATA_KEY in out.get("metadata", {})]


def disagreements(baselines: list[dict], tolerance: float = TOLERANCE) -> list[str]:
    """Pairs of chapters whose same figure (same dtype; at prompt lengths within 2x where length matters)
    differs by more than ``tolerance`` with no explanation stored beside either figure."""
    problems = []
    for i, a in enumerate(baselines):
        for b in baselines[i + 1:]:
            if a["dtype"] != b["dtype"] or a["chapter"] == b["chapter"]:
                continue
            for name in FIGURES:
                x, y = a.get(name), b.get(name)
                if not x or not y or max(x, y) <= tolerance * min(x, y):
                    continue
                if name in LENGTHS:
                    la, lb = a.get(LENGTHS[name]), b.get(LENGTHS[name])
                    if not la or not lb or max(la, lb) > 2 * min(la, lb):
                        continue
                if name in a.get("explanations", {}) or name in b.get("explanations", {}):
                    continue
                problems.append(f"{name}: {a['chapter']} {x:.3g} ({a['source']}) vs {b['chapter']} {y:.3g} "
                                f"({b['source']})")
    return problems


def coverage(baselines: list[dict]) -> dict[str, list[str]]:
    """For each figure, the chapters that recorded it."""
    return {name: sorted({b["chapter"] for b in baselines if b.get(name)}) for name in FIGURES}
