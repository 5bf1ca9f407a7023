"""A thin, typed layer over ``MlflowClient``; mlflow is imported on first use only."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexp.errors import TrackingError

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
TAG_PREFIX = "ragexp."
FINISHED, FAILED, KILLED, RUNNING = "FINISHED", "FAILED", "KILLED", "RUNNING"


def resolve_uri(explicit: str | None) -> str:
    """``explicit``, else ``MLFLOW_TRACKING_URI``, else the SQLite store under ``mlruns/``."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


@dataclass
class RunRecord:
    """What ragexp reads back about a run."""

    run_id: str
    name: str
    experiment_id: str
    status: str
    start_time: int
    end_time: int | None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def tag(self, name: str, default: str = "") -> str:
        return self.tags.get(TAG_PREFIX + name, default)


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :])


class Store:
    """One MLflow tracking store."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = resolve_uri(uri)
        # MLflow draws download progress bars on stderr for every artifact read, and prints the
        # run's URL on stdout when a run on a tracking server ends (stdout is for --json).
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            for name in ("alembic", "mlflow"):
                logging.getLogger(name).setLevel(logging.WARNING)
            db = _sqlite_path(self.uri)
            if db is not None and str(db) != ":memory:":
                db.parent.mkdir(parents=True, exist_ok=True)
            from mlflow.tracking import MlflowClient

            try:
                # A new SQLite store runs schema migrations on first open; parallel processes
                # (a joblib sweep) must not run them at the same time.
                with _file_lock(db.parent / ".ragexp-init.lock" if db is not None and str(db) != ":memory:" else None):
                    self._client = MlflowClient(tracking_uri=self.uri)
            except Exception as exc:  # mlflow raises many types for a bad store
                raise TrackingError(f"tracking store {self.uri}: {_one_line(exc)}") from None
        return self._client

    @contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            raise TrackingError(f"{what}: {_one_line(exc)}") from None
        except OSError as exc:
            raise TrackingError(f"{what}: tracking store {self.uri} unreachable ({_one_line(exc)})") from None

    def calling(self, what: str) -> Any:
        """Context manager: MLflow and network errors inside become one-line TrackingErrors."""
        return self._calling(what)

    # --- experiments and runs -----------------------------------------------------------------

    def experiment_id(self, name: str, *, create: bool) -> str | None:
        with self._calling(f"experiment '{name}'"):
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                return str(experiment.experiment_id)
            if not create:
                return None
            db = _sqlite_path(self.uri)
            location = None
            if db is not None:
                # Keep artifacts beside the database instead of MLflow's cwd-relative ./mlruns.
                location = (db.resolve().parent / "artifacts").as_uri()
            from mlflow.exceptions import MlflowException

            try:
                return str(self.client.create_experiment(name, artifact_location=location))
            except MlflowException:
                # Another process created it in the meantime.
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                return str(experiment.experiment_id)

    def experiment_name(self, experiment_id: str) -> str:
        with self._calling(f"experiment {experiment_id}"):
            return str(self.client.get_experiment(experiment_id).name)

    def create_run(self, experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]) -> str:
        experiment_id = self.experiment_id(experiment, create=True)
        assert experiment_id is not None  # create=True always returns an id
        with self._calling(f"creating a run in experiment '{experiment}'"):
            run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
            run_id: str = run.info.run_id
            self._log_params(run_id, params)
            return run_id

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value[:6000]) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        with self._calling(f"logging metrics of run {run_id}"):
            for start in range(0, len(items), 1000):
                self.client.log_batch(run_id, metrics=items[start : start + 1000])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        with self._calling(f"tagging run {run_id}"):
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_files(self, run_id: str, files: Mapping[str, bytes]) -> None:
        """Write ``name -> bytes`` as artifacts of the run."""
        with tempfile.TemporaryDirectory(prefix="ragexp-") as tmp:
            for name, data in files.items():
                target = Path(tmp, name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            self.log_dir(run_id, Path(tmp))

    def log_dir(self, run_id: str, folder: Path, tables: Sequence[str] = ()) -> None:
        """Log a folder's files as artifacts; ``tables`` (written by :func:`write_table`) are
        registered so the MLflow UI shows them in its evaluation view."""
        with self._calling(f"logging artifacts of run {run_id}"):
            self.client.log_artifacts(run_id, str(folder))
            if tables:
                entries = [{"path": name, "type": "table"} for name in tables]
                self.client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(entries))

    def log_dataset(
        self, run_id: str, *, name: str, digest: str, source: str, profile: Mapping[str, Any], context: str = "eval"
    ) -> None:
        """Record the evaluation set as the run's dataset input (the UI's Datasets column)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(
            name=name[:500],
            digest=digest[:36],  # the store's column holds 36 characters
            source_type="local",
            source=json.dumps({"uri": source}, ensure_ascii=False),
            profile=json.dumps(dict(profile), ensure_ascii=False),
        )
        with self._calling(f"logging the dataset of run {run_id}"):
            self.client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def set_running(self, run_id: str) -> None:
        """Reopen a stopped run (for ``--resume``)."""
        with self._calling(f"reopening run {run_id}"):
            self.client.update_run(run_id, status=RUNNING)

    def state_dir(self) -> Path:
        """Local state (checkpoints, judge cache, adapted prompts): beside a SQLite store, else in
        the user's cache folder."""
        db = _sqlite_path(self.uri)
        if db is not None:
            return db.resolve().parent
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragexp"

    def checkpoint_path(self, run_id: str) -> Path:
        return self.state_dir() / "checkpoints" / f"{run_id}.jsonl"

    def end_run(self, run_id: str, status: str) -> None:
        with self._calling(f"ending run {run_id}"):
            self.client.set_terminated(run_id, status=status)

    # --- reading back -------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            raise TrackingError(f"unknown run '{run_id}' in tracking store {self.uri}") from None
        except OSError as exc:
            raise TrackingError(f"tracking store {self.uri} unreachable ({_one_line(exc)})") from None
        return _record(run)

    def read_artifact(self, run_id: str, path: str) -> bytes:
        from mlflow.artifacts import download_artifacts

        with tempfile.TemporaryDirectory(prefix="ragexp-") as tmp, self._calling(f"run {run_id}: artifact {path}"):
            local = download_artifacts(run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=self.uri)
            return Path(local).read_bytes()

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        with self._calling(f"listing artifacts of run {run_id}"):
            return [item.path for item in self.client.list_artifacts(run_id, path)]

    def newest_finished(self, experiment_id: str, *, exclude: str) -> RunRecord | None:
        """The most recently started finished run of an experiment, other than ``exclude``."""
        with self._calling(f"searching runs of experiment {experiment_id}"):
            runs = self.client.search_runs(
                [experiment_id],
                filter_string="attributes.status = 'FINISHED'",
                max_results=2,
                order_by=["attributes.start_time DESC"],
            )
        return next((_record(run) for run in runs if run.info.run_id != exclude), None)

    def search(
        self, experiment: str, *, limit: int, filter_string: str = "", finished_only: bool = False
    ) -> list[RunRecord]:
        experiment_id = self.experiment_id(experiment, create=False)
        if experiment_id is None:
            return []
        clauses = [filter_string] if filter_string else []
        if finished_only:
            clauses.append("attributes.status = 'FINISHED'")
        with self._calling(f"searching runs of experiment '{experiment}'"):
            runs = self.client.search_runs(
                [experiment_id],
                filter_string=" and ".join(clauses),
                max_results=limit,
                order_by=["attributes.start_time DESC"],
            )
        return [_record(run) for run in runs]


def write_table(path: Path, columns: Mapping[str, Sequence[Any]]) -> None:
    """Write a table in the layout ``MlflowClient.log_table`` uses (pandas "split", no index),
    without building a DataFrame: for 100,000 rows that costs seconds."""
    import orjson

    names = list(columns)
    rows = list(zip(*(columns[name] for name in names), strict=True))
    path.write_bytes(orjson.dumps({"columns": names, "data": rows}))


def _record(run: Any) -> RunRecord:
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name or "",
        experiment_id=str(run.info.experiment_id),
        status=run.info.status,
        start_time=int(run.info.start_time or 0),
        end_time=int(run.info.end_time) if run.info.end_time else None,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        metrics={key: float(value) for key, value in run.data.metrics.items()},
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
