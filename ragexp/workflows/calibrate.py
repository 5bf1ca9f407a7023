"""``ragexp calibrate`` (:func:`calibrate_labels`): judge calibration and prediction-powered means from
the labels on a run's traces, logged on the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragexp.compare.comparisons import Say, silent
from ragexp.compare.data import load_run
from ragexp.labels.agreement import Coverage, Disagreement, coverage, disagreements
from ragexp.labels.collect import (
    Labels,
    calibrate_run,
    calibration_settings,
    collect_labels,
)
from ragexp.metrics.calibration import Trust
from ragexp.tracking.store import Store


@dataclass(frozen=True)
class Calibrated:
    run_id: str
    labels: Labels
    trust: Trust
    threshold: float
    """The run's calibration pass threshold."""
    logged: dict[str, float] = field(default_factory=dict)
    """The ``calibration.*`` and ``ppi.*`` metrics logged on the run (none: too few labels)."""
    coverage: list[Coverage] = field(default_factory=list)
    """Per labelled metric: the labelled, scored cases calibration counts, and how many it needs."""
    disagreements: list[Disagreement] = field(default_factory=list)
    """The labelled cases people and the automatic score put on opposite sides of the threshold."""

    def to_json(self) -> dict[str, Any]:
        labels = self.labels
        return {
            "run_id": self.run_id,
            "labels": labels.counts(),
            "own": labels.own,
            "carried_over": labels.carried,
            "ignored": labels.ignored,
            **self.trust.to_json(),
            "coverage": {c.metric: c.to_json() for c in self.coverage},
            "disagreements": [d.to_json() for d in self.disagreements],
        }


def calibrate_labels(run_id: str, *, tracking_uri: str | None = None, say: Say = silent) -> Calibrated:
    """Judge calibration and prediction-powered means from the labels on the run's traces, logged on it."""
    store = Store(tracking_uri)
    data = load_run(store, run_id)
    labels = collect_labels(store, data)
    if (line := labels.ignored_line()) is not None:
        say(line)
    trust = calibrate_run(data, labels)
    figures = trust.as_metrics()
    if figures:
        store.log_metrics(run_id, figures)
    settings = calibration_settings(data)
    return Calibrated(
        run_id,
        labels,
        trust,
        settings.threshold,
        figures,
        coverage(data.scores, labels.human, data.unanswerable, settings.min_labelled),
        disagreements(data.case_ids, data.scores, labels.human, data.unanswerable, settings.threshold),
    )
