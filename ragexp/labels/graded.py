"""A dataset's human scores, kept only for the outputs they graded.

A ``human`` entry of a dataset grades one answer: the one its ``graded`` field names (the sha256
of the answer and contexts, :func:`ragexp.records.graded_hash`, or that output itself), else the
case's recorded output. A run uses a case's scores only when the case's output in this run is that
one; the others are counted, by reason, and said once, beside the figures human scores feed.
Calibration and prediction-powered means are computed from the kept scores alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.metrics.calibration import labelled_metrics
from ragexp.records import Case, CaseResult

UNMATCHED = {
    "other_output": "graded another answer than this run's (human.graded differs)",
    "errored": "are on cases that errored in this run (no answer to grade)",
    "unsaid": "do not say what they graded (no human.graded, no recorded output)",
}
"""Why a case's dataset scores were left out -> how it is said."""


@dataclass
class DatasetLabels:
    """The dataset's human scores this run can use, and the ones it cannot."""

    human: dict[str, np.ndarray]
    """Metric -> (n,) scores of the cases whose output is the one graded, NaN elsewhere."""
    matched: int = 0
    """Labelled cases whose output in this run is the graded one."""
    unmatched: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNMATCHED, 0))
    """Reason -> labelled cases left out."""

    def unmatched_line(self, run_id: str) -> str | None:
        """What a reader of the run's human-score figures needs about the labelled cases left out,
        and what to do about them (None when none was)."""
        left = sum(self.unmatched.values())
        if not left:
            return None
        parts = [f"{count} {UNMATCHED[why]}" for why, count in self.unmatched.items() if count]
        total = left + self.matched
        return (
            f"human scores in the dataset: {left} of {total} labelled cases left out of calibration and "
            f"prediction-powered means: {'; '.join(parts)}. To weigh this run's answers against people's, "
            f"label them: ragexp label {run_id}"
        )


def dataset_labels(cases: Sequence[Case], results: Sequence[CaseResult], metrics: list[str]) -> DatasetLabels:
    """The dataset's ``human`` scores of the run's labellable ``metrics``, kept where the case's
    output in this run is the one they graded (module docstring)."""
    names = labelled_metrics(metrics)
    columns = {name: np.full(len(cases), math.nan) for name in names}
    labels = DatasetLabels(columns)
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        scores = {name: score for name, score in case.human.items() if name in columns}
        if not scores:
            continue
        if case.graded is None:
            labels.unmatched["unsaid"] += 1
        elif not result.ok or result.output is None:
            labels.unmatched["errored"] += 1
        elif result.output.graded_hash() != case.graded:
            labels.unmatched["other_output"] += 1
        else:
            labels.matched += 1
            for name, score in scores.items():
                columns[name][i] = score
    labels.human = {name: values for name, values in columns.items() if np.isfinite(values).any()}
    return labels
