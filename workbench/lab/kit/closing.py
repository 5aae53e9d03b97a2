"""A chapter's closing table: each of the seed chapter's key takeaways, what the chapter measured for it, and a
verdict from one vocabulary, computed from the chapter's own results.

Four verdicts, the same in every chapter, so a reader can compare chapters at a glance:

- **holds**: the measurement shows what the seed says;
- **holds with a caveat**: it shows it, with a condition the seed leaves out (the note says which);
- **wrong**: the measurement contradicts the seed (the note says what is true instead);
- **not measurable here**: this machine or model cannot show it (the note says why, and what would).

A verdict is a ``Verdict``, never a typed string, and ``Verdict.judge(holds, caveat=...)`` turns the chapter's
computed conditions into one. The table is stored whole: no cell is cut (pandas' default display truncates
long text at 50 characters, which once left half the verdicts unreadable in the stored notebooks).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

COLUMNS = ("the seed's takeaway", "measured here", "verdict")
CSS_CLASS = "closing-table"


class Verdict(StrEnum):
    HOLDS = "holds"
    CAVEAT = "holds with a caveat"
    WRONG = "wrong"
    NOT_MEASURABLE = "not measurable here"

    @classmethod
    def judge(cls, holds: bool, *, caveat: bool = False) -> Verdict:
        """WRONG when the claim fails, else HOLDS, or CAVEAT when it holds under a condition the seed omits."""
        if not holds:
            return cls.WRONG
        return cls.CAVEAT if caveat else cls.HOLDS


@dataclass(frozen=True, slots=True)
class Takeaway:
    """One row: the seed's claim, what was measured (a sentence built from results), the verdict, and a note
    that every verdict but HOLDS must carry (the caveat, the correction, or why it cannot be measured)."""

    claim: str
    measured: str
    verdict: Verdict
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            raise ValueError(f"verdict must be a Verdict ({', '.join(v.value for v in Verdict)}), "
                             f"got {self.verdict!r}")
        if not self.claim.strip() or not self.measured.strip():
            raise ValueError("a takeaway needs the seed's claim and what was measured")
        if self.verdict is not Verdict.HOLDS and not self.note.strip():
            raise ValueError(f"verdict {self.verdict.value!r} needs a note saying why ({self.claim!r})")

    @property
    def verdict_text(self) -> str:
        return f"{self.verdict.value}: {self.note}" if self.note else self.verdict.value


class ClosingTable:
    """The rows of a chapter's closing table; displays as a full HTML table (and full plain text)."""

    def __init__(self, rows: list[Takeaway]) -> None:
        if not rows:
            raise ValueError("a closing table needs at least one takeaway")
        self.rows = list(rows)

    @property
    def verdicts(self) -> list[Verdict]:
        return [row.verdict for row in self.rows]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([(r.claim, r.measured, r.verdict_text) for r in self.rows], columns=list(COLUMNS))

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        lines = []
        for i, row in enumerate(self.rows, 1):
            lines += [f"{i}. {row.claim}", f"   measured here: {row.measured}", f"   verdict: {row.verdict_text}"]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>{html.escape(cell)}</td>"
                             for cell in (r.claim, r.measured, r.verdict_text)) + "</tr>"
            for r in self.rows)
        return f"<table class='{CSS_CLASS}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
