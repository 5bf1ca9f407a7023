"""Per-case scores for a run and the run's summary, from the registry's entries."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragexp.metrics.offline import OfflineInputs
from ragexp.metrics.population import covered
from ragexp.metrics.registry import MetricSpec


def score_cases(specs: Sequence[MetricSpec], inputs: OfflineInputs) -> dict[str, np.ndarray]:
    """Run each per-case offline scorer: name -> scores (NaN: no score)."""
    return {spec.name: spec.scorer(inputs) for spec in specs if spec.per_case and spec.scorer is not None}


def summarize(
    specs: Sequence[MetricSpec], scores: dict[str, np.ndarray], inputs: OfflineInputs, errored: np.ndarray
) -> dict[str, float | None]:
    """Run-level values; means leave out missing scores, never count them as zeros, and cover
    each metric's population (:mod:`ragexp.metrics.population`)."""
    summary: dict[str, float | None] = {}
    for spec in specs:
        if spec.run_value is not None:
            summary[spec.name] = spec.run_value(inputs, errored)
        elif spec.name in scores:
            summary[spec.name] = mean_or_none(scores[spec.name][covered(spec, inputs.unanswerable)])
    return summary


def mean_or_none(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None
