"""Every case of a run as an MLflow trace with its assessments, written in bulk.

MLflow's public tracing API writes one trace at a time: a span exporter behind a queue that
drops data when full, then one ``log_feedback`` call (one transaction) per assessment. Measured
here at 70-110 ms per case on SQLite. This module builds the same entities (``TraceInfo`` with
its assessments and metadata, ``Span`` objects) and hands them to the tracking store's own
write methods, batched:

- SQL stores: ``start_trace`` (trace info, tags, metadata and assessments in one go) for every
  trace of a batch and one ``log_spans`` for all their spans, inside ONE transaction per batch;
- a tracking server (``http://``): one ``StartTraceV3`` request per trace (its assessments ride
  along) on a few connections in parallel, and the spans of a whole batch in one OTLP request.

Nothing is queued: every call returns only once the store has the data, and an error stops the
writing with a :class:`~ragexp.errors.TrackingError`.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragexp.errors import TrackingError
from ragexp.tracking.store import _one_line

if TYPE_CHECKING:
    from ragexp.tracking.store import Store

PREVIEW_CHARS = 1000
"""Request/response previews (the text the UI lists and pairs rows by) are cut to this."""
SPAN_TEXT_CHARS = 20_000
"""Answers, questions and contexts are cut to this inside spans: a 1 MB answer stays in
cases.jsonl, never in the trace store."""
BATCH = 500
"""Traces per transaction (SQL) or per OTLP request (server)."""
SERVER_THREADS = 8
SOURCE_ID = "ragexp"
RUN_METADATA = "mlflow.sourceRun"
ASSESSMENT_RUN = "mlflow.assessment.sourceRunId"
CASE_METADATA = "ragexp.case_id"
TRACE_NAME = "rag_case"


@dataclass(slots=True)
class FeedbackRecord:
    """One metric of one case: a value, or the reason there is none."""

    name: str
    value: float | None
    error: str | None = None
    judge: str | None = None
    """Judge identity for LLM-judge metrics (None: computed by code)."""
    rationale: str | None = None


@dataclass(slots=True)
class CaseTrace:
    """Everything a case's trace shows, as plain data."""

    case_id: str
    question: str
    answer: str | None
    error: str | None
    latency_seconds: float | None
    ranked_ids: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    expectations: dict[str, Any] = field(default_factory=dict)
    feedback: list[FeedbackRecord] = field(default_factory=list)


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit} more characters in cases.jsonl]"


def request_preview(case_id: str, question: str) -> str:
    """The trace's request as the UI shows it. The Evaluation-runs comparison pairs the rows of
    two runs by this exact string, so it starts with the case id (unique, and kept whole)."""
    return fit_json({"case_id": cut(case_id, 200)}, "question", question)


def fit_json(fixed: dict[str, str], key: str, text: str, limit: int = PREVIEW_CHARS) -> str:
    """``{**fixed, key: text}`` as JSON of at most ``limit`` characters (the store's preview
    columns hold 1,000), ``text`` cut as needed; always valid JSON."""
    budget = limit
    while True:
        encoded = json.dumps({**fixed, key: cut(text, max(budget, 0))}, ensure_ascii=False)
        if len(encoded) <= limit or budget <= 0:
            return encoded[:limit] if len(encoded) > limit else encoded
        budget -= len(encoded) - limit + 8


@dataclass(slots=True)
class _Span:
    name: str
    kind: str
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    inputs: Any
    outputs: Any
    error: str | None


@dataclass(slots=True)
class _Mark:
    """An assessment before it becomes an MLflow entity or a row."""

    kind: str
    """``feedback`` or ``expectation``."""
    name: str
    value: Any
    error: str | None
    source_type: str
    source_id: str
    rationale: str | None = None


@dataclass(slots=True)
class _Trace:
    trace_id: str
    otel_trace_id: int
    case: CaseTrace
    start_ns: int
    duration_ns: int
    request_preview: str
    response_preview: str
    spans: list[_Span]
    marks: list[_Mark]


