"""People's labels read back from a run's traces: calibration, PPI and the dataset export.

A label describes one system's answer. So a run is calibrated with the labels on its own traces,
plus a label on another run's trace of the same case only when that case's output (answer and
contexts, for the same question) is byte-identical in both runs: the label then describes this
run's answer too. Other runs are those of the run's experiment that ``ragexp label`` queued.
Anything else is ignored and counted, never averaged in: a label on a name that is not one of the
run's labellable metrics with a label schema, a value outside the metric's range (or not 0/1 on a
pass/fail metric), a label on another run's trace whose output differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp.compare.select import FINISHED_FILTER
from ragexp.config.models import CalibrationConfig
from ragexp.labels import answers as reviewed
from ragexp.metrics.calibration import Trust, assess, labelled_metrics
from ragexp.metrics.registry import MetricSpec, lookup
from ragexp.tracking import review_queues as review

if TYPE_CHECKING:
    from ragexp.compare.data import RunData
    from ragexp.records import Case, CaseResult
    from ragexp.tracking.store import RunRecord, Store

IGNORED = {
    "no_schema": "not a label schema of this run's metrics",
    "out_of_range": "outside the metric's range",
    "other_run": "on another run's trace whose output differs",
}
"""Why a label was left out -> how it is said."""


@dataclass
class Labels:
    """People's scores of a run's cases, by metric, aligned with the run's case ids."""

    human: dict[str, np.ndarray]
    """Metric -> (n,) scores, NaN where unlabelled."""
    own: int = 0
    """Labels read from the run's own traces."""
    carried: int = 0
    """Labels from another run's trace of a case with a byte-identical output."""
    ignored: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IGNORED, 0))
    traces: dict[str, str] = field(default_factory=dict)
    """Case id -> the trace a kept label came from (the run's own, or the other run's)."""

    def counts(self) -> dict[str, int]:
        """Labelled cases per metric."""
        return {name: int(np.isfinite(values).sum()) for name, values in self.human.items()}

    def ignored_line(self) -> str | None:
        """One line for stderr naming what was left out (None when nothing was)."""
        parts = [f"{count} {IGNORED[why]}" for why, count in self.ignored.items() if count]
        return f"labels ignored: {', '.join(parts)}" if parts else None


