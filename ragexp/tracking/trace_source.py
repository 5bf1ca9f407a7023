"""Production traffic read from an MLflow experiment's traces, through MLflow's public search API.

What a trace holds is turned into plain records here (the root span's input and output, the
documents of its RETRIEVER spans, its tags and metadata), so that the rest of the package reads
traffic without importing mlflow (see :mod:`ragexp.workflows.traffic`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragexp.errors import ConfigError

if TYPE_CHECKING:
    from ragexp.tracking.store import Store

PAGE = 500
"""Traces asked for per search call."""


@dataclass(frozen=True)
class TraceRecord:
    """One production trace, as read: what its spans say, not yet what a case makes of it."""

    trace_id: str
    timestamp_ms: int
    state: str
    tags: dict[str, str]
    metadata: dict[str, str]
    root_inputs: Any = None
    root_outputs: Any = None
    duration_ms: int | None = None
    retrieved: list[Any] = field(default_factory=list)
    """The outputs of each RETRIEVER span, in the order the spans started."""
    has_root: bool = True
    """The trace has a root span (a trace whose spans were not all written has none)."""


def read_traces(
    store: Store,
    experiment: str,
    filter_string: str | None = None,
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> list[TraceRecord]:
    """Every trace of ``experiment`` that ``filter_string`` (MLflow's trace filter syntax) and the
    time window ``[start_ms, end_ms)`` admit, oldest first."""
    experiment_id = store.experiment_id(experiment, create=False)
    if experiment_id is None:
        raise ConfigError(f"config: dataset.experiment: no experiment {experiment!r} in {store.uri}")
    # MLflow's trace filter grammar is clauses joined by AND, without parentheses.
    clauses = [filter_string] if filter_string else []
    if start_ms is not None:
        clauses.append(f"trace.timestamp_ms >= {int(start_ms)}")
    if end_ms is not None:
        clauses.append(f"trace.timestamp_ms < {int(end_ms)}")
    joined = " AND ".join(clauses) or None
    records: list[TraceRecord] = []
    token: str | None = None
    with store.calling(f"reading the traces of experiment {experiment!r}"):
        while True:
            page = store.client.search_traces(
                locations=[experiment_id],
                filter_string=joined,
                max_results=PAGE,
                order_by=["timestamp_ms ASC"],
                page_token=token,
                include_spans=True,
            )
            records.extend(_record(trace) for trace in page)
            token = page.token
            if not token:
                break
    return records


def _record(trace: Any) -> TraceRecord:
    info = trace.info
    spans = sorted(trace.data.spans if trace.data is not None else [], key=lambda span: span.start_time_ns or 0)
    root = next((span for span in spans if span.parent_id is None), None)
    retrieved = [span.outputs for span in spans if span.span_type == "RETRIEVER"]
    return TraceRecord(
        trace_id=str(info.trace_id),
        timestamp_ms=int(info.request_time),
        state=str(getattr(info.state, "value", info.state)),
        tags=dict(info.tags or {}),
        metadata=dict(info.trace_metadata or {}),
        root_inputs=root.inputs if root is not None else None,
        root_outputs=root.outputs if root is not None else None,
        duration_ms=int(info.execution_duration) if info.execution_duration is not None else None,
        retrieved=retrieved,
        has_root=root is not None,
    )
