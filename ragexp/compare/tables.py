"""The tables of a comparison, built once from a diff or a gate and rendered by each output
(``ragexp diff`` and ``gate`` in the terminal, the Markdown summaries, the report)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragexp.compare.figures import fmt, signed, threshold
from ragexp.phrases import t
from ragexp.tables import Column, Table

if TYPE_CHECKING:
    from ragexp.compare.diff import DiffResult, MetricDiff
    from ragexp.compare.gate import GateResult

_MARKS = {"better": "🟢 ", "worse": "🔴 ", "worse_ns": "🟠 ", "not_comparable": "⚪ "}
"""Emoji before a verdict, for pages that render them (GitHub); never in the report, whose fonts
have no emoji."""


def metric_table(diff: DiffResult, language: str, *, marks: bool = False) -> Table:
    """One row per metric: direction, both values, delta, interval, p-value, how many cases went
    up/down/stayed, the verdict, the smallest change the comparison could detect and the cases
    compared (the metric's population). ``marks``
    puts a coloured dot before a verdict that moved (for pages, not terminals)."""
    columns = [
        Column(t("metric", language), kind="code"),
        Column(t("better", language)),
        Column(t("baseline", language), "right", "figure"),
        Column(t("candidate", language), "right", "figure"),
        Column(t("delta", language), "right", "figure"),
        Column(t("ci", language, level=diff.confidence), kind="figure"),
        Column(t("p", language), "right", "figure"),
        Column(t("updown", language), kind="figure"),
        Column(t("moved", language)),
        Column(t("detectable", language), "right", "figure"),
        Column(t("compared", language)),
    ]
    return Table(columns, [_metric_row(m, language, marks) for m in diff.metrics])


def _metric_row(m: MetricDiff, language: str, marks: bool) -> list[str]:
    ci = f"[{signed(m.ci_low)}, {signed(m.ci_high)}]" if m.ci_low is not None and m.ci_high is not None else "—"
    verdict = m.verdict()
    return [
        m.name,
        t(f"better_{m.direction}", language),
        fmt(m.baseline),
        fmt(m.candidate),
        signed(m.delta),
        ci,
        fmt(m.p_value),
        f"{m.improved}/{m.regressed}/{m.unchanged}",
        (_MARKS.get(verdict, "") if marks else "") + t(f"moved_{verdict}", language),
        fmt(m.detectable_effect),
        m.compared() or t("run_figure", language),
    ]


def failure_table(result: GateResult, language: str) -> Table:
    """The rules that did not pass: metric, rule, outcome, both values, threshold, why."""
    return rule_table(result, language, everything=False)


def rule_table(result: GateResult, language: str, *, everything: bool = True) -> Table:
    """Every rule checked (``everything``; else those that did not pass): metric, rule, outcome,
    both values, threshold, why, and the cases compared."""
    columns = [
        Column(t("metric", language), kind="code"),
        Column(t("rule", language), kind="code"),
        Column(t("outcome", language)),
        Column(t("baseline", language), "right", "figure"),
        Column(t("candidate", language), "right", "figure"),
        Column(t("threshold", language), "right", "figure"),
        Column(t("why", language)),
        Column(t("compared", language)),
    ]
    rows = [
        [
            r.metric,
            r.rule,
            t(r.outcome, language),
            fmt(r.baseline),
            fmt(r.candidate),
            threshold(r.threshold),
            r.message,
            r.population or t("run_figure", language),
        ]
        for r in (result.rules if everything else result.failures)
    ]
    return Table(columns, rows)
