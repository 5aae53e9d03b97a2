"""The baseline costs a chapter measured, recorded where every other chapter's can be compared with them.

The same model on the same CPU must cost the same in every chapter: a batch-1 decode step, and a prefill per
prompt token. Chapters measure these in their own ways (a roofline step, a TTFT sweep, a fitted cost model),
and once they disagreed 2x without a word. So each chapter shows the figures it measured in one line, and the
output carries them as metadata (``workbench_baseline``); ``notebooks/refresh_outputs.py`` lifts them into the
stored notebook's metadata, and ``tests/test_stored_notebooks.py`` fails when two chapters differ by more than
25% on the same figure. Warm-up runs are never part of these numbers.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass

METADATA_KEY = "workbench_baseline"
FIGURES = ("decode_step_ms", "prefill_ms_per_token")


@dataclass(frozen=True, slots=True)
class Baseline:
    """What one chapter measured: ``decode_step_ms`` (one batch-1 decode step) and ``prefill_ms_per_token``
    (a prefill step's time over its prompt tokens, at ``prefill_tokens``), where each comes from (``source``),
    on which machine and dtype. A figure the chapter does not measure is None."""

    chapter: str
    machine: str
    dtype: str
    source: str
    decode_step_ms: float | None = None
    prefill_ms_per_token: float | None = None
    prefill_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.decode_step_ms is None and self.prefill_ms_per_token is None:
            raise ValueError("a baseline needs at least one measured figure")
        for name in FIGURES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive measured time, got {value!r}")
        if self.prefill_ms_per_token is not None and not self.prefill_tokens:
            raise ValueError("prefill_ms_per_token needs the prompt length it was measured at (prefill_tokens)")

    def line(self) -> str:
        parts = []
        if self.decode_step_ms is not None:
            parts.append(f"batch-1 decode step {self.decode_step_ms:.1f} ms")
        if self.prefill_ms_per_token is not None:
            parts.append(f"prefill {self.prefill_ms_per_token:.2f} ms per token at {self.prefill_tokens:,} tokens")
        return (f"Baseline costs measured in this chapter ({self.dtype}, {self.machine}): " + ", ".join(parts)
                + f". Source: {self.source}.")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display({"text/plain": self.line(), "text/html": f"<p><i>{html.escape(self.line())}</i></p>"}, raw=True,
                metadata={METADATA_KEY: asdict(self)})


def stored_baselines(nb) -> list[dict]:
    """Every baseline a notebook's outputs carry (what refresh_outputs.py lifts into its metadata)."""
    return [out["metadata"][METADATA_KEY] for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if METADATA_KEY in out.get("metadata", {})]
