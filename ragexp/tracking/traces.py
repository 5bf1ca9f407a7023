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
    from mlflow.entities import Span, TraceInfo

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
        written = 0
        for start in range(0, len(traces), batch):
            chunk = traces[start : start + batch]
            infos, spans = self._entities(chunk)
            try:
                self._write_batch(infos, spans)
            except Exception as exc:  # a store raises many types (SQL, HTTP, MLflow)
                raise TrackingError(
                    f"logging traces of run {self.run_id} to {self.store.uri}: {written} of {len(traces)} "
                    f"written when the store failed: {_one_line(exc)}"
                ) from None
            written += len(chunk)
        return written

    def _write_batch(self, infos: list[TraceInfo], spans: list[Span]) -> None:
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        backend = self.backend
        if isinstance(backend, SqlAlchemyStore):
            self._sql_bulk(backend, infos, spans)
        elif isinstance(backend, RestStore):
            # One request per trace (its assessments ride along), a few in flight at once; the
            # spans of the whole batch in one OTLP request once their traces exist.
            with ThreadPoolExecutor(max_workers=min(SERVER_THREADS, len(infos))) as pool:
                list(pool.map(backend.start_trace, infos))
            backend.log_spans(self.experiment_id, spans)
        else:
            for info in infos:
                backend.start_trace(info)
            backend.log_spans(self.experiment_id, spans)

    def _sql_bulk(self, backend: Any, infos: list[TraceInfo], spans: list[Span]) -> None:
        """The rows ``start_trace`` + ``log_spans`` write, as multi-row INSERTs in one
        transaction per batch. Those methods run dozens of statements and a flush per trace
        (measured 28 ms + 25 ms a trace here); the rows are the same."""
        from mlflow.store.tracking.dbmodels.models import (
            SqlAssessments,
            SqlSpan,
            SqlTraceInfo,
            SqlTraceMetadata,
            SqlTraceTag,
        )
        from mlflow.tracing.otel.translation import translate_span_when_storing
        from mlflow.tracing.utils import TraceJSONEncoder
        from sqlalchemy import insert

        if self._experiment is None:
            self._experiment = backend.get_experiment(self.experiment_id)
        experiment_id = int(self.experiment_id)
        trace_rows, tag_rows, meta_rows, assessment_rows, span_rows = [], [], [], [], []
        assessment_columns = [column.key for column in SqlAssessments.__table__.columns]
        for info in infos:
            trace_rows.append(
                {
                    "request_id": info.trace_id,
                    "experiment_id": experiment_id,
                    "timestamp_ms": info.request_time,
                    "execution_time_ms": info.execution_duration,
                    "status": info.state.value,
                    "client_request_id": info.client_request_id,
                    "request_preview": info.request_preview,
                    "response_preview": info.response_preview,
                    "trace_name": info.tags.get("mlflow.traceName"),
                }
            )
            location = backend._get_trace_artifact_location_tag(self._experiment, info.trace_id)
            tag_rows.append({"request_id": info.trace_id, "key": location.key, "value": location.value})
            tag_rows.append(
                {"request_id": info.trace_id, "key": "mlflow.trace.spansLocation", "value": "TRACKING_STORE"}
            )
            for key, value in info.trace_metadata.items():
                meta_rows.append({"request_id": info.trace_id, "key": key, "value": value})
            for assessment in info.assessments:
                row = SqlAssessments.from_mlflow_entity(assessment)
                row.experiment_id = experiment_id
                row.trace_timestamp_ms = info.request_time
                assessment_rows.append({key: getattr(row, key) for key in assessment_columns})
        ascii_only = backend.db_type == "mssql"
        for span in spans:
            span_rows.append(
                {
                    "trace_id": span.trace_id,
                    "experiment_id": experiment_id,
                    "span_id": span.span_id,
                    "parent_span_id": span.parent_id,
                    "name": span.name,
                    "type": span.span_type,
                    "status": span.status.status_code,
                    "start_time_unix_nano": span.start_time_ns,
                    "end_time_unix_nano": span.end_time_ns,
                    "content": json.dumps(
                        translate_span_when_storing(span), cls=TraceJSONEncoder, ensure_ascii=ascii_only
                    ),
                }
            )
        with backend.ManagedSessionMaker(read_only=False) as session:
            for model, rows in (
                (SqlTraceInfo, trace_rows),
                (SqlTraceTag, tag_rows),
                (SqlTraceMetadata, meta_rows),
                (SqlAssessments, assessment_rows),
                (SqlSpan, span_rows),
            ):
                if rows:
                    session.execute(insert(model), rows)

    def _entities(self, chunk: Sequence[CaseTrace]) -> tuple[list[TraceInfo], list[Span]]:
        from mlflow.entities import (
            AssessmentError,
            AssessmentSource,
            AssessmentSourceType,
            Expectation,
            Feedback,
            TraceInfo,
            TraceLocation,
            TraceState,
        )

        now_ns = time.time_ns()
        infos: list[TraceInfo] = []
        spans: list[Span] = []
        code = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=SOURCE_ID)
        human = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="dataset")
        judges: dict[str, Any] = {}
        location = TraceLocation.from_experiment_id(self.experiment_id)
        metadata = {ASSESSMENT_RUN: self.run_id}
        for case in chunk:
            otel_trace_id = uuid.uuid4().int
            trace_id = f"tr-{otel_trace_id:032x}"
            duration_ns = int((case.latency_seconds or 0.0) * 1e9) or sum(int(s * 1e9) for s in case.timings.values())
            case_spans = _case_spans(case, trace_id, otel_trace_id, now_ns, duration_ns)
            spans.extend(case_spans)
            assessments: list[Any] = []
            for name, value in case.expectations.items():
                assessments.append(
                    Expectation(name=name, value=value, source=human, trace_id=trace_id, metadata=metadata)
                )
            for item in case.feedback:
                if item.judge is not None:
                    source = judges.get(item.judge)
                    if source is None:
                        source = judges[item.judge] = AssessmentSource(
                            source_type=AssessmentSourceType.LLM_JUDGE, source_id=item.judge
                        )
                else:
                    source = code
                error = (
                    AssessmentError(error_code="RAGEXP_NO_SCORE", error_message=cut(item.error, 2000))
                    if item.error is not None
                    else None
                )
                assessments.append(
                    Feedback(
                        name=item.name,
                        value=item.value if error is None else None,
                        error=error,
                        source=source,
                        trace_id=trace_id,
                        metadata=metadata,
                        rationale=item.rationale,
                    )
                )
            if case.error is not None:
                response = fit_json({}, "error", case.error)
            else:
                response = fit_json({}, "answer", case.answer or "")
            infos.append(
                TraceInfo(
                    trace_id=trace_id,
                    trace_location=location,
                    request_time=now_ns // 1_000_000,
                    state=TraceState.ERROR if case.error is not None else TraceState.OK,
                    request_preview=request_preview(case.case_id, case.question),
                    response_preview=response,
                    client_request_id=cut(case.case_id, 200),
                    execution_duration=duration_ns // 1_000_000,
                    trace_metadata={
                        RUN_METADATA: self.run_id,
                        CASE_METADATA: cut(case.case_id, 200),
                        "mlflow.trace_schema.version": "3",
                    },
                    tags={"mlflow.traceName": "rag_case"},
                    assessments=assessments,
                )
            )
        return infos, spans

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


