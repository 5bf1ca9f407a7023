"""One way to print a figure, shared by the terminal tables, gate messages, the Markdown summaries,
the report and the JUnit file, so a value never reads 0.0000 in one place and 3.9e-06 in another."""

from __future__ import annotations

import math

DIGITS = 4


def fmt(value: float | None, digits: int = DIGITS) -> str:
    """The one rule for a figure people read.

    - No value (None, NaN: a mean over no scored case) prints as ``—``; infinities as ``inf`` and
      ``-inf``.
    - Zero, and every value from ``10**-digits`` up, prints with ``digits`` fixed decimals:
      ``0.0000``, ``1.0000``, ``0.5000``, ``-0.1167``.
    - A nonzero value that fixed decimals would print as zero keeps three significant digits in
      scientific form, so a tiny latency or p-value is never shown as nothing: ``3.90e-06``.
    - From 1,000 up in size, one decimal with thousands separators: ``1,234.6``.
    """
    if value is None or math.isnan(value):
        return "—"
    if math.isinf(value):
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
