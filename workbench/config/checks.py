"""The two checks every settings class uses: a condition that must hold, and "an integer that is not a bool"."""

from __future__ import annotations

from typing import Any


def require(ok: bool, message: str) -> None:
    """ValueError(``message``) unless ``ok``: messages name the value and the allowed range."""
    if not ok:
        raise ValueError(message)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
