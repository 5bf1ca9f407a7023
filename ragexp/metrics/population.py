"""Which cases a metric's run value covers: the one rule every place that shows a metric applies.

The article's rule: an unanswerable case has no relevant id, so a retrieval metric scores it on
its own row (1.0 for an empty ranking, the right behaviour; 0.0 for any ranking), and the run's
mean covers the answerable cases only (``population="answerable"``); with no answerable case at
all it covers every case. The run table, ``--json``, MLflow, traces, diff, gate and the report
each show this population beside the value: "30 of 35 (answerable)".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragexp.metrics.registry import MetricSpec

ANSWERABLE_ONLY = "answerable"


def covered(spec: MetricSpec | None, unanswerable: np.ndarray) -> np.ndarray:
    """(n,) bool: the cases ``spec``'s run value is taken over (all for an unknown metric)."""
    if spec is not None and spec.population == ANSWERABLE_ONLY and (~unanswerable).any():
        return ~unanswerable
    return np.ones(unanswerable.shape, dtype=bool)


def answerable_only(spec: MetricSpec | None, unanswerable: np.ndarray) -> bool:
    """The metric's run value leaves the unanswerable cases out (see :func:`covered`)."""
    return (
        spec is not None and spec.population == ANSWERABLE_ONLY and bool(unanswerable.any() and (~unanswerable).any())
    )


@dataclass(frozen=True)
class Population:
    """How many cases a metric's run value covers, out of the run's cases."""

    scored: int
    """Cases of the population with a score."""
    cases: int
    """Cases of the population."""
    total: int
    """Cases of the run."""
    name: str
    """``answerable`` or ``all``."""

    def words(self) -> str:
        """``30 of 35 (answerable)``; ``28 of 30 answerable (35 cases)`` when some have no score."""
        if self.name == ANSWERABLE_ONLY and self.cases < self.total:
            if self.scored == self.cases:
                return f"{self.scored} of {self.total} (answerable)"
            return f"{self.scored} of {self.cases} answerable ({self.total} cases)"
        return f"{self.scored} of {self.total}"

    def on(self) -> str:
        """`` on 30 of 35 (answerable)``: said after a mean or a change in a sentence (a gate's
        reason), so the figure carries the cases it was computed on."""
        return f" on {self.words()}"

    def to_json(self) -> dict[str, int | str]:
        return {"scored": self.scored, "cases": self.cases, "total": self.total, "population": self.name}


def population(spec: MetricSpec | None, scores: np.ndarray, unanswerable: np.ndarray) -> Population:
    """The population of ``spec``'s run value over per-case ``scores`` (NaN: no score)."""
    mask = covered(spec, unanswerable)
    name = ANSWERABLE_ONLY if answerable_only(spec, unanswerable) else "all"
    return Population(int(np.isfinite(scores[mask]).sum()), int(mask.sum()), int(unanswerable.size), name)
