"""The only package that imports mlflow: runs, tags, params, metrics and artifacts."""

from ragexp.tracking.store import DEFAULT_URI, RunRecord, Store, resolve_uri

__all__ = ["DEFAULT_URI", "RunRecord", "Store", "resolve_uri"]
