"""The cases a comparison of one metric pairs, and the cases it leaves out, by reason.

Every figure that compares two runs (both means, the delta, the interval, the p-value, the counts
of cases up and down, a gate's change rules) is taken over one population: the cases of the
metric's population (:func:`ragexp.metrics.population.covered`) that both runs scored. A case of
either run outside it is left out for one reason, counted and said: it errored (or was not
scored) in one run or both, a sequential run stopped before it, or it is not in both runs' cases.

:func:`pair_runs` works on the two runs' per-case values as given, so a caller that narrows the
cases first (``RunData.select``) gets its pairing over what it kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp.compare.data import RunData
from ragexp.metrics.population import ANSWERABLE_ONLY, Population, answerable_only, covered
from ragexp.metrics.registry import MetricSpec

REASONS = {
    "errored_baseline": "errored in the baseline",
    "errored_candidate": "errored in the candidate",
    "errored_both": "errored in both runs",
    "unscored_baseline": "not scored in the baseline",
    "unscored_candidate": "not scored in the candidate",
    "unscored_both": "not scored in either run",
    "not_evaluated_baseline": "not evaluated by the sequential baseline",
    "not_evaluated_candidate": "not evaluated by the sequential candidate",
    "only_baseline": "not in the candidate's cases",
    "only_candidate": "not in the baseline's cases",
}
"""Why a case of the metric's population is left out of the pairing, in the order they are said."""


@dataclass(frozen=True)
class Pairing:
    """One metric's paired population: the cases both runs scored, their means, and what was left out."""

    mask: np.ndarray = field(repr=False)
    """(n,) bool over the cases both runs hold (in the baseline's order): the pairs."""
    baseline: float | None
    """The baseline's mean over the pairs (None: no pair)."""
    candidate: float | None
    """The candidate's mean over the pairs (None: no pair)."""
    population: Population
    """``scored``: the pairs; ``cases``: the metric's population over both runs' cases; ``total``:
    every case of either run."""
    left_out: dict[str, int]
    """Reason (a key of :data:`REASONS`) -> cases of the population left out for it (non-zero only)."""

    @property
    def pairs(self) -> int:
        return self.population.scored

    @property
    def delta(self) -> float | None:
        """The mean paired difference, candidate - baseline."""
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    def left_out_words(self) -> str:
        """``11 left out: 6 errored in the candidate, 5 not evaluated by the sequential candidate``;
        empty when nothing was."""
        if not self.left_out:
            return ""
        parts = ", ".join(f"{count} {REASONS[reason]}" for reason, count in self.left_out.items())
        return f"{sum(self.left_out.values())} left out: {parts}"

    def words(self) -> str:
        """The population the comparison is on, then what it left out:
        ``24 of 35 (answerable); 6 left out: 6 errored in the candidate``."""
        left = self.left_out_words()
        return f"{self.population.words()}; {left}" if left else self.population.words()

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "left_out": sum(self.left_out.values()),
            "left_out_by_reason": dict(self.left_out),
        }


@dataclass(frozen=True)
class SharedCases:
    """Two runs narrowed to the cases they both hold, and how many of each run's cases are not."""

    baseline: RunData
    candidate: RunData
    """Both runs over the shared cases, in the baseline's order."""
    only_baseline: RunData
    only_candidate: RunData
    """Each run over its cases the other does not hold."""


def shared_cases(baseline: RunData, candidate: RunData) -> SharedCases:
    """The runs over the cases both hold, and each over its own remainder (computed once per comparison)."""
    if baseline.case_ids == candidate.case_ids:  # the usual pair: nothing to narrow or leave out
        none = np.empty(0, dtype=np.int64)
        return SharedCases(baseline, candidate, baseline.take(none), candidate.take(none))
    b_ids, c_ids = set(baseline.case_ids), set(candidate.case_ids)
    shared = [case_id for case_id in baseline.case_ids if case_id in c_ids]
    return SharedCases(
        baseline.select(shared),
        candidate.select(shared),
        baseline.select([case_id for case_id in baseline.case_ids if case_id not in c_ids]),
        candidate.select([case_id for case_id in candidate.case_ids if case_id not in b_ids]),
    )


def paired_mask(
    spec: MetricSpec | None, baseline: np.ndarray, candidate: np.ndarray, unanswerable: np.ndarray
) -> np.ndarray:
    """(n,) bool: the pairs of one metric over cases both runs hold, in one order: both scored it,
    and the case is in the metric's population. Every comparison pairs with this (``diff``, the
    gates, a sequential run's looks)."""
    mask: np.ndarray = np.isfinite(baseline) & np.isfinite(candidate) & covered(spec, unanswerable)
    return mask


def pair_metric(name: str, spec: MetricSpec | None, runs: SharedCases) -> Pairing | None:
    """The pairing of metric ``name`` over the runs' shared cases, with every case of its
    population either run holds outside the pairs counted by reason; None when either run has no
    per-case values for it (a run-level figure, or a metric one run did not measure)."""
    b_values, c_values = runs.baseline.per_case(name), runs.candidate.per_case(name)
    if b_values is None or c_values is None:
        return None
    base, cand = runs.baseline, runs.candidate
    within = covered(spec, base.unanswerable)
    b_scored, c_scored = np.isfinite(b_values), np.isfinite(c_values)
    mask = paired_mask(spec, b_values, c_values, base.unanswerable)
    left: dict[str, int] = {}

    def count(reason: str, where: np.ndarray) -> None:
        found = int(np.count_nonzero(where))
        if found:
            left[reason] = found

    b_errored, c_errored = base.errored.astype(bool), cand.errored.astype(bool)
    count("errored_baseline", within & ~b_scored & c_scored & b_errored)
    count("unscored_baseline", within & ~b_scored & c_scored & ~b_errored)
    count("errored_candidate", within & b_scored & ~c_scored & c_errored)
    count("unscored_candidate", within & b_scored & ~c_scored & ~c_errored)
    neither = within & ~b_scored & ~c_scored
    count("errored_both", neither & (b_errored | c_errored))
    count("unscored_both", neither & ~b_errored & ~c_errored)
    only_b = int(np.count_nonzero(covered(spec, runs.only_baseline.unanswerable)))
    only_c = int(np.count_nonzero(covered(spec, runs.only_candidate.unanswerable)))
    if only_b:
        left["not_evaluated_candidate" if _sequential(cand) else "only_baseline"] = only_b
    if only_c:
        left["not_evaluated_baseline" if _sequential(base) else "only_candidate"] = only_c
    ordered = {reason: left[reason] for reason in REASONS if reason in left}
    pairs = int(np.count_nonzero(mask))
    name_of = ANSWERABLE_ONLY if answerable_only(spec, base.unanswerable) else "all"
    total = len(base.case_ids) + len(runs.only_baseline.case_ids) + len(runs.only_candidate.case_ids)
    population = Population(pairs, pairs + sum(ordered.values()), total, name_of)
    b_mean = float(b_values[mask].mean()) if pairs else None
    c_mean = float(c_values[mask].mean()) if pairs else None
    return Pairing(mask, b_mean, c_mean, population, ordered)


def pair_runs(name: str, spec: MetricSpec | None, baseline: RunData, candidate: RunData) -> Pairing | None:
    """:func:`pair_metric` of two whole runs (one metric: the cases are narrowed here)."""
    return pair_metric(name, spec, shared_cases(baseline, candidate))


def _sequential(run: RunData) -> bool:
    """A run of ``run --until-decided``: it holds the cases it evaluated before it stopped."""
    return bool(run.record.tag("sequential.total"))
