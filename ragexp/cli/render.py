"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragexp.datasets.audit import Finding
    from ragexp.metrics.calibration import Trust

from ragexp.compare.figures import fmt, signed
from ragexp.escape import terminal

__all__ = ["fmt", "signed", "table", "terminal"]


def duration(seconds: float) -> str:
    """Seconds for people: milliseconds below one second (in-process stages take microseconds)."""
    return f"{seconds * 1000:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Columns padded to width; ``align`` holds one 'l' or 'r' per column (default: left). Cells
    are shown with :func:`~ragexp.escape.terminal` (case ids, names and messages come from data)."""
    headers = [terminal(h) for h in headers]
    rows = [[terminal(cell) for cell in row] for row in rows]
    widths = [_width(h) for h in headers]
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


def trust_lines(trust: Trust, threshold: float, findings: Sequence[Finding] | None) -> list[str]:
    """Judge calibration, prediction-powered means and the label audit, for after the summary."""
    lines: list[str] = []
    if trust.calibration:
        lines += ["", f"automatic score vs human scores (pass at >= {threshold:g}):"]
        rows = []
        for name, c in trust.calibration.items():
            kappa = "—" if c.kappa is None else f"{c.kappa:.3f}"
            ci = (
                ""
                if c.kappa_ci_low is None or c.kappa_ci_high is None
                else f"[{c.kappa_ci_low:.2f}, {c.kappa_ci_high:.2f}]"
            )
            rho = "—" if c.spearman is None else f"{c.spearman:.3f}"
            rows.append([name, str(c.n), f"{c.mae:.3f}", f"{c.bias:+.3f}", rho, f"{c.accuracy:.3f}", kappa, ci])
        lines.append(
            table(["metric", "n", "MAE", "bias", "spearman", "accuracy", "kappa", "kappa CI"], rows, "lrrrrrrl")
        )
    if trust.ppi:
        lines += ["", "prediction-powered means (judge corrected by human scores):"]
        rows = [
            [name, fmt(e.judge_mean), fmt(e.mean), f"[{e.ci_low:.4f}, {e.ci_high:.4f}]", f"{e.n_labelled}/{e.n_total}"]
            for name, e in trust.ppi.items()
        ]
        lines.append(table(["metric", "judge mean", "PPI mean", "CI", "labelled"], rows, "lrrll"))
    if findings is not None:
        lines += ["", f"label audit: {len(findings)} finding(s)"]
        lines += [f"  warning: {terminal(finding)}" for finding in findings[:20]]
        if len(findings) > 20:
            lines.append(f"  ... and {len(findings) - 20} more (ragexp validate --corpus FILE lists them all)")
    return lines
