"""A thin, typed layer over ``MlflowClient``; mlflow is imported on first use only.

Two backends, chosen once per store: MLflow's client is the reference (every method's body), and
on a local SQLite store the direct backend (:mod:`ragexp.tracking.mlflow_sql`) overrides the
methods marked :func:`native` with the same rows MLflow's store would read and write, without
importing mlflow. A call the direct backend cannot make as MLflow would is declined (one way:
:class:`~ragexp.tracking.mlflow_sql.schema.Declined`) and made through MLflow; a store or an
MLflow it was not checked against turns it off for good, said once on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

from ragexp import limits
from ragexp.errors import StoreUnreachable, TrackingError, UnknownRunError
from ragexp.secrets import mask_url, scrub, scrub_mapping
from ragexp.tracking.records import CONNECTION_LOST, database_error, one_line, store_os_error
from ragexp.tracking.records import TAG_PREFIX as TAG_PREFIX  # re-exported: where callers have always found them
from ragexp.tracking.records import RunRecord as RunRecord
from ragexp.tracking.records import connection_lost as connection_lost

if TYPE_CHECKING:
    from collections.abc import Callable

    from mlflow.tracking import MlflowClient

    from ragexp.tracking.mlflow_sql.writer import SqliteWriter

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
FINISHED, FAILED, KILLED, RUNNING = "FINISHED", "FAILED", "KILLED", "RUNNING"
DEFAULT_TIMEOUT_S = 60.0
CREATION_TAG = TAG_PREFIX + "creation_id"
"""A nonce set when a run is created on a tracking server, to find the duplicates of a retried
creation."""
SERVER_THREADS = 16
"""Requests in flight to a tracking server (traces): its workers wait on the database between
requests, so more requests than cores keep them busy."""
_USER_SET = frozenset(os.environ) & {
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_HTTP_POOL_MAXSIZE",
}
"""MLflow's HTTP settings the user chose: ragexp does not override them."""
DIRECT_ENV = "RAGEXP_SQLITE_DIRECT"
"""Set to 0 to make every call of a SQLite store go through ``MlflowClient`` (slower by the ~3 s
that importing mlflow costs; the rows written are the same)."""
UPGRADE_ENV = "RAGEXP_ALLOW_STORE_UPGRADE"
"""Set to 1 (``--allow-store-upgrade``) to let the installed MLflow migrate an existing store."""
_DECLINED: set[str] = set()
"""Stores whose direct backend was declined for good: MLflow's client serves them until the process ends."""
P = ParamSpec("P")
R = TypeVar("R")


