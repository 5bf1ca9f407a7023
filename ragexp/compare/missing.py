"""Why a figure of a comparison is missing, in words: every ``—`` a table shows is explained.

A missing figure means one of several things (the run did not measure the metric, no case had
a score, the metric is a run-level percentile with no per-case pairs, too few pairs to detect
anything); the tables print ``—`` for each (:func:`ragexp.compare.figures.fmt`), and the lines
here, printed under the table, say which. ``--json`` carries the same reasons as ``why_missing``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ragexp.compare.figures import fmt
from ragexp.compare.power import detectable_words
from ragexp.metrics.registry import METRICS
from ragexp.phrases import t

if TYPE_CHECKING:
    from ragexp.compare.diff import DiffResult, MetricDiff


def metric_why(diff: DiffResult, m: MetricDiff, language: str = "en") -> dict[str, str]:
    """Each of the metric's missing figures (``baseline``, ``candidate``, ``delta``, ``ci``,
    ``p_value``, ``detectable_effect``) -> why it is missing; ``ci`` also when an end of the
    interval is infinite (``--json`` writes it as null)."""
    why: dict[str, str] = {}
    for side, run, value in (("baseline", diff.baseline, m.baseline), ("candidate", diff.candidate, m.candidate)):
        if value is None:
            measured = m.name in run.metrics
            why[side] = t(f"{'unscored' if measured else 'not_measured'}_{side}", language)
    if m.delta is None:
        why["delta"] = "; ".join(why[side] for side in ("baseline", "candidate") if side in why)
    spec = METRICS.get(m.name)
    if m.ci_low is None or m.ci_high is None or m.p_value is None or m.power is None:
        if spec is None or not spec.mean_of_cases:
            reason = t("run_level", language)
        elif m.paired_cases == 0:
            reason = why.get("candidate") or why.get("baseline") or t("no_pairs", language)
        else:
            reason = ""
        if reason:
            for field, missing in (
                ("ci", m.ci_low is None or m.ci_high is None),
                ("p_value", m.p_value is None),
                ("detectable_effect", m.power is None),
            ):
                if missing:
                    why[field] = reason
    if m.ci_low is not None and m.ci_high is not None and not math.isfinite(m.ci_high - m.ci_low):
        why["ci"] = t("ci_unbounded", language)
    if m.power is not None and m.power.detectable is None:
        why["detectable_effect"] = t("no_detectable", language, why=detectable_words(m.power, language))
    return why


def metric_legend(diff: DiffResult, language: str = "en") -> list[str]:
    """The lines under a metric table: one per metric with a missing figure, its reasons."""
    lines = []
    for m in diff.metrics:
        reasons = list(dict.fromkeys(metric_why(diff, m, language).values()))
        if reasons:
            lines.append(f"{m.name}: {'; '.join(reasons)}")
    legend = [t("dash_means", language), *lines] if lines else []
    return legend + own_means(diff)


def own_means(diff: DiffResult) -> list[str]:
    """A line per metric whose comparison left cases out: each run's own value over its own
    cases, labelled as such (the table's means are over the pairs)."""
    lines = []
    for m in diff.metrics:
        if m.pairing is None or not m.pairing.left_out:
            continue
        own = f"candidate {fmt(m.candidate_own)}"
        if m.candidate_population is not None:
            own += f" on {m.candidate_population.words()}"
        lines.append(
            f"{m.name}: compared on {m.pairing.pairs} pairs ({m.pairing.left_out_words()}); "
            f"each run's own value: baseline {fmt(m.baseline_own)}, {own}"
        )
    return lines


def case_legend(cases: Sequence[dict[str, Any]], language: str = "en") -> list[str]:
    """The line under the most regressed ``cases`` shown when one of their changes shows ``—``."""
    for case in cases:
        for values in case["metrics"].values():
            if values["baseline"] != values["candidate"] and None in (values["baseline"], values["candidate"]):
                return [t("dash_case", language)]
    return []