def _output(row: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What a label judged: the question, and the answer and contexts shown for it."""
    output = row.get("output") or {}
    return row.get("question"), output.get("answer"), output.get("contexts")


def collect_labels(store: Store, run: RunData) -> Labels:
    """Every usable label of ``run``'s cases (module docstring)."""
    return _collect(store, run.record, run.metrics, run.case_ids, run.row, own=True, custom=run.custom)


def _collect(
    store: Store,
    record: RunRecord,
    metrics: list[str],
    case_ids: list[str],
    row: Callable[[int], dict[str, Any]],
    *,
    own: bool,
    others: list[str] | None = None,
    custom: Mapping[str, MetricSpec] | None = None,
) -> Labels:
    names = labelled_metrics(metrics, custom)
    label_schemas, _ = review.api()
    with review.calls(store, f"reading the label schemas of experiment {record.experiment_id}"):
        schemas = {schema.name for schema in review.label_schemas_of(label_schemas, record.experiment_id)}
    usable = {name: spec for name in names if name in schemas and (spec := lookup(name, custom)) is not None}
    labels = Labels({name: np.full(len(case_ids), math.nan) for name in usable})
    position = {case_id: i for i, case_id in enumerate(case_ids)}
    for info in review.run_traces(store, record) if own else []:
        case = reviewed.case_id(info)
        if case is None or case not in position:
            continue
        for answers in reviewed.human_feedback(info).values():
            if _keep(labels, answers, position[case], usable):
                labels.own += 1
                labels.traces[case] = info.trace_id
    for other in others if others is not None else _labelled_runs(store, record):
        _carry_over(store, labels, row, other, position, usable)
    return labels


def run_labels(
    store: Store,
    run_id: str,
    cases: list[Case],
    results: list[CaseResult],
    metrics: list[str],
    *,
    resumed: bool,
    info: Callable[[str], None],
    custom: Mapping[str, MetricSpec] | None = None,
) -> dict[str, np.ndarray]:
    """The queue labels ``ragexp run`` calibrates with (docs/judge-calibration.md): those on the
    traces of the run it resumes, and those carried over, case by case, from labelled runs of the
    experiment whose output for the case is byte-identical. Metric -> (n,) scores, NaN where
    unlabelled; empty, without reading any label schema, when no run of the experiment was
    queued and the run is new (so a store without review queues runs as before). ``custom``: the
    run's metrics of the user's own config."""
    if not labelled_metrics(metrics, custom):
        return {}
    record = store.get_run(run_id)
    others = list(_labelled_runs(store, record))
    if not others and not resumed:
        return {}
    if not others and not any(reviewed.human_feedback(t) for t in review.run_traces(store, record)):
        return {}
    rows = [
        {"question": case.question, "output": result.output.to_json() if result.output is not None else None}
        for case, result in zip(cases, results, strict=True)
    ]
    ids = [case.id for case in cases]
    labels = _collect(store, record, metrics, ids, rows.__getitem__, own=resumed, others=others, custom=custom)
    line = labels.ignored_line()
    if line is not None:
        info(line)
    return {name: values for name, values in labels.human.items() if np.isfinite(values).any()}


def with_run_labels(human: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dataset's ``human`` columns, a metric's replaced whole by the run's queue labels when
    it has any: the run's figures are then those ``ragexp calibrate`` gives it, never a mix of
    labels of this run's answers and a file's labels of whichever answers it was written for."""
    return {**human, **labels}


def _keep(labels: Labels, answers: list[reviewed.HumanLabel], index: int, usable: Mapping[str, MetricSpec]) -> bool:
    """Put the newest usable answer to one question in place; count the newer unusable ones."""
    name = answers[0].name
    spec = usable.get(name)
    if spec is None:
        labels.ignored["no_schema"] += len(answers)
        return False
    if math.isfinite(labels.human[name][index]):
        return False  # the run's own label comes first; of other runs', the newest run's
    high = spec.high if spec.high is not None else math.inf
    for answer in answers:
        score = reviewed.as_score(answer.value)
        if score is None or not spec.low <= score <= high or (spec.pass_fail and score not in (0.0, 1.0)):
            labels.ignored["out_of_range"] += 1
            continue
        labels.human[name][index] = score
        return True
    return False


def _labelled_runs(store: Store, run: RunRecord) -> Iterator[str]:
    """Other runs of the experiment that ``ragexp label`` put in a review queue, newest first."""
    for record in store.iter_runs([run.experiment_id], FINISHED_FILTER):
        if record.run_id != run.run_id and record.tag(review.LABEL_TAG):
            yield record.run_id


def _carry_over(
    store: Store,
    labels: Labels,
    row: Callable[[int], dict[str, Any]],
    other_id: str,
    position: dict[str, int],
    usable: Mapping[str, MetricSpec],
) -> None:
    from ragexp.compare.data import load_run

    other = load_run(store, other_id)
    theirs = {case_id: i for i, case_id in enumerate(other.case_ids)}
    for info in review.run_traces(store, other.record):
        case = reviewed.case_id(info)
        found = reviewed.human_feedback(info)
        if case is None or not found:
            continue
        same = case in position and case in theirs and _output(row(position[case])) == _output(other.row(theirs[case]))
        for answers in found.values():
            if not same:
                labels.ignored["other_run"] += 1
            elif _keep(labels, answers, position[case], usable):
                labels.carried += 1
                labels.traces.setdefault(case, info.trace_id)


def calibration_settings(run: RunData) -> CalibrationConfig:
    """The calibration settings the run was made with (its logged ``calibration.*`` params)."""
    params = run.record.params
    given = {
        key: params[f"calibration.{key}"]
        for key in ("threshold", "min_labelled", "confidence")
        if f"calibration.{key}" in params
    }
    return CalibrationConfig.model_validate(given)


def calibrate_run(run: RunData, labels: Labels) -> Trust:
    """Calibration and PPI from ``labels`` exactly as ``ragexp run`` computes them from a dataset's
    ``human`` scores (:func:`ragexp.metrics.calibration.assess`)."""
    specs = [spec for name in run.metrics if (spec := run.spec(name)) is not None]
    return assess(specs, run.scores, labels.human, run.unanswerable, calibration_settings(run))


def export_rows(run: RunData, labels: Labels, expectations: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The labelled cases in the dataset format, with the run's outputs (a replay dataset) and
    their ``human`` objects. ``expectations``: case id -> the trace's expectations."""
    rows = []
    for i, case_id in enumerate(run.case_ids):
        human = {name: float(values[i]) for name, values in labels.human.items() if math.isfinite(values[i])}
        if not human:
            continue
        row = run.row(i)
        output = row.get("output") or {}
        expected = expectations.get(case_id, {})
        item: dict[str, Any] = {"id": case_id, "question": row.get("question", "")}
        if expected.get("relevant_ids"):
            item["relevant_ids"] = list(expected["relevant_ids"])
        if expected.get("expected_facts"):
            item["expected_facts"] = list(expected["expected_facts"])
        if expected.get("expected_response"):
            item["reference"] = expected["expected_response"]
        if expected.get("unanswerable") is True or row.get("unanswerable") is True:
            item["unanswerable"] = True
        item["response"] = output.get("answer") or ""
        item["retrieved_ids"] = list(output.get("ranked_ids") or [])
        item["retrieved_contexts"] = list(output.get("contexts") or [])
        item["citations"] = list(output.get("citations") or [])
        if row.get("latency_seconds") is not None:
            item["latency_seconds"] = row["latency_seconds"]
        item["human"] = human
        rows.append(item)
    return rows


def trace_expectations(store: Store, run: RunData) -> dict[str, dict[str, Any]]:
    """Case id -> the expectations (the dataset's labels) on the run's traces."""
    found: dict[str, dict[str, Any]] = {}
    for info in review.run_traces(store, run.record):
        case = reviewed.case_id(info)
        if case is None:
            continue
        found[case] = {
            item.name: item.value for item in info.assessments or [] if getattr(item, "expectation", None) is not None
        }
    return found
