"""A thin, typed layer over ``MlflowClient``; mlflow is imported on first use only.

Two backends, chosen once per store: MLflow's client is the reference (every method's body), and
on a local SQLite store the direct backend (:mod:`ragexp.tracking.mlflow_sql`) overrides the
methods marked :func:`native` with the same rows MLflow's store would read and write, without
importing mlflow. A call the direct backend cannot make as MLflow would is declined (one way:
:class:`~ragexp.tracking.mlflow_sql.schema.Declined`) and made through MLflow; a store or an
MLflow it was not checked against turns it off for good, said once on stderr.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

from ragexp.errors import PromotionConflict, StorageError, StoreUnreachable, TrackingError
from ragexp.secrets import mask_url
from ragexp.tracking import limits
from ragexp.tracking.records import CONNECTION_LOST, one_line, store_os_error
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
_HTTP_SETTINGS = (
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)
_USER_SET = frozenset(name for name in _HTTP_SETTINGS if name in os.environ)
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


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :])


class Store:
    """One MLflow tracking store.

    ``read_only`` stores are only read (``runs``, ``diff``, ``gate``, ``report``): a SQLite file
    that does not exist is an error rather than a new empty store, and no lock file is written,
    so a read-only mount of a team's results can be read. ``timeout_s`` bounds how long a
    tracking server may fail to answer one call (MLflow's own retries would take minutes).
    ``direct=False`` sends every call through ``MlflowClient`` (as does ``RAGEXP_SQLITE_DIRECT=0``).
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        read_only: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        direct: bool = True,
    ) -> None:
        self.uri = resolve_uri(uri)
        self.read_only = read_only
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
            lock = None
            if db is not None and str(db) != ":memory:":
                if not db.exists():
                    db.parent.mkdir(parents=True, exist_ok=True)
                # A new SQLite store runs schema migrations on first open; parallel processes
                # (a joblib sweep) must not run them at the same time, and a file that exists may
                # still be mid-migration by another process. A folder that cannot be written (a
                # read-only copy of a team's store) needs no lock: nothing can migrate it.
                if os.access(db.parent, os.W_OK):
                    lock = db.parent / ".ragexp-init.lock"
            try:
                with _file_lock(lock):
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
            if self.read_only and not db.exists():
                raise TrackingError(
                    f"no tracking store at {db} (nothing was run with it yet): "
                    "pass --tracking-uri or set MLFLOW_TRACKING_URI"
                )
            if not self.read_only:
                folder = db.parent if db.parent.exists() else _existing_parent(db.parent)
                target = db if db.exists() else folder
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
        """Fit MLflow's retries of one call within ``timeout_s``: 3 retries waiting about 0, 2
        and 4 s (plus jitter), each attempt bounded by a quarter of what is left (at least 5 s: a
        busy server answering a large batch takes seconds)."""
        per_attempt = max(5, int((self.timeout_s - 10) / 4))
        wanted = {
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(per_attempt),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
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
            if "database or disk is full" in text:
                raise StorageError(f"disk full: {what}: the tracking store {self.uri} cannot grow") from None
            if "readonly database" in text or "read-only" in text:
                raise TrackingError(f"{what}: tracking store {self.uri} is read-only") from None
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

    @native("experiment_name")
    def experiment_name(self, experiment_id: str) -> str:
        with self.calling(f"experiment {experiment_id}"):
            return str(self.client.get_experiment(experiment_id).name)

    def create_run(self, experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]) -> str:
        experiment_id = self.experiment_id(experiment, create=True)
        assert experiment_id is not None  # create=True always returns an id
        params = {key: value[: limits.PARAM_VALUE.chars] for key, value in params.items()}
        return self.create_run_in(experiment_id, run_name, tags, params)

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
        from mlflow.exceptions import MlflowException

        record = self.get_run(run_id)
        with self.calling(f"tagging run {run_id}"):
            for name in names:
                if name in record.tags:
                    with suppress(MlflowException):  # removed in the meantime
                        self.client.delete_tag(run_id, name)

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
                if not db.exists() and not self.read_only:
                    self.client  # noqa: B018 - opening MLflow's store creates the database
                if db.exists():
                    from ragexp.tracking.mlflow_sql.schema import Declined
                    from ragexp.tracking.mlflow_sql.writer import SqliteWriter

                    # A store another process is still migrating is opened once it is done.
                    lock = None
                    if not self.read_only and os.access(db.parent, os.W_OK):
                        lock = db.parent / ".ragexp-init.lock"
                    with _file_lock(lock):
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
        return None if self.read_only else self._direct()

    @native("get_run")
    def get_run(self, run_id: str) -> RunRecord:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            raise TrackingError(f"unknown run '{run_id}' in tracking store {self.uri}") from None
        except OSError as exc:
            raise TrackingError(f"tracking store {self.uri} unreachable ({one_line(exc)})") from None
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
        return self._mlflow_runs(experiment_ids, filter_string, page_size)

    def _mlflow_runs(self, experiment_ids: Sequence[str], filter_string: str, page_size: int) -> Iterator[RunRecord]:
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

    def swap_tag(
        self, key: str, value: str, run_id: str, experiment_id: str, *, expected: Iterable[str], wait_s: float = 60.0
    ) -> Swap:
        """Put tag ``key=value`` on ``run_id`` and take it off every other run of the experiment, as
        one step: under a lock kept in the store itself, and only if the runs holding the tag are
        still exactly ``expected`` (compare-and-swap). Returns the runs it was taken from (and a
        warning if the lock could not be removed).

        MLflow has no transactions over tags; the one write it refuses to repeat is creating a
        registered model whose name exists (a unique key in the database, on SQLite and on a
        server alike). The lock is such a model, deleted when the swap ends, so two processes
        cannot both be inside, and the second one in finds the tag moved and loses.

        Every call here survives a lost reply (MLflow's client sends a request again when the
        connection closes before the answer): the lock carries a nonce of this process, so a
        creation answered "exists" is recognised as its own; a tag or lock already gone counts as
        removed. An unlock that fails is a warning on the result, never an error over its outcome.
        """
        scope = hashlib.sha256(f"{experiment_id}\0{key}\0{value}".encode()).hexdigest()[:24]
        lock = _RegistryLock(self, f"{LOCK_PREFIX}{scope}", run_id, f"{key}={value}")
        lock.acquire(wait_s)
        try:
            holders = [r.run_id for r in self.iter_runs([experiment_id], tag_filter(key, value))]
            if set(holders) != set(expected):
                raise PromotionConflict(
                    f"tag {key}={value} is now on {_runs(holders)}, not on {_runs(expected)}", holders
                )
            with self.calling(f"tagging run {run_id}"):
                # The new holder first: a reader in between sees two holders, never none.
                self.client.set_tag(run_id, key, value)
                for other in holders:
                    if other != run_id:
                        self._delete_tag(other, key)
        except PromotionConflict as exc:
            exc.warning = lock.release()
            raise
        except BaseException:
            lock.release()
            raise
        return Swap([other for other in holders if other != run_id], lock.release())

    def _delete_tag(self, run_id: str, key: str) -> None:
        """Delete a tag; one already gone (a retried request whose first reply was lost) is deleted."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.delete_tag(run_id, key)
        except MlflowException:
            if key in self.client.get_run(run_id).data.tags:
                raise

    def search(
        self, experiment: str, *, limit: int, filter_string: str = "", finished_only: bool = False
    ) -> list[RunRecord]:
        experiment_id = self.experiment_id(experiment, create=False)
        if experiment_id is None:
            return []
        clauses = [filter_string] if filter_string else []
        if finished_only:
            clauses.append("attributes.status = 'FINISHED'")
        return self.search_in(experiment_id, " and ".join(clauses), limit)

    def search_in(self, experiment_id: str, filter_string: str, limit: int) -> list[RunRecord]:
        """Runs of one experiment matching an MLflow filter, newest first, at most ``limit``."""
        return list(islice(self.iter_runs([experiment_id], filter_string, page_size=min(limit, 1000)), limit))


LOCK_PREFIX = "ragexp.promotion-lock."
"""Registered models named so are promotion locks (:meth:`Store.swap_tag`)."""
LOCK_NONCE = "ragexp.lock.nonce"


@dataclass(frozen=True)
class Swap:
    """What :meth:`Store.swap_tag` did."""

    taken_from: list[str]
    """Runs the tag was taken from."""
    warning: str | None = None
    """Why the lock is left behind (None: removed)."""


class _RegistryLock:
    """A registered model as a lock, tagged with a nonce of the process that holds it."""

    def __init__(self, store: Store, name: str, holder: str, what: str) -> None:
        self.store, self.name, self.holder, self.what = store, name, holder, what
        self.nonce = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"

    def acquire(self, wait_s: float) -> None:
        import time

        from mlflow.exceptions import MlflowException

        from ragexp.transport import backoff

        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.store.client.create_registered_model(
                    self.name,
                    tags={
                        "ragexp.lock.holder": self.holder,
                        LOCK_NONCE: self.nonce,
                        "ragexp.lock.since": str(int(time.time())),
                    },
                    description=f"ragexp: promotion of {self.what} in progress (deleted when it ends)",
                )
                return
            except (MlflowException, OSError) as exc:
                failure: Exception = exc
            owner = self._owner()
            if owner is not None and owner[0] == self.nonce:
                return  # this process created it: the reply was lost and MLflow's retry found it
            if owner is None and not _lost_race(failure):
                if isinstance(failure, OSError) or CONNECTION_LOST.search(str(failure)):
                    raise StoreUnreachable(f"locking {self.what}: {mask_url(one_line(failure))}")
                raise TrackingError(f"locking {self.what}: {mask_url(one_line(failure))}")
            if time.monotonic() > deadline:
                by = f" by run {owner[1]}" if owner is not None and owner[1] else ""
                raise TrackingError(
                    f"another promotion of {self.what} has held its lock{by} for over {wait_s:g} s (registered "
                    f"model '{self.name}'); if that pipeline is gone, delete the registered model and promote again"
                )
            time.sleep(backoff(0.2, 0))

    def release(self) -> str | None:
        """Delete the lock, retried within ``tracking.timeout_s``; a lock that is gone (a retried
        delete whose first reply was lost) or that is not this process's counts as deleted.
        Returns None, or a warning naming what is left."""
        import time

        from mlflow.exceptions import MlflowException

        from ragexp.transport import backoff

        deadline = time.monotonic() + self.store.timeout_s
        last = ""
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                self.store.client.delete_registered_model(self.name)
                return None
            except (MlflowException, OSError) as exc:
                last = mask_url(one_line(exc))
            try:
                owner = self._owner()
            except TrackingError as exc:
                last = str(exc)
            else:
                if owner is None or owner[0] != self.nonce:
                    return None
            pause = backoff(0.5, attempt)
            if time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
        return (
            f"the promotion lock (registered model '{self.name}') could not be removed ({last}); delete it "
            f"if no promotion of {self.what} is running, or the next one waits for it"
        )

    def _owner(self) -> tuple[str, str] | None:
        """(nonce, run) of the lock that exists now; None when there is none."""
        from mlflow.exceptions import MlflowException

        try:
            model = self.store.client.get_registered_model(self.name)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            text = mask_url(one_line(exc))
            error = StoreUnreachable if CONNECTION_LOST.search(text) else TrackingError
            raise error(f"reading the promotion lock of {self.what}: {text}") from None
        except OSError as exc:
            raise store_os_error(exc, self.store.uri, f"reading the promotion lock of {self.what}") from None
        tags = dict(model.tags or {})
        return tags.get(LOCK_NONCE, ""), tags.get("ragexp.lock.holder", "")


RELEASE_ATTEMPTS = 5


def _lost_race(exc: Exception) -> bool:
    """A creation refused because another process's lock existed at that moment."""
    return getattr(exc, "error_code", None) == "RESOURCE_ALREADY_EXISTS" or bool(_DUPLICATE_KEY.search(str(exc)))


def tag_filter(key: str, value: str) -> str:
    """An MLflow filter for runs with tag ``key`` equal to ``value``."""
    if "`" in key or "'" in value:
        raise TrackingError(f"tag {key}={value}: a tag key cannot contain ` and a value cannot contain '")
    return f"tags.`{key}` = '{value}'"


def _runs(ids: Iterable[str]) -> str:
    listed = sorted(ids)
    return ", ".join(listed) if listed else "no run"


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
