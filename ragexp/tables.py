"""One table model, rendered for each place a table lands: the terminal, Markdown, HTML.

A table is built once (headers, columns, rows of plain-text cells) by the code that knows what it
shows, and every output renders the same rows with that output's escaping
(:mod:`ragexp.escape`), so a table never says one thing in the CLI and another in a report.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ragexp import escape

Kind = Literal["text", "code", "figure"]


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, which side its cells align to, and what its cells are."""

    header: str
    align: Literal["left", "right"] = "left"
    kind: Kind = "text"
    """``text``: words, escaped for each output. ``code``: identifiers or data (metric names, case
    ids, error bodies), a code span in Markdown and ``<code>`` in HTML, where nothing in them is a
    link. ``figure``: numbers from :mod:`ragexp.compare.figures`, shown as they are in Markdown when
    they hold nothing but what a figure holds, escaped like text otherwise."""


@dataclass(slots=True)
class Table:
    columns: Sequence[Column]
    rows: list[list[str]] = field(default_factory=list)
    """Plain text, one cell per column; each output escapes it."""

    @classmethod
    def plain(cls, headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> Table:
        """Text columns; ``align`` holds one ``l`` or ``r`` per column (default: all left)."""
        sides = align or "l" * len(headers)
        columns = [Column(h, "right" if side == "r" else "left") for h, side in zip(headers, sides, strict=True)]
        return cls(columns, [list(row) for row in rows])


def to_terminal(table: Table) -> str:
    """Columns padded to their widest cell (East Asian wide characters count two), two spaces
    apart, a rule of dashes under the headers; every cell through :func:`ragexp.escape.terminal`."""
    headers = [escape.terminal(column.header) for column in table.columns]
    rows = [[escape.terminal(cell) for cell in row] for row in table.rows]
    widths = [_width(header) for header in headers]
    for row in rows:
        widths = [max(width, _width(cell)) for width, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = []
        for cell, width, column in zip(cells, widths, table.columns, strict=True):
            pad = " " * (width - _width(cell))
            parts.append(pad + cell if column.align == "right" else cell + pad)
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def to_markdown(table: Table) -> list[str]:
    """GitHub-flavoured Markdown table lines; headers and cells through :func:`ragexp.escape.markdown`."""
    lines = ["| " + " | ".join(escape.markdown(column.header) for column in table.columns) + " |"]
    lines.append("|" + "---|" * len(table.columns))
    lines += [
        "| " + " | ".join(_markdown_cell(cell, column) for cell, column in zip(row, table.columns, strict=True)) + " |"
        for row in table.rows
    ]
    return lines


def to_html(table: Table) -> str:
    """One ``<table>``; headers and cells through :func:`ragexp.escape.html`."""
    head = "".join(f"<th>{escape.html(column.header)}</th>" for column in table.columns)
    body = "".join(
        "<tr>" + "".join(_html_cell(cell, column) for cell, column in zip(row, table.columns, strict=True)) + "</tr>"
        for row in table.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_FIGURE = re.compile(r"[\d.,+\-—/\[\] e]*|[+-]?inf")
"""What :mod:`ragexp.compare.figures` writes (``1,234.5``, ``-3.90e-06``, ``[+0.01, -0.02]``,
``0/7/23``, ``—``): nothing Markdown reads as syntax inside a table cell."""


def _markdown_cell(cell: str, column: Column) -> str:
    if column.kind == "code":
        return escape.markdown(cell, code=True) if cell else ""
    if column.kind == "figure" and _FIGURE.fullmatch(cell):
        return cell
    return escape.markdown(cell)


def _html_cell(cell: str, column: Column) -> str:
    text = escape.html(cell)
    return f"<td><code>{text}</code></td>" if column.kind == "code" and cell else f"<td>{text}</td>"


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
