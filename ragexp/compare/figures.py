"""One way to print a figure, shared by the terminal tables, gate messages, the Markdown summary
and the JUnit report, so a value never reads 0.0000 in one place and 3.9e-06 in another."""

from __future__ import annotations

import math

DIGITS = 4


def fmt(value: float | None, digits: int = DIGITS) -> str:
    """Fixed decimals; a nonzero value that would round to zero is shown in scientific form."""
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    if value != 0 and rounds_to_zero(value, digits):
        return f"{value:.2e}"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    return f"{value:.{digits}f}"


def signed(value: float | None, digits: int = DIGITS) -> str:
    """Like :func:`fmt`, with an explicit sign (deltas and interval ends)."""
    if value is None:
        return "—"
    text = fmt(value, digits)
    return text if text.startswith("-") or not math.isfinite(value) else "+" + text


def rounds_to_zero(value: float, digits: int = DIGITS) -> bool:
    """True when the value prints as zero at the shared precision (a ratio against it means nothing)."""
    return abs(value) < 0.5 * 10.0**-digits


def threshold(value: float | None) -> str:
    """A configured bound, as the user wrote it (0.01, 0.2, 0)."""
    return "—" if value is None else f"{value:g}"