def _case_spans(case: CaseTrace, trace_id: str, otel_trace_id: int, start_ns: int, duration_ns: int) -> list[Span]:
    """Root span (request -> answer), a retriever span with the ranked documents, and one span
    per stage the system timed, laid end to end so the timeline shows where the time went."""
    from mlflow.entities import Span

    root_id = _span_id()
    end_ns = start_ns + max(duration_ns, 1)
    error = case.error
    root_inputs = {"case_id": case.case_id, "question": cut(case.question, SPAN_TEXT_CHARS)}
    root_outputs: Any = {"error": cut(error, SPAN_TEXT_CHARS)} if error else cut(case.answer or "", SPAN_TEXT_CHARS)
    spans = [
        Span(
            _otel_span(
                "rag_case",
                "CHAIN",
                trace_id,
                otel_trace_id,
                root_id,
                None,
                start_ns,
                end_ns,
                root_inputs,
                root_outputs,
                error,
            )
        )
    ]
    if error is None:
        documents = [
            {
                "id": doc_id,
                "page_content": cut(case.contexts[i], SPAN_TEXT_CHARS) if i < len(case.contexts) else "",
                "metadata": {"doc_uri": doc_id, "chunk_id": doc_id, "rank": i + 1},
            }
            for i, doc_id in enumerate(case.ranked_ids)
        ]
        retrieval_stages = [s for s in case.timings if s != "model"]
        retrieve_ns = sum(int(case.timings[s] * 1e9) for s in retrieval_stages) or max(duration_ns // 2, 1)
        retriever_id = _span_id()
        spans.append(
            Span(
                _otel_span(
                    "retrieve",
                    "RETRIEVER",
                    trace_id,
                    otel_trace_id,
                    retriever_id,
                    root_id,
                    start_ns,
                    start_ns + retrieve_ns,
                    {"query": cut(case.question, SPAN_TEXT_CHARS)},
                    documents,
                    None,
                )
            )
        )
        cursor = start_ns
        for stage, seconds in case.timings.items():
            stage_ns = max(int(seconds * 1e9), 1)
            parent = retriever_id if stage in retrieval_stages else root_id
            kind = "LLM" if stage == "model" else ("EMBEDDING" if "embed" in stage else "UNKNOWN")
            spans.append(
                Span(
                    _otel_span(
                        stage,
                        kind,
                        trace_id,
                        otel_trace_id,
                        _span_id(),
                        parent,
                        cursor,
                        cursor + stage_ns,
                        None,
                        {"seconds": seconds},
                        None,
                    )
                )
            )
            cursor += stage_ns
    return spans


def _span_id() -> int:
    return int.from_bytes(os.urandom(8), "big") or 1


def _otel_span(
    name: str,
    kind: str,
    trace_id: str,
    otel_trace_id: int,
    span_id: int,
    parent_id: int | None,
    start_ns: int,
    end_ns: int,
    inputs: Any,
    outputs: Any,
    error: str | None,
) -> Any:
    from mlflow.tracing.utils import build_otel_context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Status, StatusCode

    attributes = {
        "mlflow.traceRequestId": json.dumps(trace_id),
        "mlflow.spanType": json.dumps(kind),
    }
    if inputs is not None:
        attributes["mlflow.spanInputs"] = json.dumps(inputs, ensure_ascii=False)
    if outputs is not None:
        attributes["mlflow.spanOutputs"] = json.dumps(outputs, ensure_ascii=False)
    return ReadableSpan(
        name=name,
        context=build_otel_context(otel_trace_id, span_id),
        parent=build_otel_context(otel_trace_id, parent_id) if parent_id is not None else None,
        start_time=start_ns,
        end_time=end_ns,
        attributes=attributes,
        status=Status(StatusCode.ERROR, error[:500]) if error else Status(StatusCode.OK),
        resource=_EMPTY_RESOURCE.get(Resource),
    )


class _Lazy:
    """One empty OTel resource for every span (``Resource.create`` is slow, and mlflow does the
    same in ``Span.from_dict``)."""

    def __init__(self) -> None:
        self.value: Any = None

    def get(self, cls: Any) -> Any:
        if self.value is None:
            self.value = cls.get_empty()
        return self.value


_EMPTY_RESOURCE = _Lazy()
