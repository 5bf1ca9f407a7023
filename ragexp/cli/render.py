"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragexp.datasets.audit import Finding
    from ragexp.metrics.calibration import Trust

from ragexp.compare.figures import fmt, signed
from ragexp.escape import terminal
from ragexp.metrics.registry import lookup
from ragexp.tables import Table, to_terminal

__all__ = ["fmt", "signed", "table", "terminal", "to_terminal"]


def duration(seconds: float) -> str:
    """Seconds for people: milliseconds below one second (in-process stages take microseconds)."""
    return f"{seconds * 1000:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Columns padded to width; ``align`` holds one 'l' or 'r' per column (default: left). Cells
    are shown with :func:`~ragexp.escape.terminal` (case ids, names and messages come from data)."""
    return to_terminal(Table.plain(headers, rows, align))


def scorer(names: Sequence[str]) -> str:
    """What scored these metrics, as ``judge`` or ``automatic`` before "scores" or "mean": ``judge`` only
    when an LLM judge scored every one of them (a rule such as answer_accuracy's fact match is no judge)."""
    judged = [lookup(name) for name in names]
    return "judge" if judged and all(spec is not None and spec.judge for spec in judged) else "automatic"


def _ppi_lines(trust: Trust) -> list[str]:
    """The prediction-powered means, worded by what scored them."""
    if not trust.ppi:
        return []
    lines: list[str] = []
    by = scorer(list(trust.ppi))
    lines += ["", f"prediction-powered means ({by} scores corrected by human scores):"]
    rows = [
        [
            name,
            fmt(e.judge_mean),
            fmt(e.mean),
            f"[{fmt(e.ci_low)}, {fmt(e.ci_high)}]",
            f"{e.n_labelled}/{e.n_total}",
        ]
        for name, e in trust.ppi.items()
    ]
    lines.append(table(["metric", f"{by} mean", "PPI mean", "CI", "labelled"], rows, "lrrll"))
    return lines


def trust_lines(
    trust: Trust, threshold: float, findings: Sequence[Finding] | None, labels_note: str | None = None
) -> list[str]:
    """Judge calibration, prediction-powered means and the label audit, for after the summary;
    ``labels_note`` (the dataset's human scores left out) after the figures they would feed."""
    lines: list[str] = []
    if trust.calibration:
        lines += ["", f"automatic score vs human scores (pass at >= {threshold:g}):"]
        rows = []
        for name, c in trust.calibration.items():
            ci = (
                ""
                if c.kappa_ci_low is None or c.kappa_ci_high is None
                else f"[{fmt(c.kappa_ci_low, 2)}, {fmt(c.kappa_ci_high, 2)}]"
            )
            rows.append(
                [
                    name,
                    str(c.n),
                    fmt(c.mae, 3),
                    signed(c.bias, 3),
                    fmt(c.spearman, 3),
                    fmt(c.accuracy, 3),
                    fmt(c.kappa, 3),
                    ci,
                ]
            )
        lines.append(
            table(["metric", "n", "MAE", "bias", "spearman", "accuracy", "kappa", "kappa CI"], rows, "lrrrrrrl")
        )
        if any(c.spearman is None for c in trust.calibration.values()):
            lines.append(
                f"— under spearman: the {scorer(list(trust.calibration))} scores or the people's are all the "
                "same (no ranks to correlate)"
            )
        if any(c.kappa is None for c in trust.calibration.values()):
            lines.append(
                f"— under kappa: {scorer(list(trust.calibration))} scores and people make one and the same "
                "pass/fail call on every case (agreement by chance is total, so kappa is undefined)"
            )
    lines += _ppi_lines(trust)
    if labels_note is not None:
        lines += ([] if trust.calibration or trust.ppi else [""]) + [terminal(labels_note)]
    if findings is not None:
        lines += ["", f"label audit: {len(findings)} finding(s)"]
        lines += [f"  warning: {terminal(finding)}" for finding in findings[:20]]
        if len(findings) > 20:
            lines.append(f"  ... and {len(findings) - 20} more (ragexp validate --corpus FILE lists them all)")
    return lines
