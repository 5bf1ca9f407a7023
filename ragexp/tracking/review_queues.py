"""MLflow's review queues, label schemas and a run's traces, through MLflow's public API only.

Review queues and label schemas arrived (experimental) in MLflow 3.14: ``mlflow.genai.review_queues``
and ``mlflow.genai.label_schemas``. Those functions reach the store named by MLflow's global
tracking URI, so every call here runs with it set to the store's URI and then put back. The
reviewers' answers on the traces are read by :mod:`ragexp.labels.answers`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ragexp.errors import TrackingError

if TYPE_CHECKING:
    from ragexp.tracking.store import RunRecord, Store

REVIEW_QUEUES_SINCE = "3.14"
"""The first MLflow release with review queues and label schemas."""
LABEL_TAG = "labels.queue"
"""Run tag (under ``ragexp.``) naming the review queue ``ragexp label`` filled with the run's traces."""
TRACKING_ENV = "MLFLOW_TRACKING_URI"


def _no_review_queues(where: str) -> TrackingError:
    return TrackingError(
        f"{where} has no review queues: ragexp label and calibrate need MLflow >= {REVIEW_QUEUES_SINCE} "
        "(mlflow.genai.review_queues and label schemas)"
    )


def api() -> tuple[Any, Any]:
    """The (label_schemas, review_queues) modules of the installed MLflow."""
    try:
        from mlflow.genai import label_schemas, review_queues
    except ImportError:
        import mlflow

        raise _no_review_queues(f"MLflow {mlflow.__version__}") from None
    return label_schemas, review_queues


@contextmanager
def calls(store: Store, what: str) -> Iterator[None]:
    """MLflow's global tracking URI set to ``store`` for the fluent review-queue API; a server
    without the review-queue endpoints, and any other MLflow error, become one line."""
    import mlflow
    from mlflow.exceptions import MlflowException

    store.client  # noqa: B018  (opens and checks the store first, with its own one-line errors)
    # MLflow's set_tracking_uri also writes MLFLOW_TRACKING_URI, so the URI in force before is the
    # variable's (or MLflow's default): unsetting the global and putting the variable back restores
    # it without pinning the global to a URI that a later change of the variable could not move.
    environ = os.environ.get(TRACKING_ENV)
    mlflow.set_tracking_uri(store.uri)
    try:
        with store.calling(what):
            try:
                yield
            except MlflowException as exc:
                text = str(exc)
                if exc.error_code == "ENDPOINT_NOT_FOUND" or "404" in text.split("\n", 1)[0]:
                    from ragexp.secrets import mask_url

                    raise _no_review_queues(f"tracking server {mask_url(store.uri)}") from None
                raise
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]
        if environ is None:
            os.environ.pop(TRACKING_ENV, None)
        else:
            os.environ[TRACKING_ENV] = environ


def run_traces(store: Store, record: RunRecord) -> list[Any]:
    """``TraceInfo`` of every trace of the run (assessments included, spans left out)."""
    from ragexp.tracking.traces import TraceWriter

    return TraceWriter(store, record.experiment_id, record.run_id).infos()


def label_schemas_of(label_schemas: Any, experiment_id: str) -> list[Any]:
    """Every label schema of an experiment, page by page (``label_schemas`` as :func:`api` gives it)."""
    found: list[Any] = []
    token = None
    while True:
        page = label_schemas.list_label_schemas(experiment_id, max_results=100, page_token=token)
        found.extend(page)
        token = page.token
        if not token or not page:
            return found
