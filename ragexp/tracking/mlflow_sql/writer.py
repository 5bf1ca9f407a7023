"""Writing a run straight into a SQLite MLflow store through :mod:`sqlite3`, without importing
mlflow (its tracking client and SQLAlchemy store cost more CPU to import than a 35-case run needs
for everything else): the rows MLflow's ``SqlAlchemyStore`` writes for the same calls.

Each method does what the :class:`ragexp.tracking.store.Store` method of the same name does
through MLflow, or raises :class:`~ragexp.tracking.mlflow_sql.schema.Declined` wherever MLflow
would refuse or change the input (a key it rejects, a value it truncates, a run or experiment
that is not active, a non-local artifact location, creating an experiment), so that the error,
or the outcome, is MLflow's own. Every write is one ``BEGIN IMMEDIATE`` transaction that first
reads the store's schema revision again (the compatibility check).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ragexp import limits
from ragexp.errors import TrackingError, UnknownRunError
from ragexp.tracking.mlflow_sql.reader import SqliteReader, local_folder
from ragexp.tracking.mlflow_sql.schema import Declined
from ragexp.tracking.records import database_error, store_os_error

ACTIVE = "active"
RUN_NAME = "mlflow.runName"
USER = "mlflow.user"

MAX_TAGS_PER_BATCH = 100
MAX_DATASET = {
    "name": limits.DATASET_NAME.chars,
    "digest": limits.DATASET_DIGEST.chars,
    "source": 65535,
    "profile": 16777215,
}
MAX_INPUT_TAG_KEY, MAX_INPUT_TAG_VALUE = 255, 500
"""Beyond MLflow's limits (:mod:`ragexp.tracking.limits` and these) MLflow refuses or truncates, so
the call is left to it."""
_FLOAT_MAX = 1.7976931348623157e308

TABLES = ("trace_info", "trace_tags", "trace_request_metadata", "assessments", "spans")
"""The tables a trace's rows go into, in the order they are written (foreign keys first)."""


def valid_key(key: str) -> bool:
    """A metric, param or tag key MLflow accepts as it is (its name and path checks)."""
    return limits.problem(limits.METRIC_KEY, key) is None


def append_path(location: str, *parts: str) -> str | None:
    """MLflow's ``append_to_uri_path`` for a local ``file://`` location; None for any other."""
    split = urlsplit(location)
    if split.scheme != "file" or split.netloc not in ("", "localhost") or split.query or split.fragment:
        return None
    if not split.path.startswith("/") or split.path == "/":
        return None
    return location.rstrip("/") + "".join("/" + part for part in parts)


def logged_tables(tables: Sequence[str]) -> str:
    """The ``mlflow.loggedArtifacts`` tag that makes the UI show ``tables`` in its evaluation view."""
    return json.dumps([{"path": name, "type": "table"} for name in tables])


def now_ms() -> int:
    return int(time.time() * 1000)