class TraceWriter:
    """Writes :class:`CaseTrace` records of one run into a store, counted and never queued."""

    def __init__(self, store: Store, experiment_id: str, run_id: str) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.run_id = run_id
        self.backend: Any = store.client._tracking_client.store
        self._experiment: Any = None

    # --- writing ------------------------------------------------------------------------------

    def write(self, traces: Sequence[CaseTrace], *, batch: int = BATCH) -> int:
        """Write every trace; returns how many were written (all, or an error is raised)."""
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        written = 0
        for start in range(0, len(traces), batch):
            chunk = [_plan(case) for case in traces[start : start + batch]]
            try:
                if isinstance(self.backend, SqlAlchemyStore):
                    self._write_sql(chunk)
                elif isinstance(self.backend, RestStore):
                    self._write_server(chunk)
                else:
                    self._write_generic(chunk)
            except Exception as exc:  # a store raises many types (SQL, HTTP, MLflow)
                raise TrackingError(
                    f"logging traces of run {self.run_id} to {self.store.uri}: {written} of {len(traces)} "
                    f"written when the store failed: {_one_line(exc)}"
                ) from None
            written += len(chunk)
        return written

    def _write_server(self, chunk: list[_Trace]) -> None:
        # One StartTraceV3 request per trace (its assessments ride along, one transaction on
        # the server), a few in flight at once; then the spans of the whole batch in one OTLP
        # request. The server has no batch endpoint for trace infos or assessments.
        infos = [self._trace_info(trace) for trace in chunk]
        with ThreadPoolExecutor(max_workers=min(SERVER_THREADS, len(infos))) as pool:
            list(pool.map(self.backend.start_trace, infos))
        self.backend.log_spans(self.experiment_id, [span for trace in chunk for span in _spans(trace)])

    def _write_generic(self, chunk: list[_Trace]) -> None:
        for trace in chunk:
            self.backend.start_trace(self._trace_info(trace))
        self.backend.log_spans(self.experiment_id, [span for trace in chunk for span in _spans(trace)])

    def _write_sql(self, chunk: list[_Trace]) -> None:
        """The rows ``start_trace`` + ``log_spans`` would write, as one multi-row INSERT per table
        in ONE transaction per batch. Those methods run dozens of statements and a flush per
        trace (measured 28 ms + 25 ms a trace on SQLite here); the rows are the same, and the
        read side (search, get_trace, the UI) is MLflow's own."""
        from mlflow.store.tracking.dbmodels.models import (
            SqlAssessments,
            SqlSpan,
            SqlTraceInfo,
            SqlTraceMetadata,
            SqlTraceTag,
        )
        from mlflow.store.tracking.utils.trace_analytics import assessment_aggregate
        from sqlalchemy import insert

        backend = self.backend
        if self._experiment is None:
            self._experiment = backend.get_experiment(self.experiment_id)
        experiment_id = int(self.experiment_id)
        now_ms = int(time.time() * 1000)
        metadata_json = json.dumps({ASSESSMENT_RUN: self.run_id})
        ascii_only = backend.db_type == "mssql"
        traces, tags, metadata, marks, spans = [], [], [], [], []
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
                    "client_request_id": cut(trace.case.case_id, 40),
                    "request_preview": trace.request_preview,
                    "response_preview": trace.response_preview,
                    "trace_name": TRACE_NAME,
                }
            )
            location = backend._get_trace_artifact_location_tag(self._experiment, tid)
            tags.append({"request_id": tid, "key": location.key, "value": location.value})
            tags.append({"request_id": tid, "key": "mlflow.trace.spansLocation", "value": "TRACKING_STORE"})
            for key, text in self._trace_metadata(trace).items():
                metadata.append({"request_id": tid, "key": key, "value": text})
            for mark in trace.marks:
                value = mark.value if mark.error is None else None
                aggregate, numeric = assessment_aggregate(value)
                marks.append(
                    {
                        "assessment_id": f"a-{uuid.uuid4().hex}",
                        "trace_id": tid,
                        "name": mark.name,
                        "assessment_type": mark.kind,
                        "value": json.dumps(value, ensure_ascii=False),
                        "error": json.dumps(_error_dict(mark.error)) if mark.error is not None else None,
                        "created_timestamp": now_ms,
                        "last_updated_timestamp": now_ms,
                        "experiment_id": experiment_id,
                        "trace_timestamp_ms": request_ms,
                        "aggregate_value": aggregate,
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
                        "content": json.dumps(_span_dict(trace, span), ensure_ascii=ascii_only),
                    }
                )
        with backend.ManagedSessionMaker(read_only=False) as session:
            for model, rows in (
                (SqlTraceInfo, traces),
                (SqlTraceTag, tags),
                (SqlTraceMetadata, metadata),
                (SqlAssessments, marks),
                (SqlSpan, spans),
            ):
                if rows:
                    session.execute(insert(model.__table__), rows)

    def _trace_metadata(self, trace: _Trace) -> dict[str, str]:
        return {
            RUN_METADATA: self.run_id,
            CASE_METADATA: cut(trace.case.case_id, 200),
            "mlflow.trace_schema.version": "3",
        }

    def _trace_info(self, trace: _Trace) -> Any:
        from mlflow.entities import (
            AssessmentError,
            AssessmentSource,
            Expectation,
            Feedback,
            TraceInfo,
            TraceLocation,
            TraceState,
        )

        metadata = {ASSESSMENT_RUN: self.run_id}
        assessments: list[Any] = []
        for mark in trace.marks:
            source = AssessmentSource(source_type=mark.source_type, source_id=mark.source_id)
            if mark.kind == "expectation":
                assessments.append(
                    Expectation(mark.name, mark.value, source=source, trace_id=trace.trace_id, metadata=metadata)
                )
            else:
                error = _error_dict(mark.error) if mark.error is not None else None
                assessments.append(
                    Feedback(
                        name=mark.name,
                        value=mark.value if error is None else None,
                        error=AssessmentError(**error) if error is not None else None,
                        source=source,
                        trace_id=trace.trace_id,
                        metadata=metadata,
                        rationale=mark.rationale,
                    )
                )
        return TraceInfo(
            trace_id=trace.trace_id,
            trace_location=TraceLocation.from_experiment_id(self.experiment_id),
            request_time=trace.start_ns // 1_000_000,
            state=TraceState.ERROR if trace.case.error is not None else TraceState.OK,
            request_preview=trace.request_preview,
            response_preview=trace.response_preview,
            client_request_id=cut(trace.case.case_id, 40),
            execution_duration=trace.duration_ns // 1_000_000,
            trace_metadata=self._trace_metadata(trace),
            tags={"mlflow.traceName": TRACE_NAME},
            assessments=assessments,
        )

    # --- reading back -------------------------------------------------------------------------

    def trace_ids(self) -> list[str]:
        """Ids of every trace linked to the run (all pages)."""
        ids: list[str] = []
        token = None
        with self.store.calling(f"listing traces of run {self.run_id}"):
            while True:
                infos, token = self.backend.search_traces(
                    experiment_ids=[self.experiment_id],
                    filter_string=f"metadata.`{RUN_METADATA}` = '{self.run_id}'",
                    max_results=500,
                    page_token=token,
                )
                ids.extend(info.trace_id for info in infos)
                if not token:
                    return ids

    def count(self) -> tuple[int, int]:
        """(traces, assessments) the store holds for the run, read back from the store."""
        ids = self.trace_ids()
        assessments = 0
        with self.store.calling(f"reading traces of run {self.run_id}"):
            for start in range(0, len(ids), 100):
                for info in self.backend.batch_get_trace_infos(ids[start : start + 100]):
                    assessments += len(info.assessments)
        return len(ids), assessments

    def delete_all(self) -> int:
        """Remove the run's traces (a resumed run writes each case's trace once, afresh)."""
        ids = self.trace_ids()
        with self.store.calling(f"deleting traces of run {self.run_id}"):
            for start in range(0, len(ids), 100):
                self.backend.delete_traces(self.experiment_id, trace_ids=ids[start : start + 100])
        return len(ids)


