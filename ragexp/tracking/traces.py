"""Every case of a run as an MLflow trace with its assessments, written in bulk.

MLflow's public tracing API writes one trace at a time: a span exporter behind a queue that
drops data when full, then one ``log_feedback`` call (one transaction) per assessment. Measured
here at 70-110 ms per case on SQLite. This module builds the same entities (``TraceInfo`` with
its assessments and metadata, ``Span`` objects) and hands them to the tracking store's own
write methods, batched:

- SQL stores: the rows ``start_trace`` + ``log_spans`` would write, one multi-row INSERT per
  table, inside ONE transaction per batch (through :mod:`sqlite3` on a SQLite store ragexp
  writes directly, see :mod:`ragexp.tracking.sqlite_writer`; through SQLAlchemy otherwise);
- a tracking server (``http://``): one ``StartTraceV3`` request per trace (its assessments ride
  along), 16 in flight, and the spans of every 100 traces in one OTLP request.

Nothing is queued: every call returns only once the store has the data, and an error stops the
writing with a :class:`~ragexp.errors.TrackingError`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ragexp.case_traces import CASE_METADATA, TRACE_NAME, CaseTrace, PlannedTrace, cut, plan_trace
from ragexp.errors import StorageError, StoreUnreachable, TrackingError
from ragexp.secrets import mask_url
from ragexp.tracking import limits
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
from ragexp.transport import backoff

if TYPE_CHECKING:
    from ragexp.tracking.store import Store

BATCH = 500
"""Traces per transaction (SQL stores)."""
SERVER_THREADS = 16
"""Requests in flight to a tracking server: its workers wait on the database between requests,
so more requests than cores keep them busy."""
SERVER_SPAN_BATCH = 100
"""Traces whose spans go in one OTLP request to a tracking server."""
RUN_METADATA = "mlflow.sourceRun"


class TraceWriter:
    """Writes :class:`CaseTrace` records of one run into a store, counted and never queued."""

    def __init__(self, store: Store, experiment_id: str, run_id: str) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.run_id = run_id
        self._sender: _TraceInfoSender | None = None
        self._backend: Any = None
        self._experiment: Any = None

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
        for start in range(0, len(traces), batch):
            chunk = [plan_trace(case) for case in traces[start : start + batch]]
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
        """A tracking server: one ``StartTraceV3`` request per trace (its assessments ride along,
        one transaction on the server), ``SERVER_THREADS`` in flight, and the spans of every
        ``SERVER_SPAN_BATCH`` traces in one OTLP request once their trace infos are stored.

        The server has no batch endpoint for trace infos or assessments, and it spends ~25 ms
        of CPU per ``StartTraceV3`` (profiled), so what the client can do is keep the server busy:
        the trace infos of the next chunk are in flight while a chunk's spans are sent, and no
        thread waits for a chunk boundary. Spans go after their trace's info: the other order
        makes ``StartTraceV3`` take the server's slower merge-into-existing-trace path."""
        total = len(traces)
        written = 0
        send = _TraceInfoSender.open(self.backend, self.store.timeout_s)
        self._sender = send
        self._server_version()
        pool = ThreadPoolExecutor(max_workers=SERVER_THREADS)
        in_flight: deque[tuple[list[PlannedTrace], list[Future[Any]]]] = deque()
        span_requests: deque[tuple[int, Future[Any]]] = deque()
        try:
            for start in range(0, total, SERVER_SPAN_BATCH):
                chunk = [plan_trace(case) for case in traces[start : start + SERVER_SPAN_BATCH]]
                now_ms = int(time.time() * 1000)
                if send is not None:
                    infos = [pool.submit(send, self._start_trace_body(trace, now_ms)) for trace in chunk]
                else:
                    infos = [pool.submit(self.backend.start_trace, self._trace_info(trace, now_ms)) for trace in chunk]
                in_flight.append((chunk, infos))
                # Two chunks of trace infos in flight: the pool never drains at a chunk's end.
                while len(in_flight) > 1:
                    self._send_spans(pool, in_flight.popleft(), span_requests)
                while span_requests and span_requests[0][1].done():
                    count, request = span_requests.popleft()
                    request.result()
                    written += count
            while in_flight:
                self._send_spans(pool, in_flight.popleft(), span_requests)
            while span_requests:
                count, request = span_requests.popleft()
                request.result()
                written += count
        except Exception as exc:  # a store raises many types (HTTP, MLflow)
            pool.shutdown(wait=True, cancel_futures=True)
            raise self._failed(exc, written, total) from None
        finally:
            if send is not None:
                send.close()
        pool.shutdown(wait=True)
        return written

    def _send_spans(
        self,
        pool: ThreadPoolExecutor,
        pending: tuple[list[PlannedTrace], list[Future[Any]]],
        span_requests: deque[tuple[int, Future[Any]]],
    ) -> None:
        chunk, infos = pending
        for info in infos:
            info.result()  # raises the first failure
        spans = [span for trace in chunk for span in span_entities(trace)]
        span_requests.append((len(chunk), pool.submit(self._log_spans, spans)))

    def _log_spans(self, spans: list[Any]) -> None:
        """``log_spans`` retried within ``tracking.timeout_s``: a busy server fails some requests
        it would answer a moment later, and the server upserts spans by id, so a retry after a
        lost answer writes nothing twice."""
        deadline = time.monotonic() + self.store.timeout_s
        attempt = 0
        while True:
            if self._sender is not None and self._sender.gone is not None:
                raise self._sender.gone
            try:
                self.backend.log_spans(self.experiment_id, spans)
                return
            except Exception as exc:  # HTTP and MLflow errors alike: the last one is raised
                pause = backoff(0.5, attempt)
                # No answer after MLflow's own retries: the server is gone, not busy.
                if connection_lost(exc) or time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
                attempt += 1
                self._server_version()

    def _server_version(self) -> None:
        """Make sure MLflow's client knows the server's version before ``log_spans`` needs it.

        MLflow's client asks once per process, with a 3 s timeout, and keeps a failure for good:
        every later ``log_spans`` then fails ("could not identify MLflow server version"). A busy
        server can take longer than 3 s, so a failed answer is checked again with the run's own
        timeout and, if the server does know its version, forgotten so MLflow asks again."""
        import httpx

        probe = internals.server_version_probe(self.backend)
        send = self._sender
        if probe is None or send is None:
            return
        creds = self.backend.get_host_creds()
        if probe(creds) is not None:
            return
        try:
            answered = send.client.get(creds.host.rstrip("/") + "/version", timeout=self.store.timeout_s)
        except httpx.HTTPError:
            return  # MLflow's own error follows, from log_spans
        if answered.status_code == 200:
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
        return {
            RUN_METADATA: self.run_id,
            CASE_METADATA: cut(trace.case.case_id, 200),
            "mlflow.trace_schema.version": "3",
        }

    def _start_trace_body(self, trace: PlannedTrace, now_ms: int) -> bytes:
        """The ``StartTraceV3`` request for ``trace`` as JSON: the protobuf JSON of what
        :meth:`_trace_info` builds (``StartTraceV3(trace=Trace(info).to_proto())``, checked
        equal by the tests), written directly. MLflow's protobuf-to-JSON printer costs ~2 ms
        a trace, which on a shared machine is CPU the server does not get."""
        created = _timestamp(now_ms)
        run_metadata = {ASSESSMENT_RUN: self.run_id}
        assessments: list[dict[str, Any]] = []
        for mark in trace.marks:
            item: dict[str, Any] = {
                "assessment_id": mark.assessment_id,
                "assessment_name": mark.name,
                "trace_id": trace.trace_id,
                "source": {"source_type": mark.source_type, "source_id": mark.source_id},
                "create_time": created,
                "last_update_time": created,
            }
            if mark.kind == "expectation":
                if isinstance(mark.value, (dict, list)):
                    item["expectation"] = {
                        "serialized_value": {"serialization_format": "JSON_FORMAT", "value": json.dumps(mark.value)}
                    }
                else:
                    item["expectation"] = {"value": mark.value}
            else:
                feedback: dict[str, Any] = {"value": mark.value if mark.error is None else None}
                if mark.error is not None:
                    feedback["error"] = error_dict(mark.error)
                item["feedback"] = feedback
                if mark.rationale is not None:
                    item["rationale"] = mark.rationale
                item["valid"] = True
            item["metadata"] = run_metadata
            assessments.append(item)
        info = {
            "trace_id": trace.trace_id,
            "client_request_id": limits.client_request_id(trace.case.case_id),
            "trace_location": {"type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": self.experiment_id}},
            "request_preview": trace.request_preview,
            "response_preview": trace.response_preview,
            "request_time": _timestamp(trace.start_ns // 1_000_000),
            "execution_duration": _duration(trace.duration_ns // 1_000_000),
            "state": "ERROR" if trace.case.error is not None else "OK",
            "trace_metadata": self._trace_metadata(trace),
            "tags": {"mlflow.traceName": TRACE_NAME},
            "assessments": assessments,
        }
        return json.dumps({"trace": {"trace_info": info}}, ensure_ascii=False).encode("utf-8")

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

    def trace_ids(self) -> list[str]:
        """Ids of every trace linked to the run (all pages)."""
        ids: list[str] = []
        token = None
        with self.store.calling(f"listing traces of run {self.run_id}"):
            while True:
                page = self.store.client.search_traces(
                    locations=[self.experiment_id],
                    filter_string=f"metadata.`{RUN_METADATA}` = '{self.run_id}'",
                    max_results=500,
                    page_token=token,
                    include_spans=False,
                )
                ids.extend(trace.info.trace_id for trace in page)
                token = page.token
                if not token:
                    return ids

    def count(self) -> tuple[int, int]:
        """(traces, assessments) the store holds for the run, read back from the store."""
        ids = self.trace_ids()
        assessments = 0
        with self.store.calling(f"reading traces of run {self.run_id}"):
            for trace_id in ids:
                assessments += len(self.store.client.get_trace(trace_id).info.assessments)
        return len(ids), assessments

    def delete_all(self) -> int:
        """Remove the run's traces (a resumed run writes each case's trace once, afresh)."""
        ids = self.trace_ids()
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


def _timestamp(ms: int) -> str:
    """A protobuf ``Timestamp`` in its JSON form (RFC 3339, UTC)."""
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _duration(ms: int) -> str:
    """A protobuf ``Duration`` in its JSON form."""
    seconds, millis = divmod(ms, 1000)
    return f"{seconds}.{millis:03d}s"


class _TraceInfoSender:
    """Posts ``StartTraceV3`` requests on one pooled HTTP client.

    MLflow's REST client re-resolves its request headers (including a Databricks-context probe
    that retries failed imports) and parses every response into entities: ~10 ms of client CPU a
    trace here, on the cores the server needs. The headers are resolved once, the response is
    only checked, and transient failures are retried (``StartTraceV3`` is an upsert keyed by
    the trace and assessment ids, so a retry after a lost response writes nothing twice)."""

    RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
    ATTEMPTS = 5
    SATURATED = re.compile(r"QueuePool limit|database is locked|timed? ?out|too many connections", re.IGNORECASE)
    """What a server says, with a 400, when its database is saturated rather than the request
    bad (MLflow answers a SQLAlchemy ``OperationalError`` with BAD_REQUEST)."""

    def __init__(self, client: Any, url: str, timeout_s: float) -> None:
        self.client = client
        self.url = url
        self.timeout_s = timeout_s
        self.slots = _Slots(SERVER_THREADS, start=4)
        self.gone: Exception | None = None
        """The transport failure that used up one request's retries: the server is gone, and the
        requests still in flight stop retrying rather than each wait out their own deadline."""

    @classmethod
    def open(cls, backend: Any, timeout_s: float) -> _TraceInfoSender | None:
        """A sender for ``backend``'s server, or None when its authentication needs MLflow's own
        client (AWS SigV4, auth plugins, Databricks SDK, client certificates). ``timeout_s`` is
        ``tracking.timeout_s``: how long one trace may go unanswered, retries included, before
        the run stops (as for every other tracking call)."""
        import httpx
        from mlflow.tracking.request_header.registry import resolve_request_headers

        creds = backend.get_host_creds()
        if creds.aws_sigv4 or creds.auth or creds.use_databricks_sdk or creds.client_cert_path:
            return None
        try:
            path = internals.trace_path()
            workspace = internals.request_workspace()
        except Declined:
            return None
        if workspace:
            return None  # workspace routing: leave it to MLflow's client
        headers = {**resolve_request_headers(), "Content-Type": "application/json"}  # type: ignore[no-untyped-call]
        if creds.username and creds.password:
            token = base64.standard_b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        elif creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        verify: Any = False if creds.ignore_tls_verification else (creds.server_cert_path or True)
        client = httpx.Client(
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=SERVER_THREADS, max_keepalive_connections=SERVER_THREADS),
        )
        return cls(client, creds.host.rstrip("/") + path, timeout_s)

    def __call__(self, body: bytes) -> None:
        import httpx

        with self.slots.held():
            deadline = time.monotonic() + self.timeout_s
            for attempt in range(self.ATTEMPTS):
                pause = backoff(0.5, attempt)
                last = attempt == self.ATTEMPTS - 1 or time.monotonic() + pause >= deadline
                remaining = max(deadline - time.monotonic(), 1.0)
                if self.gone is not None:
                    raise self.gone
                try:
                    response = self.client.post(self.url, content=body, timeout=remaining)
                except httpx.TransportError as exc:
                    if last:
                        self.gone = exc
                        raise
                else:
                    if response.status_code < 300:
                        self.slots.answered()
                        return
                    text = _error_text(response)
                    saturated = response.status_code == 400 and self.SATURATED.search(text) is not None
                    if (response.status_code not in self.RETRY_STATUS and not saturated) or last:
                        raise TrackingError(f"StartTraceV3 answered {response.status_code}: {text}")
                self.slots.saturated()
                time.sleep(pause)

    def close(self) -> None:
        self.client.close()


