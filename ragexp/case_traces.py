"""What each case's MLflow trace shows, built from a scored run (plain data, no mlflow).

The trace writer lives in :mod:`ragexp.tracking.traces`; this module decides the content:
which cases get a trace (all of them up to ``tracking.traces_max_cases``, beyond it the errored
and imperfect ones), and which assessments each carries, so that the MLflow UI's per-metric
averages over a run's traces equal ragexp's summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.metrics.registry import MetricSpec
from ragexp.records import Case, CaseResult
from ragexp.tracking.store import TAG_PREFIX, Store
from ragexp.tracking.traces import CaseTrace, FeedbackRecord, TraceWriter


@dataclass
class TracePlan:
    traces: list[CaseTrace]
    case_count: int
    capped: bool
    """True when only the errored and imperfect cases got a trace."""


def select_cases(
    specs: Sequence[MetricSpec], scores: dict[str, np.ndarray], errored: np.ndarray, cap: int
) -> tuple[np.ndarray, bool]:
    """Indexes of the cases that get a trace, and whether the cap cut them down.

    Within the cap every case is traced. Beyond it, the cases a user looks at when something
    regressed: errored ones first, then those with any metric short of its best value.
    """
    n = errored.size
    if n <= cap:
        return np.arange(n), False
    imperfect = np.zeros(n, dtype=bool)
    for spec in specs:
        values = scores.get(spec.name)
        if values is None:
            continue
        best = spec.high if spec.direction == "higher" else spec.low
        if best is None:
            continue
        finite = np.isfinite(values)
        imperfect |= finite & (values < best if spec.direction == "higher" else values > best)
    chosen = np.concatenate([np.flatnonzero(errored), np.flatnonzero(imperfect & ~errored)])
    return np.sort(chosen[:cap]), True


def build_traces(
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    specs: Sequence[MetricSpec],
    scores: dict[str, np.ndarray],
    latency: np.ndarray,
    errored: np.ndarray,
    *,
    judge: str,
    cap: int,
) -> TracePlan:
    """One :class:`CaseTrace` per selected case.

    A metric with a score is a feedback value; a metric that could not be computed (the case's
    system call failed, or the metric itself failed) is a feedback carrying the error, never a
    value. Metrics averaged over answerable cases only get no assessment on unanswerable cases,
    so the UI's average is the summary's.
    """
    answerable_exists = any(not case.unanswerable for case in cases)
    per_case = [spec for spec in specs if spec.per_case and spec.name in scores]
    chosen, capped = select_cases(specs, scores, errored, cap)
    traces: list[CaseTrace] = []
    for index in chosen.tolist():
        case, result = cases[index], results[index]
        output = result.output
        feedback: list[FeedbackRecord] = []
        for spec in per_case:
            if spec.population == "answerable" and case.unanswerable and answerable_exists:
                continue
            value = float(scores[spec.name][index])
            source = judge if spec.judge else None
            if value == value:
                feedback.append(FeedbackRecord(spec.name, value, judge=source))
                continue
            reason = result.metric_errors.get(spec.name) or (f"case error: {result.error}" if result.error else None)
            if reason is not None:
                feedback.append(FeedbackRecord(spec.name, None, error=reason, judge=source))
        seconds = float(latency[index]) if latency[index] == latency[index] else None
        traces.append(
            CaseTrace(
                case_id=case.id,
                question=case.question,
                answer=output.answer if output is not None else None,
                error=result.error if not result.ok else None,
                latency_seconds=seconds,
                ranked_ids=list(output.ranked_ids) if output is not None else [],
                contexts=list(output.contexts) if output is not None else [],
                timings=dict(output.timings or {}) if output is not None else {},
                expectations=_expectations(case),
                feedback=feedback,
            )
        )
    return TracePlan(traces, len(cases), capped)


def _expectations(case: Case) -> dict[str, Any]:
    expected: dict[str, Any] = {}
    if case.expected_facts:
        expected["expected_facts"] = list(case.expected_facts)
    if case.reference:
        expected["expected_response"] = case.reference
    if case.relevant_ids:
        expected["relevant_ids"] = list(case.relevant_ids)
    expected["unanswerable"] = case.unanswerable
    return expected


def log_traces(
    store: Store,
    run_id: str,
    experiment: str,
    plan: TracePlan,
    *,
    resumed: bool,
    info: Any,
) -> int:
    """Write the planned traces (replacing any a stopped attempt of this run left) and tag the
    run with what was traced. A store error propagates as a TrackingError: the caller marks the
    run failed rather than finished with half its traces."""
    experiment_id = store.experiment_id(experiment, create=False)
    if experiment_id is None:  # pragma: no cover - the run was just created in it
        raise RuntimeError(f"experiment {experiment} vanished")
    writer = TraceWriter(store, experiment_id, run_id)
    if resumed:
        writer.delete_all()
    written = writer.write(plan.traces)
    scope = "all" if not plan.capped else "errored_and_imperfect"
    if plan.capped:
        info(
            f"traces: {written} of {plan.case_count} cases traced (errored and imperfect only, over "
            "tracking.traces_max_cases); cases.jsonl holds every case"
        )
    store.set_tags(run_id, {TAG_PREFIX + "traces": scope, TAG_PREFIX + "traces.count": str(written)})
    return written