def _plan(case: CaseTrace) -> _Trace:
    otel_trace_id = uuid.uuid4().int
    start_ns = time.time_ns()
    duration_ns = int((case.latency_seconds or 0.0) * 1e9) or sum(int(s * 1e9) for s in case.timings.values())
    marks = [_Mark("expectation", name, value, None, "HUMAN", "dataset") for name, value in case.expectations.items()]
    for item in case.feedback:
        source_type, source_id = ("LLM_JUDGE", item.judge) if item.judge is not None else ("CODE", SOURCE_ID)
        error = cut(item.error, 2000) if item.error is not None else None
        marks.append(_Mark("feedback", item.name, item.value, error, source_type, source_id, item.rationale))
    if case.error is not None:
        response = fit_json({}, "error", case.error)
    else:
        response = fit_json({}, "answer", case.answer or "")
    return _Trace(
        trace_id=f"tr-{otel_trace_id:032x}",
        otel_trace_id=otel_trace_id,
        case=case,
        start_ns=start_ns,
        duration_ns=duration_ns,
        request_preview=request_preview(case.case_id, case.question),
        response_preview=response,
        spans=_case_spans(case, start_ns, duration_ns),
        marks=marks,
    )


def _error_dict(message: str) -> dict[str, str]:
    return {"error_code": "RAGEXP_NO_SCORE", "error_message": message}


