"""'Try this' exercises whose answers the notebook checks.

Each chapter ends with exercises; prose alone cannot tell a learner whether their number is right. An
``Exercise`` holds the question, the right answer *computed by the package* (never typed in) and an
explanation; ``check(answer)`` returns a verdict that says right or wrong and why, and a hint while no answer
has been given.

    kv = Exercise("KV bytes per token of Llama-3-70B in bf16?", lambda: kv_bytes_per_token(spec, "bfloat16"),
                  why="2 (K and V) x 80 layers x 8 KV heads x 128 dims x 2 bytes", rel_tol=0.0)
    kv.check(327_680)   # -> right, with the reason
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, repr=False)
class Verdict:
    """The outcome of one check: ``correct`` is None while unanswered. Its text form (what a reader without a
    kernel or the HTML sees) is the same sentence as ``str``, not the dataclass's field dump."""

    question: str
    correct: bool | None
    message: str

    def __str__(self) -> str:
        mark = {True: "RIGHT", False: "NOT YET", None: "TO DO"}[self.correct]
        return f"[{mark}] {self.question}\n{self.message}"

    def __repr__(self) -> str:
        return str(self)

    def __bool__(self) -> bool:
        return bool(self.correct)

    def _repr_html_(self) -> str:
        color, mark = {True: ("#2ca02c", "✔ right"), False: ("#d62728", "✘ not yet"),
                       None: ("#7f7f7f", "… your turn")}[self.correct]
        return (f'<div style="border-left:4px solid {color};padding:4px 10px"><b style="color:{color}">{mark}</b> '
                f"— {html.escape(self.question)}<br>{html.escape(self.message)}</div>")


@dataclass(slots=True)
class Exercise:
    """A question with a computed answer. Numbers match within ``rel_tol`` (and ``abs_tol``); anything else by
    equality (strings case- and space-insensitively)."""

    question: str
    answer: Callable[[], Any]
    why: str
    hint: str = ""
    rel_tol: float = 0.02
    abs_tol: float = 0.0
    _cached: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not callable(self.answer):
            raise ValueError(f"Exercise.answer must be a function computing the answer, got {self.answer!r}")
        if self.rel_tol < 0 or self.abs_tol < 0:
            raise ValueError(f"tolerances must be >= 0, got rel_tol={self.rel_tol}, abs_tol={self.abs_tol}")

    def expected(self) -> Any:
        if self._cached is None:
            self._cached = self.answer()
        return self._cached

    def check(self, answer: Any) -> Verdict:
        if answer is None or answer is Ellipsis:
            return Verdict(self.question, None, "Not answered yet: replace the ... with your answer and re-run. "
                           + (f"Hint: {self.hint}" if self.hint else ""))
        expected = self.expected()
        if _matches(answer, expected, self.rel_tol, self.abs_tol):
            return Verdict(self.question, True, f"{_show(expected)} — {self.why}")
        return Verdict(self.question, False, f"you said {_show(answer)}, the package computes {_show(expected)}. "
                       f"{self.why}")


def _matches(answer: Any, expected: Any, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected
    if isinstance(expected, int | float) and isinstance(answer, int | float):
        return math.isclose(float(answer), float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, str) and isinstance(answer, str):
        return " ".join(answer.lower().split()) == " ".join(expected.lower().split())
    return answer == expected


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return repr(value)
