"""Every case of a run as an MLflow trace with its assessments, written in bulk.

MLflow's public tracing API writes one trace at a time: a span exporter behind a queue that
drops data when full, then one ``log_feedback`` call (one transaction) per assessment. This
module writes the traces :func:`ragexp.case_traces.plan_trace` plans, batched:

- SQL stores the compatibility check admits: the rows ``start_trace`` + ``log_spans`` would
  write (:mod:`ragexp.tracking.mlflow_sql.trace_rows`), one multi-row INSERT per table in ONE
  transaction per batch, through :mod:`sqlite3` or MLflow's SQLAlchemy session;
- a tracking server: MLflow's ``start_trace`` per trace (its assessments ride along) and the
  spans of every 100 traces in one ``log_spans``, under :class:`_Flow`;
- any other store: MLflow's public tracing API.

Nothing is queued: every call returns only once the store has the data, and an error stops the
writing with a :class:`~ragexp.errors.TrackingError`.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ragexp import limits
from ragexp.case_traces import (
    CASE_METADATA,
    OUTSIDE_METADATA,
    SESSION_METADATA,
    TRACE_NAME,
    CaseTrace,
    PlannedTrace,
    outside_mean,
    plan_traces,
    session_id,
)
from ragexp.errors import StorageError, StoreUnreachable, TrackingError
from ragexp.records import cut
from ragexp.secrets import mask_url
from ragexp.tracking.mlflow_sql import internals
from ragexp.tracking.mlflow_sql.schema import Declined
from ragexp.tracking.mlflow_sql.trace_rows import (
    ASSESSMENT_RUN,
    attributes,
    error_dict,
    insert_sqlalchemy,
    trace_rows,
)
from ragexp.tracking.mlflow_sql.writer import append_path
from ragexp.tracking.records import connection_lost, one_line
from ragexp.tracking.store import SERVER_THREADS

if TYPE_CHECKING:
    from ragexp.tracking.store import Store

BATCH = 500
"""Traces per transaction (SQL stores)."""
SERVER_SPAN_BATCH = 100
"""Traces whose spans go in one OTLP request to a tracking server."""
RUN_METADATA = "mlflow.sourceRun"


class TraceWriter:
    """Writes :class:`CaseTrace` records of one run into a store, counted and never queued."""

    def __init__(self, store: Store, experiment_id: str, run_id: str) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.run_id = run_id
        self._backend: Any = None

    @property
    def backend(self) -> Any:
        """MLflow's own store behind the client (imports mlflow)."""
        if self._backend is None:
            self._backend = internals.tracking_backend(self.store.client)
        return self._backend

    # --- writing ------------------------------------------------------------------------------

    def write(self, traces: Sequence[CaseTrace], *, batch: int = BATCH) -> int:
        """Write every trace; returns how many were written (all, or an error is raised).

        The rows go in directly where the compatibility check admits the store (checked again in
        each batch's transaction); anywhere else, and from the batch where a check fails, MLflow's
        public tracing API writes them."""
        put = self._direct_put()
        if put is None:
            kind = internals.backend_kind(self.store.client)
            if kind == "rest":
                return self._write_server(traces)
            put = self._write_sql if kind == "sql" and not self.store.declined_for_good else self._write_public
        written = 0
        sessions: dict[str, int] = {}
        for start in range(0, len(traces), batch):
            chunk = plan_traces(traces[start : start + batch], sessions)
            try:
                try:
                    put(chunk)
                except Declined as declined:
                    self.store.declined(declined)
                    put = self._write_public
                    put(chunk)
            except StorageError as exc:
                # A full disk stays a StorageError: the run then marks itself using its reserve.
                raise StorageError(f"{exc} ({written} of {len(traces)} traces written)") from None
            except Exception as exc:  # a store raises many types (SQL, HTTP, MLflow)
                raise self._failed(exc, written, len(traces)) from None
            written += len(chunk)
        return written

    def _failed(self, exc: BaseException, written: int, total: int) -> TrackingError:
        """One line; a store that stopped answering is a :class:`StoreUnreachable`, so the run
        sends it nothing more and says where its results are kept."""
        error = StoreUnreachable if connection_lost(exc) else TrackingError
        return error(
            f"logging traces of run {self.run_id} to {mask_url(self.store.uri)}: {written} of {total} "
            f"written when the store failed: {mask_url(one_line(exc))}"
        )

    def _write_server(self, traces: Sequence[CaseTrace]) -> int:
        """A tracking server, through MLflow's REST client: one ``start_trace`` per trace (its
        assessments ride along, one transaction on the server) and the spans of every
        ``SERVER_SPAN_BATCH`` traces in one OTLP request once their trace infos are stored, every
        call under one :class:`_Flow` (how many in flight, what is asked again).

        The server has no batch endpoint for trace infos or assessments, so what the client can
        do is keep it busy: the trace infos of the next chunk are in flight while a chunk's spans
        are sent, and no thread waits for a chunk boundary. Spans go after their trace's info:
        the other order makes ``StartTraceV3`` take the server's slower merge-into-existing-trace
        path."""
        total = len(traces)
        written = 0
        flow = _Flow(self.store.timeout_s)
        pool = ThreadPoolExecutor(max_workers=SERVER_THREADS)
        in_flight: deque[tuple[list[PlannedTrace], list[Future[Any]]]] = deque()
        span_requests: deque[tuple[int, Future[Any]]] = deque()
        try:
            sessions: dict[str, int] = {}
            for start in range(0, total, SERVER_SPAN_BATCH):
                chunk = plan_traces(traces[start : start + SERVER_SPAN_BATCH], sessions)
                now_ms = int(time.time() * 1000)
                infos = [pool.submit(flow.call, self.backend.start_trace, self._trace_info(t, now_ms)) for t in chunk]
                in_flight.append((chunk, infos))
                # Two chunks of trace infos in flight: the pool never drains at a chunk's end.
                while len(in_flight) > 1:
                    self._send_spans(pool, flow, in_flight.popleft(), span_requests)
                while span_requests and span_requests[0][1].done():
                    count, request = span_requests.popleft()
                    request.result()
                    written += count
            while in_flight:
                self._send_spans(pool, flow, in_flight.popleft(), span_requests)
            while span_requests:
                count, request = span_requests.popleft()
                request.result()
                written += count
        except Exception as exc:  # a store raises many types (HTTP, MLflow)
            pool.shutdown(wait=True, cancel_futures=True)
            raise self._failed(exc, written, total) from None
        pool.shutdown(wait=True)
        return written

    def _send_spans(
        self,
        pool: ThreadPoolExecutor,
        flow: _Flow,
        pending: tuple[list[PlannedTrace], list[Future[Any]]],
        span_requests: deque[tuple[int, Future[Any]]],
    ) -> None:
        chunk, infos = pending
        for info in infos:
            info.result()  # raises the first failure
        spans = [span for trace in chunk for span in span_entities(trace)]
        span_requests.append((len(chunk), pool.submit(flow.call, self._log_spans, spans)))

    def _log_spans(self, spans: list[Any]) -> None:
        """``log_spans``: the server upserts spans by id, so asking again after a lost answer
        writes nothing twice."""
        self._server_version()
        self.backend.log_spans(self.experiment_id, spans)

    def _server_version(self) -> None:
        """Make sure MLflow's client knows the server's version before ``log_spans`` needs it.

        MLflow's client asks once per process, with a 3 s timeout, and keeps a failure for good:
        every later ``log_spans`` then fails ("could not identify MLflow server version"). A busy
        server can take longer than 3 s, so a failed answer is checked again with the run's own
        timeout and, if the server does know its version, forgotten so MLflow asks again."""
        from mlflow.utils.rest_utils import http_request

        probe = internals.server_version_probe(self.backend)
        creds = self.backend.get_host_creds()
        if probe is None or probe(creds) is not None:
            return
        # No retries here: a server that does not answer is gone, and the write stops.
        answer = http_request(
            creds, "/version", "GET", timeout=self.store.timeout_s, max_retries=0, raise_on_status=False
        )  # type: ignore[no-untyped-call]
        if answer.status_code == 200:
            probe.cache_clear()

    def _write_public(self, chunk: list[PlannedTrace]) -> None:
        """MLflow's public tracing API, the reference: each trace's spans with their own times,
        exported synchronously, then one ``log_feedback``/``log_expectation`` per assessment."""
        import mlflow
        from mlflow.entities import AssessmentError, AssessmentSource, SpanStatus, SpanStatusCode

        # An asynchronous export drops traces when its queue is full; the assessments need the
        # trace stored first.
        os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.store.uri)
        try:
            for trace in chunk:
                live: dict[int, Any] = {}
                for span in trace.spans:
                    # A child given an experiment starts a trace of its own.
                    where: dict[str, Any] = (
                        {"metadata": self._trace_metadata(trace), "experiment_id": self.experiment_id}
                        if span.parent_id is None
                        else {"parent_span": live[span.parent_id]}
                    )
                    live[span.span_id] = mlflow.start_span_no_context(
                        span.name, span_type=span.kind, inputs=span.inputs, start_time_ns=span.start_ns, **where
                    )
                for span in reversed(trace.spans):
                    status = (
                        SpanStatus(SpanStatusCode.ERROR, span.error) if span.error else SpanStatus(SpanStatusCode.OK)
                    )
                    live[span.span_id].end(outputs=span.outputs, status=status, end_time_ns=span.end_ns)
                trace_id = live[trace.spans[0].span_id].trace_id
                mlflow.flush_trace_async_logging()
                metadata = {ASSESSMENT_RUN: self.run_id}
                for mark in trace.marks:
                    source = AssessmentSource(source_type=mark.source_type, source_id=mark.source_id)
                    if mark.kind == "expectation":
                        mlflow.log_expectation(
                            trace_id=trace_id, name=mark.name, value=mark.value, source=source, metadata=metadata
                        )
                    else:
                        error = AssessmentError(**error_dict(mark.error)) if mark.error is not None else None
                        mlflow.log_feedback(
                            trace_id=trace_id,
                            name=mark.name,
                            value=mark.value if error is None else None,
                            source=source,
                            error=error,
                            rationale=mark.rationale,
                            metadata=metadata,
                        )
        finally:
            mlflow.set_tracking_uri(previous)

    def _write_sql(self, chunk: list[PlannedTrace]) -> None:
        """A SQL store MLflow opened: the planned rows through its SQLAlchemy session."""
        insert_sqlalchemy(
            self.backend, self.experiment_id, lambda location, ascii_only: self._rows(chunk, location, ascii_only)
        )

    def _rows(
        self, chunk: list[PlannedTrace], location: Callable[[str], str], ascii_only: bool = False
    ) -> dict[str, list[dict[str, Any]]]:
        return trace_rows(chunk, self.experiment_id, self.run_id, self._trace_metadata, location, ascii_only)

    def _direct_put(self) -> Callable[[list[PlannedTrace]], None] | None:
        """On a SQLite store ragexp writes itself (:mod:`ragexp.tracking.mlflow_sql.writer`): the
        rows through :mod:`sqlite3`, one transaction per batch. None: MLflow writes."""
        direct = self.store.sql_writer()
        location = direct.experiment_location(self.experiment_id) if direct is not None else None
        if direct is None or not location or append_path(location, "traces") is None:
            return None

        def put(chunk: list[PlannedTrace]) -> None:
            rows = self._rows(chunk, lambda tid: str(append_path(location, "traces", tid, "artifacts")))
            direct.insert_traces(rows, "writing their rows")

        return put

    def _trace_metadata(self, trace: PlannedTrace) -> dict[str, str]:
        metadata = {
            RUN_METADATA: self.run_id,
            CASE_METADATA: cut(trace.case.case_id, 200),
            "mlflow.trace_schema.version": "3",
        }
        if trace.case.session is not None:
            metadata[SESSION_METADATA] = session_id(self.run_id, trace.case.session)
        if trace.case.outside:
            metadata[OUTSIDE_METADATA] = outside_mean(trace.case.outside, trace.case.language)
        return metadata

    def _trace_info(self, trace: PlannedTrace, now_ms: int | None = None) -> Any:
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
                entity: Any = Expectation(
                    mark.name,
                    mark.value,
                    source=source,
                    trace_id=trace.trace_id,
                    metadata=metadata,
                    create_time_ms=now_ms,
                    last_update_time_ms=now_ms,
                )
            else:
                error = error_dict(mark.error) if mark.error is not None else None
                entity = Feedback(
                    name=mark.name,
                    value=mark.value if error is None else None,
                    error=AssessmentError(**error) if error is not None else None,
                    source=source,
                    trace_id=trace.trace_id,
                    metadata=metadata,
                    rationale=mark.rationale,
                    create_time_ms=now_ms,
                    last_update_time_ms=now_ms,
                )
            entity.assessment_id = mark.assessment_id
            assessments.append(entity)
        return TraceInfo(
            trace_id=trace.trace_id,
            trace_location=TraceLocation.from_experiment_id(self.experiment_id),
            request_time=trace.start_ns // 1_000_000,
            state=TraceState.ERROR if trace.case.error is not None else TraceState.OK,
            request_preview=trace.request_preview,
            response_preview=trace.response_preview,
            client_request_id=limits.client_request_id(trace.case.case_id),
            execution_duration=trace.duration_ns // 1_000_000,
            trace_metadata=self._trace_metadata(trace),
            tags={"mlflow.traceName": TRACE_NAME},
            assessments=assessments,
        )

    # --- reading back -------------------------------------------------------------------------

    def infos(self) -> list[Any]:
        """``TraceInfo`` of every trace of the run (assessments included, spans left out)."""
        infos: list[Any] = []
        token = None
        with self.store.calling(f"reading the traces of run {self.run_id}"):
            while True:
                page = self.store.client.search_traces(
                    locations=[self.experiment_id],
                    filter_string=f"metadata.`{RUN_METADATA}` = '{self.run_id}'",
                    max_results=500,
                    page_token=token,
                    include_spans=False,
                )
                infos.extend(trace.info for trace in page)
                token = page.token
                if not token or not page:
                    return infos

    def delete_all(self) -> int:
        """Remove the run's traces (a resumed run writes each case's trace once, afresh)."""
        ids = [info.trace_id for info in self.infos()]
        with self.store.calling(f"deleting traces of run {self.run_id}"):
            for start in range(0, len(ids), 100):
                self.store.client.delete_traces(self.experiment_id, trace_ids=ids[start : start + 100])
        return len(ids)


