"""The private MLflow symbols ragexp uses, in one place: an MLflow where any of them is missing
(an ``ImportError``, an ``AttributeError``) is an MLflow ragexp does not know, and its callers
then use MLflow's public API."""

from __future__ import annotations

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