class _Slots:
    """How many ``StartTraceV3`` requests may be in flight: a few at first, one more after as
    many answers in a row as the limit (up to the most), halved each time the server shows it is
    saturated (429/5xx, its database pool or lock timing out). A server on SQLite writes one
    request at a time: six parallel runs opening with 16 requests each left it answering none
    within a minute (lock convoys, then pool timeouts); opening with 4 they all finished."""

    def __init__(self, most: int, start: int) -> None:
        self.most, self.limit = most, min(start, most)
        self.used = self.streak = 0
        self._changed = threading.Condition()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._changed:
            while self.used >= self.limit:
                self._changed.wait()
            self.used += 1
        try:
            yield
        finally:
            with self._changed:
                self.used -= 1
                self._changed.notify_all()

    def saturated(self) -> None:
        with self._changed:
            self.limit = max(1, self.limit // 2)
            self.streak = 0

    def answered(self) -> None:
        with self._changed:
            self.streak += 1
            if self.limit < self.most and self.streak >= self.limit:
                self.limit += 1
                self.streak = 0
                self._changed.notify_all()


def _error_text(response: Any) -> str:
    """The server's error in one line (MLflow answers ``{"error_code", "message"}``)."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "message" in payload:
        text = f"{payload.get('error_code', '')} {payload['message']}".strip()
    else:
        text = str(response.text)[:300]
    lines = text.strip().splitlines()
    return lines[0] if lines else f"HTTP {response.status_code}"
