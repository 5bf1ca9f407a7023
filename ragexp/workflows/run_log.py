"""``ragexp run``, what a run logs besides its metrics: the dataset, the artifacts (scores, cases, stage
timings, tables) and each case's trace."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp import artifacts, limits
from ragexp.artifacts import error_text, nullable
from ragexp.config.identity import resolved_config
from ragexp.conversations import histories
from ragexp.metrics.calibration import Trust
from ragexp.metrics.conversation import ConversationFigures
from ragexp.metrics.judge import identity as judge_identity
from ragexp.metrics.offline import nearest_rank
from ragexp.outputs import info
from ragexp.records import CaseResult
from ragexp.secrets import scrub
from ragexp.tracking.store import TAG_PREFIX, Store
from ragexp.workflows.run_plan import SHORT_HASH, Plan
from ragexp.workflows.run_score import Scored
from ragexp.workflows.traffic import traffic_json

if TYPE_CHECKING:
    from ragexp.case_traces import TracePlan

TEXT_IN_TABLE = 300
TIMING_PREFIX = "timing."
TIMING_FIGURES = ("p50_seconds", "p95_seconds", "cases")
"""The figures logged per stage, as ``timing.<stage>.<figure>``."""


def timing_prefix(stage: str) -> str:
    """The metric key prefix of a stage's timings: ``timing.<stage>`` when MLflow takes the name
    as part of a key, else its safe characters and a short hash (see :func:`limits.safe_segment`);
    the stage's own name is in the run's ``timings.json``."""
    longest = max(map(len, TIMING_FIGURES)) + 1
    budget = limits.METRIC_KEY.chars - len(TIMING_PREFIX) - longest
    return TIMING_PREFIX + limits.safe_segment(stage, budget)


def log_dataset(plan: Plan, store: Store, run_id: str) -> None:
    dataset = plan.dataset
    store.log_dataset(
        run_id,
        name=plan.config.dataset.name,
        digest=dataset.dataset_hash[:SHORT_HASH],
        source=str(dataset.path),
        profile={
            "dataset_hash": dataset.dataset_hash,
            "cases": len(dataset.cases),
            "answerable": dataset.answerable_count,
            "format": dataset.format,
        },
    )
    if plan.traffic is not None:
        store.log_files(run_id, {artifacts.TRAFFIC: traffic_json(plan.traffic)})


def served_tags(served: str) -> dict[str, str]:
    """The tags naming what served the run's judge grades (``ragexp.judge.served``: each served
    identity, sorted; ``ragexp.judge.served_count``: how many, more than one a judge that changed)."""
    return {
        TAG_PREFIX + "judge.served": limits.fit(limits.TAG_VALUE, served),
        TAG_PREFIX + "judge.served_count": str(len(judge_identity.split(served))),
    }


def served_params(served: str) -> dict[str, str]:
    """The params naming what served the run's judge grades (``judge.served``: the set, whole when
    it fits a param, else its start and a hash of the whole; ``judge.served_count``): a fixed
    length, so the store cannot refuse them after the run's work."""
    return {
        "judge.served": limits.shortened(limits.PARAM_VALUE, served),
        "judge.served_count": str(len(judge_identity.split(served))),
    }


def log_served_params(store: Store, run_id: str, served: str, resumed: bool) -> None:
    params = served_params(served)
    if resumed:  # the attempt before may have logged them, and a param keeps its first value
        kept = store.get_run(run_id).params
        if any(kept.get(key) not in (None, value) for key, value in params.items()):
            info(f"warning: run {run_id} keeps the judge's served identities its first attempt recorded as params")
        params = {key: value for key, value in params.items() if key not in kept}
    if params:
        store.log_params(run_id, params)


