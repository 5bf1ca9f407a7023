"""How many labels calibration has and needs, and the cases where people and the automatic score
disagree, over each metric's own population (as :func:`ragexp.metrics.calibration.assess` counts).

A disagreement is a labelled, scored case that falls on the other side of the calibration
threshold for people than for the automatic score: the cases behind the ``accuracy`` and κ figures
that are not agreements, the ones to read first when those figures are low.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.metrics.population import covered
from ragexp.metrics.registry import METRICS


@dataclass(frozen=True)
class Coverage:
    metric: str
    labelled: int
    """Cases of the metric's population with both a human and an automatic score."""
    needed: int
    """``calibration.min_labelled``: calibration and PPI need at least this many."""

    @property
    def enough(self) -> bool:
        return self.labelled >= self.needed

    def to_json(self) -> dict[str, Any]:
        return {"labelled": self.labelled, "needed": self.needed}


@dataclass(frozen=True)
class Disagreement:
    case_id: str
    metric: str
    human: float
    automatic: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.case_id, "metric": self.metric, "human": self.human, "automatic": self.automatic}


def _labelled(
    scores: dict[str, np.ndarray], human: dict[str, np.ndarray], unanswerable: np.ndarray
) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Per labelled metric: (name, human scores, automatic scores, the cases of its population
    that have both)."""
    for name, labels in human.items():
        if name not in scores or name not in METRICS:
            continue
        spec = METRICS[name]
        both = np.isfinite(labels) & np.isfinite(scores[name]) & covered(spec, unanswerable)
        yield name, labels, scores[name], both


def coverage(
    scores: dict[str, np.ndarray], human: dict[str, np.ndarray], unanswerable: np.ndarray, needed: int
) -> list[Coverage]:
    """Per labelled metric: the labelled, scored cases of its population, and how many are needed."""
    return [Coverage(name, int(both.sum()), needed) for name, _, _, both in _labelled(scores, human, unanswerable)]


def disagreements(
    case_ids: list[str],
    scores: dict[str, np.ndarray],
    human: dict[str, np.ndarray],
    unanswerable: np.ndarray,
    threshold: float,
) -> list[Disagreement]:
    """Labelled, scored cases whose pass/fail at ``threshold`` differs between people and the
    automatic score, metric by metric in case order."""
    found: list[Disagreement] = []
    for name, labels, automatic, both in _labelled(scores, human, unanswerable):
        differ = both & ((labels >= threshold) != (automatic >= threshold))
        found.extend(
            Disagreement(case_ids[i], name, float(labels[i]), float(automatic[i])) for i in np.flatnonzero(differ)
        )
    return found
