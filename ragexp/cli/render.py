"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from ragexp.compare.figures import fmt, signed

__all__ = ["fmt", "signed", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Columns padded to width; ``align`` holds one 'l' or 'r' per column (default: left)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, _width(cell)) for w, cell in zip(widths, row, strict=True)]
    align = align or "l" * len(headers)

    def line(cells: Sequence[str]) -> str:
        parts = []
        for cell, width, side in zip(cells, widths, align, strict=True):
            pad = " " * (width - _width(cell))
            parts.append(pad + cell if side == "r" else cell + pad)
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def _width(text: str) -> int:
    # East Asian wide characters take two terminal columns.
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
