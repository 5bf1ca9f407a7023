"""The cases a run missed: scored below full marks on a per-case metric, with what the case
expected and what came back (``ragexp run`` lists the worst few).

A case that errored is not among them: it has no score (it is an error, counted apart). Which
labels and outputs are shown for a metric follows from the fields the registry says it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp.metrics.registry import MetricSpec
from ragexp.records import Case, CaseResult, SystemOutput

TOLERANCE = 1e-9
MISSED_SHOWN = 5
"""How many missed cases ``ragexp run`` lists."""

EXPECTED: dict[str, tuple[str, Callable[[Case], Any]]] = {
    "relevant_ids": ("relevant ids", lambda case: case.relevant_ids),
    "relevant": ("evidence", lambda case: [f"{item.doc}: {item.span}" for item in case.relevant]),
    "expected_facts": ("facts", lambda case: case.expected_facts),
    "reference": ("reference", lambda case: case.reference or ""),
}
"""Label field a metric reads -> how it is shown and where it is in a case (in this order)."""
CAME_BACK: dict[str, tuple[str, Callable[[SystemOutput, int], Any]]] = {
    "retrieved_ids": ("retrieved", lambda output, k: output.ranked_ids[:k]),
    "citations": ("cited", lambda output, k: [_cited(output, i) for i in output.citations]),
    "response": ("answer", lambda output, k: output.answer),
    "retrieved_contexts": ("first context", lambda output, k: output.contexts[0] if output.contexts else ""),
}
"""Output field a metric reads -> how it is shown and where it is in the system's output."""


def _cited(output: SystemOutput, index: int) -> Any:
    """The id a citation points at (citations are 1-based indexes into the ranking)."""
    return output.ranked_ids[index - 1] if 0 < index <= len(output.ranked_ids) else index


REFUSAL = "a refusal (the case is unanswerable)"


@dataclass(frozen=True)
class MissedCase:
    case_id: str
    metrics: dict[str, float]
    """Metric -> the case's score, below full marks."""
    expected: dict[str, Any]
    """What the case's labels ask for, by what it is (``relevant ids``, ``facts``...)."""
    got: dict[str, Any]
    """What the system returned, by what it is (``retrieved``, ``answer``...)."""


@dataclass(frozen=True)
class Missed:
    count: int = 0
    """Cases scored below full marks on at least one metric."""
    first: list[MissedCase] = field(default_factory=list)
    """The worst of them, worst first (:func:`missed_cases`)."""


def below_full_marks(
    specs: Sequence[MetricSpec], scores: Mapping[str, np.ndarray], cases: Sequence[Case]
) -> dict[str, np.ndarray]:
    """Metric -> (n,) bool: the case has a score below the metric's full marks (per-case scores
    with a best value only; a case without a score is not below)."""
    n = len(cases)
    unanswerable = np.fromiter((case.unanswerable for case in cases), dtype=bool, count=n)
    masks: dict[str, np.ndarray] = {}
    for spec in specs:
        values = scores.get(spec.name)
        best = spec.high if spec.direction == "higher" else spec.low
        if values is None or best is None or not spec.per_case or spec.case_values != "score" or not spec.full_marks:
            continue
        with np.errstate(invalid="ignore"):
            short = values < best - TOLERANCE if spec.direction == "higher" else values > best + TOLERANCE
        if spec.population == "answerable":
            short &= ~unanswerable
        masks[spec.name] = short
    return masks


def _shortfall(spec: MetricSpec, values: np.ndarray) -> np.ndarray:
    """How far each score is from full marks, as a share of the metric's range where it has one."""
    best = spec.high if spec.direction == "higher" else spec.low
    gap = np.abs(float(best) - values) if best is not None else np.zeros(values.shape)
    if spec.high is not None and spec.low is not None and spec.high > spec.low:
        gap = gap / (float(spec.high) - float(spec.low))
    return np.asarray(gap, dtype=float)


def missed_cases(
    specs: Sequence[MetricSpec],
    scores: Mapping[str, np.ndarray],
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    k: int,
    *,
    first: int = MISSED_SHOWN,
) -> Missed:
    """The cases scored below full marks, counted; the ``first`` worst of them described."""
    masks = below_full_marks(specs, scores, cases)
    if not masks:
        return Missed()
    any_missed = np.logical_or.reduce(list(masks.values()))
    indices = np.flatnonzero(any_missed)
    by_name = {spec.name: spec for spec in specs}
    shortfall = np.zeros(len(cases))
    for name, mask in masks.items():
        shortfall[mask] += _shortfall(by_name[name], scores[name][mask])
    # Worst first: the most marks missed over the metrics (each as a share of its range); the file's
    # order among equals.
    worst = indices[np.argsort(-shortfall[indices], kind="stable")]
    described = []
    for index in worst[:first].tolist():
        case, output = cases[index], results[index].output
        names = [name for name, mask in masks.items() if mask[index]]
        labels = {label for name in names for label in by_name[name].needs_labels}
        outputs = {out for name in names for out in by_name[name].needs_output}
        if case.relevant and "relevant_ids" in labels:  # gold as evidence: matched by the texts
            labels = (labels - {"relevant_ids"}) | {"relevant"}
            outputs.add("retrieved_contexts")
        expected = {what: read(case) for label, (what, read) in EXPECTED.items() if label in labels}
        if case.unanswerable:
            expected = {"answer": REFUSAL}
        got = (
            {}
            if output is None
            else {what: read(output, k) for out, (what, read) in CAME_BACK.items() if out in outputs}
        )
        described.append(MissedCase(case.id, {name: float(scores[name][index]) for name in names}, expected, got))
    return Missed(int(indices.size), described)
