"""A chapter's closing table: each of the book chapter's key takeaways, what the chapter measured for it, and a
verdict from one vocabulary, computed from the chapter's own results.

Four verdicts, the same in every chapter, so a reader can compare chapters at a glance:

- **holds**: the measurement shows what the book says;
- **holds with a caveat**: it shows it, with a condition the book leaves out (the note says which);
- **wrong**: the measurement contradicts the book (the note says what is true instead);
- **not measurable here**: this machine or model cannot show it (the note says why, and what would).

A verdict is a ``Verdict``, never a typed string, and ``Verdict.judge(evidence, caveat=...)`` reads it off the
chapter's measured ``Evidence`` (`workbench.lab.kit.evidence`): "holds" or "wrong" only when the effect clears its
noise margin, else "not measurable here". Every row carries that evidence, shown in an **evidence** column (n,
effect, margin), and a row whose verdict does not follow from its evidence is refused. The table is stored whole:
no cell is cut (pandas' default display truncates long text at 50 characters, which once left half the verdicts
unreadable in the stored notebooks).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from workbench.lab.kit.evidence import Evidence

COLUMNS = ("the book's takeaway", "measured here", "evidence (n, effect, margin)", "verdict")
CSS_CLASS = "closing-table"


class Verdict(StrEnum):
    HOLDS = "holds"
    CAVEAT = "holds with a caveat"
    WRONG = "wrong"
    NOT_MEASURABLE = "not measurable here"

    @classmethod
    def judge(cls, evidence: Evidence | Sequence[Evidence], *, caveat: bool = False) -> Verdict:
        """The verdict the evidence allows. With several pieces (a claim with several parts): WRONG when any part
        is resolved against the claim; HOLDS (CAVEAT when it holds under a condition the book omits) only when
        every part is resolved for it; otherwise NOT_MEASURABLE: some effect lies within its noise margin."""
        parts = as_parts(evidence)
        if any(e.resolved and not e.holds for e in parts):
            return cls.WRONG
        if all(e.resolved for e in parts):
            return cls.CAVEAT if caveat else cls.HOLDS
        return cls.NOT_MEASURABLE


def as_parts(evidence: Evidence | Sequence[Evidence]) -> tuple[Evidence, ...]:
    if isinstance(evidence, Evidence):
        parts: tuple = (evidence,)
    elif isinstance(evidence, (list, tuple)):
        parts = tuple(evidence)
    else:
        parts = ()
    if not parts or not all(isinstance(e, Evidence) for e in parts):
        raise ValueError(f"a verdict needs Evidence (workbench.lab.kit.evidence), got {evidence!r}")
    return parts


def unresolved_note(evidence: Evidence | Sequence[Evidence]) -> str:
    """Why a row is not measurable: each unresolved effect with its n and margin."""
    return "; ".join(
        f"{e.about} is within its noise here (n = {e.n_label}, effect {e._fmt(e.effect)}, margin "
        f"±{e._fmt_margin()})" if e.n else f"{e.about} is not measured here"
        for e in as_parts(evidence) if not e.resolved)


@dataclass(frozen=True, slots=True)
class Takeaway:
    """One row: the book's claim, what was measured (a sentence built from results), the verdict, the evidence
    it rests on, and a note that every verdict but HOLDS must carry (the caveat, the correction, or why it cannot
    be measured). The verdict must be one the evidence allows (``Verdict.judge``): a HOLDS or WRONG typed over
    evidence that says otherwise is refused."""

    claim: str
    measured: str
    verdict: Verdict
    note: str = ""
    evidence: tuple[Evidence, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            raise ValueError(f"verdict must be a Verdict ({', '.join(v.value for v in Verdict)}), "
                             f"got {self.verdict!r}")
        if not self.claim.strip() or not self.measured.strip():
            raise ValueError("a takeaway needs the book's claim and what was measured")
        object.__setattr__(self, "evidence", as_parts(self.evidence) if self.evidence else ())
        if not self.evidence:
            raise ValueError(f"a verdict needs its evidence (n, effect, margin): {self.claim!r}")
        allowed = Verdict.judge(self.evidence)
        if self.verdict is not Verdict.NOT_MEASURABLE and {self.verdict, allowed} != {Verdict.HOLDS, Verdict.CAVEAT} \
                and self.verdict is not allowed:
            raise ValueError(f"verdict {self.verdict.value!r} does not follow from its evidence, which allows "
                             f"{allowed.value!r}: {self.claim!r}")
        if self.verdict is not Verdict.HOLDS and not self.note.strip():
            raise ValueError(f"verdict {self.verdict.value!r} needs a note saying why ({self.claim!r})")

    @classmethod
    def judged(cls, claim: str, measured: str, evidence: Evidence | Sequence[Evidence], *, caveat: bool = False,
               caveat_note: str = "", wrong_note: str = "", unmeasurable_note: str = "") -> Takeaway:
        """A row whose verdict is ``Verdict.judge(evidence, caveat=caveat)`` and whose note matches it; a row the
        noise leaves open says which effect and margin (and ``unmeasurable_note``: what would measure it)."""
        verdict = Verdict.judge(evidence, caveat=caveat)
        if verdict is Verdict.NOT_MEASURABLE:
            note = "; ".join(x for x in (unresolved_note(evidence), unmeasurable_note) if x)
        else:
            note = {Verdict.WRONG: wrong_note, Verdict.CAVEAT: caveat_note}.get(verdict, "")
        return cls(claim, measured, verdict, note, as_parts(evidence))

    @property
    def verdict_text(self) -> str:
        return f"{self.verdict.value}: {self.note}" if self.note else self.verdict.value

    @property
    def evidence_text(self) -> str:
        return " | ".join(e.text() for e in self.evidence)


class ClosingTable:
    """The rows of a chapter's closing table; displays as a full HTML table (and full plain text). A chapter
    without a seed chapter names whose claims its first column holds (``claim_header``)."""

    def __init__(self, rows: list[Takeaway], *, claim_header: str = COLUMNS[0]) -> None:
        if not rows:
            raise ValueError("a closing table needs at least one takeaway")
        self.rows = list(rows)
        self.columns = (claim_header, *COLUMNS[1:])

    @property
    def verdicts(self) -> list[Verdict]:
        return [row.verdict for row in self.rows]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([(r.claim, r.measured, r.evidence_text, r.verdict_text) for r in self.rows],
                            columns=list(self.columns))

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        lines = []
        for i, row in enumerate(self.rows, 1):
            lines += [f"{i}. {row.claim}", f"   measured here: {row.measured}", f"   evidence: {row.evidence_text}",
                      f"   verdict: {row.verdict_text}"]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>{html.escape(cell)}</td>"
                             for cell in (r.claim, r.measured, r.evidence_text, r.verdict_text)) + "</tr>"
            for r in self.rows)
        return f"<table class='{CSS_CLASS}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