def stage_rows(timings: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """``timings.json``'s rows: each stage's name, the key prefix of its metrics, its figures."""
    return [{"stage": stage, "metric_prefix": timing_prefix(stage), **figures} for stage, figures in timings.items()]


def log_artifacts(
    plan: Plan,
    store: Store,
    run_id: str,
    results: list[CaseResult],
    scored: Scored,
    human: dict[str, np.ndarray],
    trust: Trust,
    timings: dict[str, dict[str, float]],
    chats: ConversationFigures | None = None,
) -> None:
    cfg = plan.config
    cases = plan.dataset.cases
    columns = scored.columns()
    latency = nullable(scored.inputs.latency)
    summary = {
        "summary": scored.summary,
        "case_count": len(cases),
        "error_count": scored.error_count,
        "populations": {name: covered.to_json() for name, covered in scored.populations(plan.specs).items()},
        "config_hash": plan.config_hash,
        "dataset_hash": plan.dataset.dataset_hash,
        **trust.to_json(),
    }
    with tempfile.TemporaryDirectory(prefix="ragexp-run-") as tmp:
        folder = Path(tmp)
        artifacts.write_cases(folder / artifacts.CASES, cases, results, columns, latency, scored.spread)
        artifacts.write_config(folder / artifacts.CONFIG, resolved_config(cfg))
        artifacts.write_summary(folder / artifacts.SUMMARY, summary)
        artifacts.write_table(folder / artifacts.TABLE, _table(plan, results, columns, latency))
        if timings:
            artifacts.write_timings(folder / artifacts.TIMINGS, stage_rows(timings))
        artifacts.write_scores(
            folder / artifacts.SCORES, cases, scored.errored, latency, columns, human, scored.inputs.ttft
        )
        if plan.findings is not None:
            artifacts.write_audit(folder / artifacts.AUDIT, [finding.to_json() for finding in plan.findings])
        if plan.custom.specs:
            artifacts.write_custom_metrics(folder / artifacts.CUSTOM_METRICS, plan.custom.specs)
        if scored.canaries is not None:
            artifacts.write_canaries(folder / artifacts.CANARIES, scored.canaries.artifact())
        if chats is not None:
            artifacts.write_conversations(folder / artifacts.CONVERSATIONS, [row.to_json() for row in chats.rows])
        store.log_dir(run_id, folder, tables=[artifacts.TABLE])


def log_case_traces(
    plan: Plan, store: Store, run_id: str, results: list[CaseResult], scored: Scored, *, resumed: bool
) -> None:
    from ragexp.case_traces import build_traces

    traced = build_traces(
        plan.dataset.cases,
        results,
        plan.specs,
        scored.scores,
        scored.inputs.latency,
        scored.errored,
        judge=plan.judge,
        cap=plan.config.tracking.traces_max_cases,
        language=plan.config.report.language,
        histories=histories(plan.dataset.cases, results, plan.config.conversation.history)
        if plan.dataset.has_conversations
        else None,
    )
    _log_traces(store, run_id, plan.config.experiment, traced, resumed=resumed, info=info)


def stage_timings(results: Sequence[CaseResult]) -> dict[str, dict[str, float]]:
    """p50 and p95 (nearest rank) of each stage the system reported timings for, by stage name
    (secrets masked: a service may echo a token as a stage name)."""
    per_stage: dict[str, list[float]] = {}
    for result in results:
        if result.output is not None and result.output.timings:
            for stage, seconds in result.output.timings.items():
                per_stage.setdefault(scrub(stage), []).append(seconds)
    figures: dict[str, dict[str, float]] = {}
    for stage, values in sorted(per_stage.items()):
        array = np.array(values, dtype=np.float64)
        p50, p95, cases = TIMING_FIGURES
        figures[stage] = {
            p50: nearest_rank(array, 50) or 0.0,
            p95: nearest_rank(array, 95) or 0.0,
            cases: float(array.size),
        }
    return figures


def _table(
    plan: Plan, results: Sequence[CaseResult], columns: dict[str, list[float | None]], latency: list[float | None]
) -> dict[str, list[Any]]:
    cases = plan.dataset.cases
    return {
        "id": [case.id for case in cases],
        "question": [case.question[:TEXT_IN_TABLE] for case in cases],
        "answer": [(r.output.answer[:TEXT_IN_TABLE] if r.output else None) for r in results],
        "error": [error_text(r) for r in results],
        **columns,
        "latency_seconds": latency,
    }


def _log_traces(
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
    from ragexp.tracking.traces import TraceWriter

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


def run_metrics(
    plan: Plan, results: Sequence[CaseResult], scored: Scored, trust: Trust, timings: dict[str, dict[str, float]]
) -> dict[str, float]:
    """Every figure the run logs as an MLflow metric."""
    metrics = {name: value for name, value in scored.summary.items() if value is not None}
    for name, covered in scored.populations(plan.specs).items():
        metrics[f"population.{name}.scored"] = float(covered.scored)
        metrics[f"population.{name}.cases"] = float(covered.cases)
    metrics["case_count"] = float(len(plan.dataset.cases))
    metrics["error_count"] = float(scored.error_count)
    metrics.update(scored.judge_metrics)
    metrics.update(scored.system_tokens)
    metrics.update(trust.as_metrics())
    for stage in stage_rows(timings):
        for figure in TIMING_FIGURES:
            metrics[f"{stage['metric_prefix']}.{figure}"] = stage[figure]
    return metrics