def _attributes(trace: _Trace, span: _Span) -> dict[str, str]:
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


def _span_dict(trace: _Trace, span: _Span) -> dict[str, Any]:
    """A span in the stored layout of ``mlflow.entities.Span.to_dict`` (what the SQL store keeps
    in ``spans.content`` and ``get_trace`` reads back)."""
    return {
        "trace_id": _b64(trace.otel_trace_id, 16),
        "span_id": _b64(span.span_id, 8),
        "parent_span_id": _b64(span.parent_id, 8) if span.parent_id is not None else None,
        "name": span.name,
        "start_time_unix_nano": span.start_ns,
        "end_time_unix_nano": span.end_ns,
        "events": [],
        "status": {"code": "STATUS_CODE_ERROR" if span.error else "STATUS_CODE_OK", "message": span.error or ""},
        "attributes": _attributes(trace, span),
        "links": [],
    }


def _spans(trace: _Trace) -> list[Any]:
    """MLflow ``Span`` entities (for the OTLP path)."""
    from mlflow.entities import Span
    from mlflow.tracing.utils import build_otel_context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Status, StatusCode

    resource = Resource.get_empty()
    out = []
    for span in trace.spans:
        otel = ReadableSpan(
            name=span.name,
            context=build_otel_context(trace.otel_trace_id, span.span_id),
            parent=build_otel_context(trace.otel_trace_id, span.parent_id) if span.parent_id is not None else None,
            start_time=span.start_ns,
            end_time=span.end_ns,
            attributes=_attributes(trace, span),
            status=Status(StatusCode.ERROR, span.error[:500]) if span.error else Status(StatusCode.OK),
            resource=resource,
        )
        out.append(Span(otel))
    return out


def _case_spans(case: CaseTrace, start_ns: int, duration_ns: int) -> list[_Span]:
    """Root span (request -> answer), a retriever span with the ranked documents, and one span
    per stage the system timed, laid end to end so the timeline shows where the time went."""
    root_id = _span_id()
    error = case.error
    root_inputs = {"case_id": case.case_id, "question": cut(case.question, SPAN_TEXT_CHARS)}
    root_outputs: Any = {"error": cut(error, SPAN_TEXT_CHARS)} if error else cut(case.answer or "", SPAN_TEXT_CHARS)
    end_ns = start_ns + max(duration_ns, 1)
    spans = [_Span(TRACE_NAME, "CHAIN", root_id, None, start_ns, end_ns, root_inputs, root_outputs, error)]
    if error is not None:
        return spans
    documents = [
        {
            "id": doc_id,
            "page_content": cut(case.contexts[i], SPAN_TEXT_CHARS) if i < len(case.contexts) else "",
            "metadata": {"doc_uri": doc_id, "chunk_id": doc_id, "rank": i + 1},
        }
        for i, doc_id in enumerate(case.ranked_ids)
    ]
    retrieval_stages = [stage for stage in case.timings if stage != "model"]
    retrieve_ns = sum(int(case.timings[s] * 1e9) for s in retrieval_stages) or max(duration_ns // 2, 1)
    retriever_id = _span_id()
    query = {"query": cut(case.question, SPAN_TEXT_CHARS)}
    spans.append(
        _Span("retrieve", "RETRIEVER", retriever_id, root_id, start_ns, start_ns + retrieve_ns, query, documents, None)
    )
    cursor = start_ns
    for stage, seconds in case.timings.items():
        stage_ns = max(int(seconds * 1e9), 1)
        parent = retriever_id if stage in retrieval_stages else root_id
        kind = "LLM" if stage == "model" else ("EMBEDDING" if "embed" in stage else "UNKNOWN")
        spans.append(
            _Span(stage, kind, _span_id(), parent, cursor, cursor + stage_ns, None, {"seconds": seconds}, None)
        )
        cursor += stage_ns
    return spans


def _span_id() -> int:
    return int.from_bytes(os.urandom(8), "big") or 1
