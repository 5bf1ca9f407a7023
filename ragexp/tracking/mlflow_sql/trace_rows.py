"""The rows of a batch of traces, as MLflow's ``start_trace`` and ``log_spans`` write them (one
encoding: a trace's plan to rows), and their insertion through SQLAlchemy into a SQL store whose
schema the compatibility check admits (``ragexp.tracking.mlflow_sql.writer`` inserts the same
rows through :mod:`sqlite3`)."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ragexp import limits
from ragexp.case_traces import SESSION_METADATA, TRACE_NAME
from ragexp.tracking.mlflow_sql import internals
from ragexp.tracking.mlflow_sql.schema import REVISION_SQL, check_mlflow, check_revision, installed_mlflow

if TYPE_CHECKING:
    from ragexp.case_traces import PlannedSpan, PlannedTrace

ARTIFACT_LOCATION = "mlflow.artifactLocation"
ASSESSMENT_RUN = "mlflow.assessment.sourceRunId"
SPAN_KIND = tuple(int(part) for part in installed_mlflow().split(".")[:2] if part.isdigit()) >= (3, 18)
"""Whether the installed MLflow keeps a ``kind`` key in each stored span (3.18 and later)."""


def aggregate(value: Any) -> tuple[float | None, bool]:
    """MLflow's ``assessment_aggregate`` (the assessments table's aggregate_value and
    is_numeric_value), kept here so that writing a trace does not import mlflow; a test compares
    the two."""
    if isinstance(value, bool):
        return (1.0 if value else 0.0), False
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None, False
        return (number, True) if math.isfinite(number) else (None, False)
    if isinstance(value, str) and value.strip().lower() in ("yes", "no"):
        return (1.0 if value.strip().lower() == "yes" else 0.0), False
    return None, False


def error_dict(message: str) -> dict[str, str]:
    return {"error_code": "RAGEXP_NO_SCORE", "error_message": message}


def attributes(trace: PlannedTrace, span: PlannedSpan) -> dict[str, str]:
    attributes = {
        "mlflow.traceRequestId": json.dumps(trace.trace_id),
        "mlflow.spanType": json.dumps(span.kind),
    }
    if span.inputs is not None:
        attributes["mlflow.spanInputs"] = json.dumps(span.inputs, ensure_ascii=False)
    if span.outputs is not None:
        attributes["mlflow.spanOutputs"] = json.dumps(span.outputs, ensure_ascii=False)
    return attributes


def _b64(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big")).decode("ascii")


def span_dict(trace: PlannedTrace, span: PlannedSpan) -> dict[str, Any]:
    """A span in the stored layout of ``mlflow.entities.Span.to_dict`` (what the SQL store keeps
    in ``spans.content`` and ``get_trace`` reads back)."""
    content: dict[str, Any] = {
        "trace_id": _b64(trace.otel_trace_id, 16),
        "span_id": _b64(span.span_id, 8),
        "parent_span_id": _b64(span.parent_id, 8) if span.parent_id is not None else None,
        "name": span.name,
    }
    if SPAN_KIND:
        content["kind"] = "SPAN_KIND_INTERNAL"  # MLflow 3.18 stores each span's OpenTelemetry kind
    return content | {
        "start_time_unix_nano": span.start_ns,
        "end_time_unix_nano": span.end_ns,
        "events": [],
        "status": {"code": "STATUS_CODE_ERROR" if span.error else "STATUS_CODE_OK", "message": span.error or ""},
        "attributes": attributes(trace, span),
        "links": [],
    }


def trace_rows(
    chunk: Sequence[PlannedTrace],
    experiment: str,
    run_id: str,
    metadata_of: Callable[[PlannedTrace], dict[str, str]],
    location: Callable[[str], str],
    ascii_only: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """The rows of each trace table (columns by name) for a batch of traces, as MLflow's
    ``start_trace`` and ``log_spans`` write them; ``location`` gives a trace's artifact
    location (MLflow's ``mlflow.artifactLocation`` tag)."""
    experiment_id = int(experiment)
    now_ms = int(time.time() * 1000)
    metadata_json = json.dumps({ASSESSMENT_RUN: run_id})
    traces: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    spans: list[dict[str, Any]] = []
    for trace in chunk:
        tid = trace.trace_id
        request_ms = trace.start_ns // 1_000_000
        traces.append(
            {
                "request_id": tid,
                "experiment_id": experiment_id,
                "timestamp_ms": request_ms,
                "execution_time_ms": trace.duration_ns // 1_000_000,
                "status": "ERROR" if trace.case.error is not None else "OK",
                "client_request_id": limits.client_request_id(trace.case.case_id),
                "request_preview": trace.request_preview,
                "response_preview": trace.response_preview,
                "trace_name": TRACE_NAME,
            }
        )
        tags.append({"request_id": tid, "key": ARTIFACT_LOCATION, "value": location(tid)})
        tags.append({"request_id": tid, "key": "mlflow.trace.spansLocation", "value": "TRACKING_STORE"})
        given = metadata_of(trace)
        # As MLflow's start_trace: the session is a column of trace_info (what its session view
        # and filters read), not a metadata row.
        traces[-1]["session_id"] = given.pop(SESSION_METADATA, None)
        for key, text in given.items():
            metadata.append({"request_id": tid, "key": key, "value": text})
        for mark in trace.marks:
            value = mark.value if mark.error is None else None
            number, numeric = aggregate(value)
            marks.append(
                {
                    "assessment_id": mark.assessment_id,
                    "trace_id": tid,
                    "name": mark.name,
                    "assessment_type": mark.kind,
                    "value": json.dumps(value, ensure_ascii=False),
                    "error": json.dumps(error_dict(mark.error)) if mark.error is not None else None,
                    "created_timestamp": now_ms,
                    "last_updated_timestamp": now_ms,
                    "experiment_id": experiment_id,
                    "trace_timestamp_ms": request_ms,
                    "aggregate_value": number,
                    "is_numeric_value": bool(numeric),
                    "source_type": mark.source_type,
                    "source_id": mark.source_id,
                    "run_id": None,
                    "span_id": None,
                    "rationale": mark.rationale,
                    "overrides": None,
                    "valid": True,
                    "assessment_metadata": metadata_json,
                }
            )
        for span in trace.spans:
            spans.append(
                {
                    "trace_id": tid,
                    "experiment_id": experiment_id,
                    "span_id": f"{span.span_id:016x}",
                    "parent_span_id": f"{span.parent_id:016x}" if span.parent_id is not None else None,
                    "name": span.name,
                    "type": span.kind,
                    "status": "ERROR" if span.error else "OK",
                    "start_time_unix_nano": span.start_ns,
                    "end_time_unix_nano": span.end_ns,
                    "content": json.dumps(span_dict(trace, span), ensure_ascii=ascii_only),
                }
            )
    return {
        "trace_info": traces,
        "trace_tags": tags,
        "trace_request_metadata": metadata,
        "assessments": marks,
        "spans": spans,
    }


def insert_sqlalchemy(
    backend: Any, experiment_id: str, rows_of: Callable[[Callable[[str], str], bool], dict[str, list[dict[str, Any]]]]
) -> None:
    """The rows of a batch (``rows_of(location, ascii_only)``) as one multi-row INSERT per table in
    ONE transaction of MLflow's SQLAlchemy store, after the compatibility check in that same
    transaction. ``start_trace`` + ``log_spans`` run dozens of statements and a flush per trace;
    the rows are the same, and the read side (search, get_trace, the UI) is MLflow's own."""
    check_mlflow()
    models, tag_of, session_maker = internals.trace_tables(backend)
    try:
        from sqlalchemy import insert, text

        experiment = backend.get_experiment(experiment_id)
    except (ImportError, AttributeError):
        from ragexp.tracking.mlflow_sql.schema import Declined

        raise Declined("the installed MLflow's SQL store is not one ragexp knows") from None
    rows = rows_of(lambda tid: str(tag_of(experiment, tid).value), backend.db_type == "mssql")
    with session_maker(read_only=False) as session:
        check_revision(session.execute(text(REVISION_SQL)).scalar(), str(backend.db_uri))
        for table, model in models.items():
            if rows[table]:
                session.execute(insert(model.__table__), rows[table])
