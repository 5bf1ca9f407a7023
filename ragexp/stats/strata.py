"""Paired deltas by stratum (a route, a topic of production traffic): one paired comparison per
stratum and one over all of them, with Holm's adjustment over the strata, and the strata ordered
so that the largest credible regression comes first.

Each comparison pairs the cases both runs scored for the metric (a conversation's turns count
once together, as in :func:`ragexp.stats.paired.paired_by_unit`); a stratum none of whose cases
both runs scored has no delta and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp.stats.multiple import holm
from ragexp.stats.paired import PairedStats, paired, paired_by_unit


@dataclass(frozen=True)
class StratumDelta:
    """One stratum's paired comparison (candidate - baseline) of one metric."""

    stratum: str
    cases: int
    """Cases of the stratum in the sample."""
    stats: PairedStats | None
    """None: no case of the stratum was scored by both runs."""
    baseline: float | None = None
    """The baseline's mean over the paired cases."""
    candidate: float | None = None
    p_holm: float | None = None
    """The p-value adjusted by Holm over the strata (None for the overall row)."""
    regressed: bool = False
    """Worse in the metric's direction, with the Holm-adjusted p below 1 - confidence."""

    def to_json(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "stratum": self.stratum,
            "cases": self.cases,
            "n": stats.n if stats else 0,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "delta": stats.delta if stats else None,
            "ci_low": stats.ci_low if stats else None,
            "ci_high": stats.ci_high if stats else None,
            "p_value": stats.p_value if stats else None,
            "p_holm": self.p_holm,
            "regressed": self.regressed,
        }


@dataclass(frozen=True)
class MetricStrata:
    """A metric compared overall and per stratum, the strata worst first."""

    name: str
    direction: str
    overall: StratumDelta
    strata: list[StratumDelta] = field(default_factory=list)

    @property
    def worst(self) -> str | None:
        """The stratum with the largest credible regression (None: no stratum regressed)."""
        return self.strata[0].stratum if self.strata and self.strata[0].regressed else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "direction": self.direction,
            "overall": self.overall.to_json(),
            "strata": [row.to_json() for row in self.strata],
            "worst_stratum": self.worst,
        }


def by_stratum(
    name: str,
    direction: str,
    baseline: np.ndarray,
    candidate: np.ndarray,
    strata: Sequence[str],
    *,
    units: np.ndarray | None = None,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> MetricStrata:
    """``baseline`` and ``candidate``: (n,) per-case values aligned on the same cases, NaN where
    a run has no score; ``strata``: each case's stratum; ``units``: each case's conversation
    (None: every case its own). A stratum's ``n`` counts units (conversations), its delta cases."""
    labels = np.asarray(strata, dtype=object)

    def compare(mask: np.ndarray, stratum: str) -> StratumDelta:
        b, c = baseline[mask], candidate[mask]
        if units is None:
            stats = paired(b, c, resamples=resamples, confidence=confidence, seed=seed)
        else:
            stats = paired_by_unit(b, c, units[mask], resamples=resamples, confidence=confidence, seed=seed)
        both = np.isfinite(b) & np.isfinite(c)
        means = (float(b[both].mean()), float(c[both].mean())) if both.any() else (None, None)
        if stats is not None and units is not None:
            # The delta is the mean over the paired cases, as diff shows it; the test and the
            # interval count a conversation once (its turns are not independent).
            stats = PairedStats(stats.n, float((c[both] - b[both]).mean()), stats.ci_low, stats.ci_high, stats.p_value)
        return StratumDelta(stratum, int(mask.sum()), stats, *means)

    overall = compare(np.ones(len(labels), dtype=bool), "all")
    rows = [compare(labels == stratum, str(stratum)) for stratum in sorted(set(labels.tolist()))]
    tested = [index for index, row in enumerate(rows) if row.stats is not None]
    adjusted = holm([rows[index].stats.p_value for index in tested])  # type: ignore[union-attr]
    alpha = 1 - confidence
    sign = 1.0 if direction == "higher" else -1.0
    for index, p_holm in zip(tested, adjusted, strict=True):
        row = rows[index]
        worse = sign * row.stats.delta < 0  # type: ignore[union-attr]
        rows[index] = StratumDelta(
            row.stratum, row.cases, row.stats, row.baseline, row.candidate, p_holm, worse and p_holm < alpha
        )

    def order(row: StratumDelta) -> tuple[int, float, str]:
        # Credible regressions first, the largest drop first; then the rest, worst delta first.
        change = sign * row.stats.delta if row.stats is not None else float("inf")
        return (0 if row.regressed else 1, change, row.stratum)

    return MetricStrata(name, direction, overall, sorted(rows, key=order))


def aligned(case_ids: Sequence[str], values: Mapping[str, np.ndarray], order: Sequence[str]) -> dict[str, np.ndarray]:
    """Each metric's values re-ordered to ``order`` (NaN for a case the run lacks)."""
    where = {case_id: index for index, case_id in enumerate(case_ids)}
    picks = np.array([where.get(case_id, -1) for case_id in order], dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    for name, column in values.items():
        padded = np.append(column.astype(np.float64), np.nan)
        out[name] = padded[picks]
    return out
