"""The private MLflow symbols ragexp uses, in one place: an MLflow where any of them is missing
(an ``ImportError``, an ``AttributeError``) is an MLflow ragexp does not know, and its callers
then use MLflow's public API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragexp.tracking.mlflow_sql.schema import Declined


def tracking_backend(client: Any) -> Any:
    """MLflow's own store behind ``client``."""
    try:
        return client._tracking_client.store
    except AttributeError:
        raise Declined("the installed MLflow's client has no tracking store ragexp knows") from None


def backend_kind(client: Any) -> str | None:
    """``"rest"`` (a tracking server), ``"sql"`` (a SQLAlchemy store) or None (anything else)."""
    try:
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        backend = tracking_backend(client)
    except (ImportError, Declined):
        return None
    if isinstance(backend, RestStore):
        return "rest"
    return "sql" if isinstance(backend, SqlAlchemyStore) else None


def server_version_probe(backend: Any) -> Any:
    """MLflow's cached probe of the server's version (None when this MLflow has none)."""
    probe = getattr(type(backend), "_get_server_version", None)
    return probe if probe is not None and hasattr(probe, "cache_clear") else None


def trace_tables(backend: Any) -> tuple[dict[str, Any], Callable[[Any, str], Any], Callable[..., Any]]:
    """Of MLflow's SQLAlchemy store ``backend``: its ORM model of each trace table (table name ->
    model, in the order rows go in), the function giving a trace's artifact-location tag
    ``(experiment, trace_id) -> tag``, and its session maker."""
    try:
        from mlflow.store.tracking.dbmodels.models import (
            SqlAssessments,
            SqlSpan,
            SqlTraceInfo,
            SqlTraceMetadata,
            SqlTraceTag,
        )

        tag_of = backend._get_trace_artifact_location_tag
        session_maker = backend.ManagedSessionMaker
    except (ImportError, AttributeError):
        raise Declined("the installed MLflow's SQL store is not one ragexp knows") from None
    models = {
        "trace_info": SqlTraceInfo,
        "trace_tags": SqlTraceTag,
        "trace_request_metadata": SqlTraceMetadata,
        "assessments": SqlAssessments,
        "spans": SqlSpan,
    }
    return models, tag_of, session_maker