class SqliteWriter(SqliteReader):
    """An open SQLite MLflow store this module can read and write (see the module docstring)."""

    # --- transactions -------------------------------------------------------------------------

    @contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        """One transaction; a SQLite error becomes ragexp's one-line error for ``what``."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self.check()
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite rolls a transaction back itself on some errors (a full disk among them):
                # a ROLLBACK then fails, and its error would hide the one that matters.
                if self._db.in_transaction:
                    with suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise database_error(str(exc), self.uri, what) or TrackingError(
                f"{what}: tracking store {self.uri}: {exc}"
            ) from None

    @staticmethod
    def _active_run(db: sqlite3.Connection, run_id: str) -> tuple[int, str] | None:
        """(experiment id, artifact URI) of an active run; None when it is missing or deleted."""
        row = db.execute(
            "SELECT experiment_id, artifact_uri, lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)
        ).fetchone()
        if row is None or row[2] != ACTIVE:
            return None
        return int(row[0]), str(row[1] or "")

    # --- experiments and runs -----------------------------------------------------------------

    def experiment_id(self, name: str, *, create: bool) -> str | None:
        """``Store.experiment_id``; creating an experiment is left to MLflow (once per experiment)."""
        found = self.find_experiment(name)
        if found is None and create:
            raise Declined()
        return found

    def experiment_location(self, experiment_id: str) -> str | None:
        """The artifact location of an active experiment; None when it is not active."""
        rows = self._rows(
            "SELECT artifact_location, lifecycle_stage FROM experiments WHERE experiment_id = ?",
            [int(experiment_id)] if experiment_id.isdigit() else [experiment_id],
        )
        if not rows or rows[0][1] != ACTIVE:
            return None
        return str(rows[0][0] or "")

    def create_run_in(
        self, experiment_id: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]
    ) -> str:
        """``MlflowClient.create_run`` then ``log_batch(params=...)``, as one transaction.

        Declines where MLflow would refuse (an experiment that is not active, a run name and an
        ``mlflow.runName`` tag that differ, a param it rejects) or invent (no run name at all)."""
        named = tags.get(RUN_NAME)
        if (not run_name and not named) or (run_name and named and run_name != named):
            raise Declined()
        if not all(valid_key(key) and len(value) <= limits.PARAM_VALUE.chars for key, value in params.items()):
            raise Declined()
        location = self.experiment_location(experiment_id)
        run_id = uuid.uuid4().hex
        artifact_uri = append_path(location, run_id, "artifacts") if location else None
        if artifact_uri is None:
            raise Declined()
        name = run_name or str(named)
        all_tags = dict(tags)
        all_tags.setdefault(RUN_NAME, name)
        with self._writing(f"creating a run in experiment {experiment_id}") as db:
            db.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, "
                "start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id, deleted_time) "
                "VALUES (?, ?, 'UNKNOWN', '', '', ?, 'RUNNING', ?, NULL, '', 'active', ?, ?, NULL)",
                (run_id, name, tags.get(USER, "unknown"), now_ms(), artifact_uri, int(experiment_id)),
            )
            db.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in all_tags.items()],
            )
            db.executemany(
                "INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in params.items()],
            )
        return run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """``log_batch(params=...)``: a param the run has already is kept when the value is the
        same and refused when it differs, as in MLflow."""
        if not all(valid_key(key) and len(value) <= limits.PARAM_VALUE.chars for key, value in params.items()):
            raise Declined()
        with self._writing(f"logging params of run {run_id}") as db:
            if self._active_run(db, run_id) is None:
                raise Declined()
            for key, value in params.items():
                kept = db.execute("SELECT value FROM params WHERE run_uuid = ? AND key = ?", (run_id, key)).fetchone()
                if kept is not None and kept[0] != value:
                    raise TrackingError(
                        f"logging params of run {run_id}: param {key!r} is {kept[0]!r} already; "
                        "a param's value cannot be changed"
                    )
            db.executemany(
                "INSERT OR IGNORE INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in params.items()],
            )

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """``log_batch(metrics=...)``: each metric's row, and ``latest_metrics`` moved forward
        where the new (step, timestamp, value) is greater, as MLflow compares them."""
        if not all(valid_key(key) for key in metrics):
            raise Declined()
        stamp = now_ms()
        rows = []
        for key, number in metrics.items():
            value = float(number)
            nan = math.isnan(value)
            if nan:
                value = 0.0
            elif math.isinf(value):
                value = _FLOAT_MAX if value > 0 else -_FLOAT_MAX
            rows.append((key, value, stamp, run_id, step, nan))
        with self._writing(f"logging metrics of run {run_id}") as db:
            if self._active_run(db, run_id) is None:
                raise Declined()
            # The same (key, timestamp, step, value) again is one row, as in MLflow's store.
            db.executemany(
                "INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.executemany(
                "INSERT INTO latest_metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value, timestamp = excluded.timestamp, "
                "step = excluded.step, is_nan = excluded.is_nan WHERE (excluded.step, excluded.timestamp, "
                "excluded.value) > (latest_metrics.step, latest_metrics.timestamp, latest_metrics.value)",
                rows,
            )

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """``log_batch(tags=...)``: an upsert on an active run; an ``mlflow.runName`` tag renames
        the run too, as in MLflow."""
        if len(tags) > MAX_TAGS_PER_BATCH or not all(
            valid_key(key) and len(value) <= limits.TAG_VALUE.chars for key, value in tags.items()
        ):
            raise Declined()
        with self._writing(f"tagging run {run_id}") as db:
            stage = db.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
            if stage is None:
                raise UnknownRunError(f"unknown run '{run_id}' in tracking store {self.uri}")
            if stage[0] != ACTIVE:
                raise Declined()
            db.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
                "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value",
                [(key, value, run_id) for key, value in tags.items()],
            )
            if RUN_NAME in tags:
                db.execute("UPDATE runs SET name = ? WHERE run_uuid = ?", (tags[RUN_NAME], run_id))

    def delete_tags(self, run_id: str, names: Sequence[str]) -> None:
        """``delete_tag`` for each name the run has (names it lacks are skipped, as ragexp does)."""
        with self._writing(f"tagging run {run_id}") as db:
            if self._active_run(db, run_id) is None:
                raise Declined()
            db.executemany("DELETE FROM tags WHERE run_uuid = ? AND key = ?", [(run_id, name) for name in names])

    def set_running(self, run_id: str) -> None:
        self.set_status(run_id, "RUNNING")

    def end_run(self, run_id: str, status: str) -> None:
        self.set_status(run_id, status, end_time=now_ms())

    def set_status(self, run_id: str, status: str, *, end_time: int | None = None) -> None:
        """``update_run_info``: the status, and the end time when given (``set_terminated``)."""
        with self._writing(f"ending run {run_id}" if end_time is not None else f"reopening run {run_id}") as db:
            if self._active_run(db, run_id) is None:
                raise Declined()
            if end_time is None:
                db.execute("UPDATE runs SET status = ? WHERE run_uuid = ?", (status, run_id))
            else:
                db.execute("UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?", (status, end_time, run_id))

    def log_inputs(self, run_id: str, dataset: Mapping[str, str], input_tags: Mapping[str, str]) -> None:
        """``log_inputs`` of one dataset: the experiment's dataset row (reused when its name and
        digest are already there), the run's input edge (once) and the edge's tags."""
        if any(len(dataset[field]) > limit for field, limit in MAX_DATASET.items()):
            raise Declined()
        if not all(
            len(key) <= MAX_INPUT_TAG_KEY and len(value) <= MAX_INPUT_TAG_VALUE for key, value in input_tags.items()
        ):
            raise Declined()
        with self._writing(f"logging the dataset of run {run_id}") as db:
            run = self._active_run(db, run_id)
            if run is None:
                raise Declined()
            experiment_id = run[0]
            found = db.execute(
                "SELECT dataset_uuid FROM datasets WHERE experiment_id = ? AND name = ? AND digest = ?",
                (experiment_id, dataset["name"], dataset["digest"]),
            ).fetchone()
            if found is not None:
                dataset_uuid = str(found[0])
            else:
                dataset_uuid = uuid.uuid4().hex
                db.execute(
                    "INSERT INTO datasets (dataset_uuid, experiment_id, name, digest, dataset_source_type, "
                    "dataset_source, dataset_schema, dataset_profile) VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
                    (
                        dataset_uuid,
                        experiment_id,
                        dataset["name"],
                        dataset["digest"],
                        dataset["source_type"],
                        dataset["source"],
                        dataset["profile"],
                    ),
                )
            edge = db.execute(
                "SELECT 1 FROM inputs WHERE source_type = 'DATASET' AND source_id = ? "
                "AND destination_type = 'RUN' AND destination_id = ?",
                (dataset_uuid, run_id),
            ).fetchone()
            if edge is None:
                input_uuid = uuid.uuid4().hex
                db.execute(
                    "INSERT INTO inputs (input_uuid, source_type, source_id, destination_type, destination_id, step) "
                    "VALUES (?, 'DATASET', ?, 'RUN', ?, 0)",
                    (input_uuid, dataset_uuid, run_id),
                )
                db.executemany(
                    "INSERT INTO input_tags (input_uuid, name, value) VALUES (?, ?, ?)",
                    [(input_uuid, key, value) for key, value in input_tags.items()],
                )

    # --- artifacts ----------------------------------------------------------------------------

    def artifact_folder(self, run_id: str) -> Path:
        """The active run's local artifact folder; declined when MLflow must write there."""
        self.check()
        rows = self._rows("SELECT artifact_uri, lifecycle_stage FROM runs WHERE run_uuid = ?", [run_id])
        folder = local_folder(str(rows[0][0] or "")) if rows and rows[0][1] == ACTIVE else None
        if folder is None:
            raise Declined()
        return folder

    def log_files(self, run_id: str, files: Mapping[str, bytes]) -> None:
        """Files into the run's local artifact folder, each complete or absent (temp file, then rename)."""
        root = self.artifact_folder(run_id)
        try:
            for name, data in files.items():
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(f".{target.name}.ragexp-partial")
                try:
                    partial.write_bytes(data)
                    os.replace(partial, target)
                finally:
                    partial.unlink(missing_ok=True)
        except OSError as exc:
            raise store_os_error(exc, self.uri, f"logging artifacts of run {run_id}") from None

    def log_dir(self, run_id: str, folder: Path, tables: Sequence[str] = ()) -> None:
        """MLflow's local artifact repository: the folder's files copied in, permissions not; then
        the ``mlflow.loggedArtifacts`` tag of the tables."""
        root = self.artifact_folder(run_id)
        try:
            for source in sorted(folder.rglob("*")):
                if source.is_file():
                    destination = root / source.relative_to(folder)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, destination)
        except OSError as exc:
            raise store_os_error(exc, self.uri, f"logging artifacts of run {run_id}") from None
        if tables:
            self.set_tags(run_id, {"mlflow.loggedArtifacts": logged_tables(tables)})

    # --- traces -------------------------------------------------------------------------------

    def insert_traces(self, rows: Mapping[str, Sequence[Mapping[str, Any]]], what: str) -> None:
        """The rows of a batch of traces (table -> rows, as ``TraceWriter`` plans them), in one
        transaction: what MLflow's ``start_trace`` and ``log_spans`` write, without their
        per-trace statements."""
        with self._writing(what) as db:
            for table in TABLES:
                table_rows = rows.get(table) or []
                if not table_rows:
                    continue
                columns = list(table_rows[0])
                db.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                    [tuple(row[column] for column in columns) for row in table_rows],
                )