def native(name: str) -> Callable[[Callable[Concatenate[Store, P], R]], Callable[Concatenate[Store, P], R]]:
    """Mark a ``Store`` method the direct backend overrides with its method ``name`` (same
    arguments, same answer); the decorated body is the MLflow reference, used when there is no
    direct backend or it declines."""

    def decorate(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
        def call(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
            from ragexp.tracking.mlflow_sql.schema import Declined

            direct = self._direct()
            if direct is not None:
                try:
                    result: R = getattr(direct, name)(*args, **kwargs)
                    return result
                except Declined as declined:
                    self.declined(declined)
            return method(self, *args, **kwargs)

        call.__name__, call.__doc__ = method.__name__, method.__doc__
        return call

    return decorate


def resolve_uri(explicit: str | None) -> str:
    """``explicit``, else ``MLFLOW_TRACKING_URI``, else the SQLite store under ``mlruns/``."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    # An existing lock file is opened for reading: flock needs no write access, and a read-only
    # store stays readable.
    with path.open("rb") if path.exists() else path.open("ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _init_lock(db: Path | None) -> Path | None:
    """The lock around opening a SQLite store. A new store runs schema migrations on first open;
    parallel processes (a joblib sweep) must not run them at the same time, and a file that exists
    may still be mid-migration by another process. A folder that cannot be written (a read-only
    copy of a team's store) needs no lock: nothing can migrate it."""
    if db is None or str(db) == ":memory:" or not os.access(db.parent, os.W_OK):
        return None
    return db.parent / ".ragexp-init.lock"


def run_artifact_path(uri: str, run_id: str, name: str) -> Path | None:
    """A run's artifact as a local file, where a SQLite store keeps it (``artifacts/`` beside the
    database, as :meth:`Store.experiment_id` creates experiments); None when it is not there."""
    db = _sqlite_path(uri)
    if db is None or str(db) == ":memory:":
        return None
    path = db.resolve().parent / "artifacts" / run_id / "artifacts" / name
    return path if path.is_file() else None


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :])


class Store:
    """One MLflow tracking store.

    ``must_exist`` opens a store that is already there (``runs``, ``diff``, ``gate``, ``report``,
    ``label``): a SQLite file that does not exist is an error rather than a new empty store, and
    no lock file is written, so a read-only mount of a team's results can be read. Such a store
    is still written to: ``diff`` and ``gate`` record ``ragexp.gate.*`` tags and
    ``comparisons/<baseline>/*.json`` on the candidate (a step of their own in
    :mod:`ragexp.workflows.diff`: a read-only copy that refuses them leaves the result standing,
    unrecorded), and it has no :meth:`sql_writer` for traces. ``timeout_s`` bounds how long a
    tracking server may fail to answer one call (MLflow's own retries would take minutes).
    ``direct=False`` sends every call through ``MlflowClient`` (as does ``RAGEXP_SQLITE_DIRECT=0``).
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        must_exist: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        direct: bool = True,
    ) -> None:
        self.uri = resolve_uri(uri)
        self.must_exist = must_exist
        self.timeout_s = timeout_s
        self._direct_allowed = direct and os.environ.get(DIRECT_ENV, "1") != "0"
        # MLflow draws download progress bars on stderr for every artifact read, and prints the
        # run's URL on stdout when a run on a tracking server ends (stdout is for --json).
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            # Imported first: importing mlflow sets its loggers' levels.
            from mlflow.tracking import MlflowClient

            # ragexp turns every store failure into one line of its own; MLflow's ERROR records
            # (hundreds of lines when a disk fills up) would only bury it.
            for name in ("alembic", "mlflow", "sqlalchemy"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
            self._check_location()
            db = _sqlite_path(self.uri)
            if db is not None and str(db) != ":memory:" and not db.exists():
                db.parent.mkdir(parents=True, exist_ok=True)
            try:
                with _file_lock(_init_lock(db)):
                    self._refuse_migration(db)
                    self._client = MlflowClient(tracking_uri=self.uri)
            except OSError as exc:
                raise store_os_error(exc, self.uri, "opening the tracking store") from None
            except Exception as exc:  # mlflow raises many types for a bad store
                raise TrackingError(f"tracking store {self.uri}: {one_line(exc)}") from None
        return self._client

    def _refuse_migration(self, db: Path | None) -> None:
        """Stop before MLflow opens an existing SQL store it would migrate (or cannot open)."""
        from ragexp.tracking.mlflow_sql.schema import refusal, store_revision

        if db is not None and (str(db) == ":memory:" or not db.exists()):
            return
        revision = store_revision(self.uri)
        reason = refusal(revision, mask_url(self.uri), allow_upgrade=os.environ.get(UPGRADE_ENV, "") == "1")
        if reason is not None:
            raise TrackingError(reason)

    def _check_location(self) -> None:
        """Fail at once, in one line, where MLflow would create, hang or retry for minutes."""
        db = _sqlite_path(self.uri)
        if db is not None and str(db) != ":memory:":
            if self.must_exist and not db.exists():
                raise TrackingError(
                    f"no tracking store at {db} (nothing was run with it yet): "
                    "pass --tracking-uri or set MLFLOW_TRACKING_URI"
                )
            if not self.must_exist:
                target = db if db.exists() else _existing_parent(db.parent)
                if not os.access(target, os.W_OK):
                    raise TrackingError(f"tracking store {db} is read-only: a run cannot be logged to it")
            return
        parts = urlsplit(self.uri)
        if parts.scheme in ("http", "https") and parts.hostname:
            self._bound_http_retries()
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                with socket.create_connection((parts.hostname, port), timeout=min(self.timeout_s, 5.0)):
                    pass
            except OSError as exc:
                raise TrackingError(
                    f"tracking server {mask_url(self.uri)} is not reachable ({exc.strerror or exc})"
                ) from None

    def _bound_http_retries(self) -> None:
        """Fit MLflow's retries of one call within ``timeout_s``: as many of 3 retries as leave each
        attempt an equal share of at least 5 s (a busy server can take seconds), else one attempt."""
        retries, per_attempt = 0, self.timeout_s
        for tries in (3, 2, 1):
            # urllib3 waits 0 s before the first retry, then 2 and 4 s, each plus up to 1 s of jitter.
            share = (self.timeout_s - sum(2 ** (n - 1) + 1 for n in range(2, tries + 1))) / (tries + 1)
            if share >= 5:
                retries, per_attempt = tries, share
                break
        wanted = {
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(per_attempt))),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_POOL_MAXSIZE": str(SERVER_THREADS),  # one kept connection per thread
        }
        for name, value in wanted.items():
            if name not in _USER_SET:
                os.environ[name] = value

    @contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """MLflow and network errors inside become one-line TrackingErrors."""
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            text = one_line(exc)
            refused = database_error(text, self.uri, what)
            if refused is not None:
                raise refused from None
            if "failed with exception" in text and CONNECTION_LOST.search(text):
                raise StoreUnreachable(f"{what}: {mask_url(text)}") from None
            raise TrackingError(f"{what}: {mask_url(text)}") from None
        except OSError as exc:
            raise store_os_error(exc, self.uri, what) from None

    # --- experiments and runs -----------------------------------------------------------------

    @native("experiment_id")
    def experiment_id(self, name: str, *, create: bool) -> str | None:
        with self.calling(f"experiment '{name}'"):
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                return str(experiment.experiment_id)
            if not create:
                return None
            # Keep artifacts beside the database instead of MLflow's cwd-relative ./mlruns.
            folder = self.sqlite_folder()
            location = (folder / "artifacts").as_uri() if folder is not None else None
            from mlflow.exceptions import MlflowException

            try:
                return str(self.client.create_experiment(name, artifact_location=location))
            except MlflowException:
                # Another process created it in the meantime.
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                return str(experiment.experiment_id)

    @native("experiment_name")
    def experiment_name(self, experiment_id: str) -> str:
        with self.calling(f"experiment {experiment_id}"):
            return str(self.client.get_experiment(experiment_id).name)

    def create_run(self, experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]) -> str:
        experiment_id = self.experiment_id(experiment, create=True)
        assert experiment_id is not None  # create=True always returns an id
        # The last door: a registered secret that reached the run's name, a tag or a param is masked.
        params = {key: value[: limits.PARAM_VALUE.chars] for key, value in scrub_mapping(params).items()}
        return self.create_run_in(experiment_id, scrub(run_name), scrub_mapping(tags), params)

    @native("create_run_in")
    def create_run_in(
        self, experiment_id: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]
    ) -> str:
        """``create_run`` in an experiment known by its id, with params MLflow takes as they are."""
        remote = urlsplit(self.uri).scheme in ("http", "https")
        creation = {CREATION_TAG: uuid.uuid4().hex} if remote else {}
        with self.calling(f"creating a run in experiment {experiment_id}"):
            run = self.client.create_run(experiment_id, run_name=run_name, tags={**tags, **creation})
            run_id: str = run.info.run_id
            if remote:
                self._drop_duplicates(experiment_id, run_id, creation[CREATION_TAG])
            self._log_params(run_id, params)
            return run_id

    def _drop_duplicates(self, experiment_id: str, run_id: str, creation: str) -> None:
        """Delete the runs a lost reply to ``runs/create`` made: MLflow's client sends the request
        again when the connection closes before the answer, and the server creates a second run."""
        found = self.client.search_runs([experiment_id], filter_string=tag_filter(CREATION_TAG, creation))
        for run in found:
            if run.info.run_id != run_id:
                self.client.delete_run(run.info.run_id)

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Params known only once the run has worked (a param keeps its first value: MLflow refuses
        another), masked and cut as :meth:`create_run`'s."""
        cut = {key: value[: limits.PARAM_VALUE.chars] for key, value in scrub_mapping(params).items()}
        self.log_params_in(run_id, cut)

    @native("log_params")
    def log_params_in(self, run_id: str, params: Mapping[str, str]) -> None:
        """``log_params`` with params MLflow takes as they are."""
        with self.calling(f"logging params of run {run_id}"):
            self._log_params(run_id, params)

    @native("log_metrics")
    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        with self.calling(f"logging metrics of run {run_id}"):
            for start in range(0, len(items), 1000):
                self.client.log_batch(run_id, metrics=items[start : start + 1000])

    @native("set_tags")
    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        with self.calling(f"tagging run {run_id}"):
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    @native("log_files")
    def log_files(self, run_id: str, files: Mapping[str, bytes]) -> None:
        """Write ``name -> bytes`` as artifacts of the run."""
        with tempfile.TemporaryDirectory(prefix="ragexp-") as tmp:
            for name, data in files.items():
                target = Path(tmp, name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            self.log_dir(run_id, Path(tmp))

    @native("log_dir")
    def log_dir(self, run_id: str, folder: Path, tables: Sequence[str] = ()) -> None:
        """Log a folder's files as artifacts; ``tables`` (written by :func:`ragexp.artifacts.write_table`) are
        registered so the MLflow UI shows them in its evaluation view."""
        entries = json.dumps([{"path": name, "type": "table"} for name in tables])
        with self.calling(f"logging artifacts of run {run_id}"):
            self.client.log_artifacts(run_id, str(folder))
            if tables:
                self.client.set_tag(run_id, "mlflow.loggedArtifacts", entries)

    def log_dataset(
        self, run_id: str, *, name: str, digest: str, source: str, profile: Mapping[str, Any], context: str = "eval"
    ) -> None:
        """Record the evaluation set as the run's dataset input (the UI's Datasets column)."""
        fields = {
            "name": name[: limits.DATASET_NAME.chars],
            "digest": digest[: limits.DATASET_DIGEST.chars],
            "source_type": "local",
            "source": json.dumps({"uri": source}, ensure_ascii=False),
            "profile": json.dumps(dict(profile), ensure_ascii=False),
        }
        self.log_inputs(run_id, fields, {"mlflow.data.context": context})

    @native("log_inputs")
    def log_inputs(self, run_id: str, fields: Mapping[str, str], input_tags: Mapping[str, str]) -> None:
        """``log_inputs`` of one dataset (its fields as MLflow's ``Dataset`` takes them)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.exceptions import MlflowException

        dataset = Dataset(**fields)
        inputs = [DatasetInput(dataset, [InputTag(key, value) for key, value in input_tags.items()])]
        with self.calling(f"logging the dataset of run {run_id}"):
            try:
                self.client.log_inputs(run_id, datasets=inputs)
            except MlflowException as exc:
                # Parallel runs logging one new dataset race in the store's check-then-insert (a
                # unique key fails the second); asked again, it finds the first one's row.
                if not _DUPLICATE_KEY.search(str(exc)):
                    raise
                self.client.log_inputs(run_id, datasets=inputs)

    @native("set_running")
    def set_running(self, run_id: str) -> None:
        """Reopen a stopped run (for ``--resume``)."""
        with self.calling(f"reopening run {run_id}"):
            self.client.update_run(run_id, status=RUNNING)

    def sqlite_folder(self) -> Path | None:
        """The folder of a SQLite store's file (None: any other store)."""
        db = _sqlite_path(self.uri)
        return db.resolve().parent if db is not None and str(db) != ":memory:" else None

    def state_dir(self) -> Path:
        """Local state (checkpoints, judge cache, adapted prompts): beside a SQLite store, else in
        the user's cache folder."""
        return self.sqlite_folder() or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragexp"

    @native("delete_tags")
    def delete_tags(self, run_id: str, names: Sequence[str]) -> None:
        """Delete the run's tags ``names``; one already gone (removed in the meantime, or a
        retried request whose first reply was lost) counts as deleted."""
        from mlflow.exceptions import MlflowException

        record = self.get_run(run_id)
        with self.calling(f"tagging run {run_id}"):
            for name in names:
                if name in record.tags:
                    try:
                        self.client.delete_tag(run_id, name)
                    except MlflowException:
                        if name in self.client.get_run(run_id).data.tags:
                            raise

    @native("end_run")
    def end_run(self, run_id: str, status: str) -> None:
        with self.calling(f"ending run {run_id}"):
            self.client.set_terminated(run_id, status=status)

    # --- reading back -------------------------------------------------------------------------

    _direct_checked = False
    _direct_store: SqliteWriter | None = None

    def _direct(self) -> SqliteWriter | None:
        """The direct backend of an existing SQLite store, chosen once; None: MLflow's client. A
        store that does not exist yet is created by MLflow (its schema migrations), then written
        directly like any other."""
        if not self._direct_checked:
            self._direct_checked = True
            db = _sqlite_path(self.uri)
            if self._direct_allowed and db is not None and str(db) != ":memory:" and self.uri not in _DECLINED:
                self._check_location()
                if not db.exists() and not self.must_exist:
                    self.client  # noqa: B018 - opening MLflow's store creates the database
                if db.exists():
                    from ragexp.tracking.mlflow_sql.schema import Declined
                    from ragexp.tracking.mlflow_sql.writer import SqliteWriter

                    # A store another process is still migrating is opened once it is done.
                    with _file_lock(None if self.must_exist else _init_lock(db)):
                        try:
                            self._direct_store = SqliteWriter.open(db, self.uri)
                        except Declined as declined:
                            self.declined(declined)
        return self._direct_store

    def declined(self, declined: Exception) -> None:
        """A direct call declined: for good (said once on stderr) when the store or the installed
        MLflow is not one the direct backend knows, else for this call only."""
        from ragexp.tracking.mlflow_sql.schema import say_once

        reason = getattr(declined, "reason", None)
        if reason is not None:
            _DECLINED.add(self.uri)
            if self._direct_store is not None:
                self._direct_store.close()
            self._direct_store = None
            # A store MLflow would migrate, or cannot open, is refused in one line of its own.
            self._refuse_migration(_sqlite_path(self.uri))
            say_once(reason)

    @property
    def declined_for_good(self) -> bool:
        """Whether a direct path declined this store for good in this process (no direct path then)."""
        return self.uri in _DECLINED

    def sql_writer(self) -> SqliteWriter | None:
        """The direct writer of this store, for the trace writer (None: write through MLflow)."""
        return None if self.must_exist else self._direct()

    @native("get_run")
    def get_run(self, run_id: str) -> RunRecord:
        from mlflow.exceptions import MlflowException

        with self.calling(f"reading run {run_id}"):
            try:
                run = self.client.get_run(run_id)
            except MlflowException as exc:
                # A store that does not answer is not a run that does not exist.
                if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise UnknownRunError(f"unknown run '{run_id}' in tracking store {self.uri}") from None
                raise
        return _record(run)

    @native("read_artifact")
    def read_artifact(self, run_id: str, path: str) -> bytes:
        from mlflow.artifacts import download_artifacts

        with tempfile.TemporaryDirectory(prefix="ragexp-") as tmp, self.calling(f"run {run_id}: artifact {path}"):
            local = download_artifacts(run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=self.uri)
            return Path(local).read_bytes()

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        with self.calling(f"listing artifacts of run {run_id}"):
            return [item.path for item in self.client.list_artifacts(run_id, path)]

    @native("experiment_ids")
    def experiment_ids(self) -> list[str]:
        """Every active experiment of the store."""
        ids: list[str] = []
        token = None
        with self.calling("listing experiments"):
            while True:
                page = self.client.search_experiments(max_results=1000, page_token=token)
                ids.extend(str(experiment.experiment_id) for experiment in page)
                token = page.token
                if not token:
                    return ids

    @native("iter_runs")
    def iter_runs(
        self, experiment_ids: Sequence[str], filter_string: str = "", page_size: int = 500
    ) -> Iterator[RunRecord]:
        """Runs of the experiments matching an MLflow filter, newest first, fetched page by page."""
        token = None
        while True:
            with self.calling("searching runs"):
                page = self.client.search_runs(
                    list(experiment_ids),
                    filter_string=filter_string,
                    max_results=page_size,
                    order_by=["attributes.start_time DESC"],
                    page_token=token,
                )
            yield from (_record(run) for run in page)
            token = page.token
            if not token:
                return

    # --- registered models as locks ---------------------------------------------------------

    def create_lock(self, name: str, tags: Mapping[str, str], description: str) -> bool:
        """Register a model named ``name``; False when one of that name exists. MLflow refuses to
        create a registered model whose name exists (a unique key in its database, on SQLite and
        on a server alike), so of two processes creating one name, one gets False."""
        from mlflow.exceptions import MlflowException

        with self.calling(f"registered model {name}"):
            try:
                self.client.create_registered_model(name, tags=dict(tags), description=description)
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_ALREADY_EXISTS" or _DUPLICATE_KEY.search(str(exc)):
                    return False
                raise
        return True

    def lock_tags(self, name: str) -> dict[str, str] | None:
        """The tags of the registered model ``name``; None when there is none."""
        from mlflow.exceptions import MlflowException

        with self.calling(f"registered model {name}"):
            try:
                model = self.client.get_registered_model(name)
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return None
                raise
            return dict(model.tags or {})

    def delete_lock(self, name: str) -> None:
        with self.calling(f"deleting registered model {name}"):
            self.client.delete_registered_model(name)

    def search(
        self, experiment: str, *, limit: int, filter_string: str = "", finished_only: bool = False
    ) -> list[RunRecord]:
        """Runs of an experiment matching an MLflow filter, newest first, at most ``limit``."""
        experiment_id = self.experiment_id(experiment, create=False)
        if experiment_id is None:
            return []
        clauses = [filter_string] if filter_string else []
        if finished_only:
            clauses.append("attributes.status = 'FINISHED'")
        runs = self.iter_runs([experiment_id], " and ".join(clauses), page_size=min(limit, 1000))
        return list(islice(runs, limit))


def tag_filter(key: str, value: str) -> str:
    """An MLflow filter for runs with tag ``key`` equal to ``value``."""
    if "`" in key or "'" in value:
        raise TrackingError(f"tag {key}={value}: a tag key cannot contain ` and a value cannot contain '")
    return f"tags.`{key}` = '{value}'"


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


_DUPLICATE_KEY = re.compile(r"UNIQUE constraint failed|duplicate key|IntegrityError", re.IGNORECASE)


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