def span_entities(trace: PlannedTrace) -> list[Any]:
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
            attributes=attributes(trace, span),
            status=Status(StatusCode.ERROR, span.error[:500]) if span.error else Status(StatusCode.OK),
            resource=resource,
        )
        out.append(Span(otel))
    return out


class _Flow:
    """The calls of one trace write to a tracking server: how many may be in flight, which
    failures are asked again, and when the whole write stops.

    A few calls at first, one more after as many answers in a row as the limit (up to
    ``SERVER_THREADS``), halved each time the server shows it is saturated: a server on SQLite
    writes one request at a time, and many parallel runs opening with every request at once
    send it into lock convoys and pool timeouts. A saturated call is asked again, with
    :func:`ragexp.transport.retry_within`, within ``tracking.timeout_s``; any other failure fails the
    call, and one that means the server no longer answers fails every call still waiting too,
    rather than each waiting out its own deadline. MLflow's client has already retried
    transport failures and 429/5xx answers (within ``Store._bound_http_retries``)."""

    START = 4
    BUSY = re.compile(
        r"QueuePool limit|database is locked|timed? ?out|too many connections|could not identify MLflow server",
        re.IGNORECASE,
    )
    """What a server says, with a 400, when its database is saturated rather than the request
    bad (MLflow answers a SQLAlchemy ``OperationalError`` with BAD_REQUEST)."""
    ANSWERED_BUSY = re.compile(r"too many (429|5\d\d) error responses")
    """A 429/5xx answer MLflow's own retries could not get past: the server answers, busy."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.limit, self.used, self.streak = self.START, 0, 0
        self.gone: Exception | None = None
        self._changed = threading.Condition()

    def call(self, call: Callable[..., Any], *args: Any) -> Any:
        with self._changed:
            while self.used >= self.limit and self.gone is None:
                self._changed.wait()
            self.used += 1
        try:
            from ragexp.transport import retry_within  # imports httpx: only when a trace goes to a server

            attempt = functools.partial(self._attempt, call, *args)
            return retry_within(attempt, timeout_s=self.timeout_s, base=0.5, again=self._busy)
        finally:
            with self._changed:
                self.used -= 1
                self._changed.notify_all()

    def _attempt(self, call: Callable[..., Any], *args: Any) -> Any:
        if self.gone is not None:
            raise self.gone
        answer = call(*args)
        self._answered(ok=True)
        return answer

    def _busy(self, exc: Exception) -> bool:
        """Whether a failed call is asked again: only when the server said it is saturated."""
        if exc is self.gone:
            return False
        lost, text = connection_lost(exc), str(exc)
        busy = self.ANSWERED_BUSY.search(text) is not None or (not lost and self.BUSY.search(text) is not None)
        self._answered(busy=busy, gone=exc if lost and not busy else None)
        return busy

    def _answered(self, *, ok: bool = False, busy: bool = False, gone: Exception | None = None) -> None:
        """One answer (``ok``), a saturated server (``busy``), or a server that is ``gone``."""
        with self._changed:
            if gone is not None and self.gone is None:
                self.gone = gone
            if busy:
                self.limit, self.streak = max(1, self.limit // 2), 0
            elif ok:
                self.streak += 1
                if self.limit < SERVER_THREADS and self.streak >= self.limit:
                    self.limit, self.streak = self.limit + 1, 0
            self._changed.notify_all()
