"""Reading runs straight from a SQLite MLflow store through :mod:`sqlite3`, without importing
mlflow: the queries MLflow's SQLAlchemy store runs (same tables, same order: start time
descending, then run id), and artifacts from the run's ``file://`` folder.

It declines (:class:`~ragexp.tracking.mlflow_sql.schema.Declined`, and ``Store`` asks
``MlflowClient``) unless the store's revision and the installed MLflow pass the compatibility
check (the revision read again at every call), MLflow's workspaces are off, a filter is one of
the clause forms ragexp writes (:func:`parse_filter`) and an artifact is under a ``file://`` URI.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from ragexp.errors import TrackingError, UnknownRunError
from ragexp.tracking.mlflow_sql.schema import REVISION_SQL, Declined, check_mlflow, check_revision
from ragexp.tracking.records import RunRecord, store_os_error

_WORKSPACE_SETTINGS = ("MLFLOW_ENABLE_WORKSPACES", "MLFLOW_WORKSPACE", "MLFLOW_WORKSPACE_STORE_URI")
_BATCH = 500


@dataclass(frozen=True)
class Clause:
    """One condition of a run filter, as SQL over the ``runs`` table with its arguments."""

    sql: str
    args: tuple[str | int, ...]


# The clause forms ragexp writes (store.tag_filter, compare/select.py, cli `runs`); anything else
# goes to MLflow's own parser.
_QUOTED = r"'([^']*)'"
_CLAUSES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"tags\.`([^`]+)`\s*=\s*" + _QUOTED),
        "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = runs.run_uuid AND t.key = ? AND t.value = ?)",
    ),
    (
        re.compile(r"tags\.`([^`]+)`\s+LIKE\s+" + _QUOTED),
        "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = runs.run_uuid AND t.key = ? AND t.value LIKE ?)",
    ),
    (re.compile(r"attributes\.status\s*=\s*" + _QUOTED), "runs.status = ?"),
    (re.compile(r"attributes\.start_time\s*>\s*(\d+)"), "runs.start_time > ?"),
    (re.compile(r"attributes\.start_time\s*<\s*(\d+)"), "runs.start_time < ?"),
]
_AND = re.compile(r"\s+and\s+", re.IGNORECASE)


def parse_filter(text: str) -> list[Clause] | None:
    """The clauses of a filter ragexp wrote, or None for any other filter."""
    clauses: list[Clause] = []
    rest = text.strip()
    while rest:
        for pattern, sql in _CLAUSES:
            found = pattern.match(rest)
            if found is not None:
                args = tuple(int(g) if g.isdigit() and "start_time" in sql else g for g in found.groups())
                clauses.append(Clause(sql, args))
                rest = rest[found.end() :]
                break
        else:
            return None
        if rest:
            joined = _AND.match(rest)
            if joined is None:
                return None
            rest = rest[joined.end() :]
    return clauses


class SqliteReader:
    """An open SQLite MLflow store that this module can read (see the module docstring)."""

    def __init__(self, connection: sqlite3.Connection, uri: str) -> None:
        self._db = connection
        self.uri = uri

    @classmethod
    def open(cls, db: Path, uri: str) -> Self:
        """The reader of ``db``; :class:`Declined` when MLflow itself must read it."""
        if any(os.environ.get(name) for name in _WORKSPACE_SETTINGS):
            raise Declined()
        check_mlflow()
        try:
            connection = sqlite3.connect(db, timeout=20.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            raise Declined() from None
        try:
            # The settings MLflow's engine applies to every SQLite connection.
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute("PRAGMA case_sensitive_like = true")
            reader = cls(connection, uri)
            reader.check()
        except (sqlite3.Error, Declined):
            connection.close()
            raise
        return reader

    def check(self) -> None:
        """The compatibility check, on this connection (inside the caller's transaction, if any)."""
        try:
            row = self._db.execute(REVISION_SQL).fetchone()
        except sqlite3.Error:
            raise Declined() from None
        check_revision(row[0] if row else None, self.uri)

    def close(self) -> None:
        self._db.close()

    def _rows(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as exc:
            raise TrackingError(f"tracking store {self.uri}: {exc}") from None

    # --- experiments --------------------------------------------------------------------------

    def find_experiment(self, name: str) -> str | None:
        self.check()
        rows = self._rows("SELECT experiment_id FROM experiments WHERE name = ? AND workspace = 'default'", [name])
        return str(rows[0][0]) if rows else None

    def experiment_name(self, experiment_id: str) -> str:
        self.check()
        rows = self._rows("SELECT name FROM experiments WHERE experiment_id = ?", [_int(experiment_id)])
        if not rows:
            raise TrackingError(f"experiment {experiment_id}: no such experiment in tracking store {self.uri}")
        return str(rows[0][0])

    def experiment_ids(self) -> list[str]:
        self.check()
        rows = self._rows(
            "SELECT experiment_id FROM experiments WHERE lifecycle_stage = 'active' AND workspace = 'default' "
            "ORDER BY creation_time DESC, experiment_id"
        )
        return [str(row[0]) for row in rows]

    # --- runs ---------------------------------------------------------------------------------

    _RUN_COLUMNS = "run_uuid, name, experiment_id, status, start_time, end_time"

    def get_run(self, run_id: str) -> RunRecord:
        self.check()
        rows = self._rows(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE run_uuid = ?", [run_id])
        if not rows:
            raise UnknownRunError(f"unknown run '{run_id}' in tracking store {self.uri}")
        return self._complete(rows)[0]

    def read_artifact(self, run_id: str, path: str) -> bytes:
        self.check()
        rows = self._rows("SELECT artifact_uri FROM runs WHERE run_uuid = ?", [run_id])
        if not rows:
            raise UnknownRunError(f"unknown run '{run_id}' in tracking store {self.uri}")
        root = local_folder(str(rows[0][0] or ""))
        if root is None:
            raise Declined()
        try:
            return (root / path).read_bytes()
        except FileNotFoundError:
            raise TrackingError(f"run {run_id}: artifact {path}: not found in {root}") from None
        except OSError as exc:
            raise store_os_error(exc, self.uri, f"run {run_id}: artifact {path}") from None

    def iter_runs(
        self, experiment_ids: Sequence[str], filter_string: str = "", page_size: int = 500
    ) -> Iterator[RunRecord]:
        """``Store.iter_runs``: declined at once for a filter :func:`parse_filter` does not know."""
        clauses = parse_filter(filter_string)
        if clauses is None:
            raise Declined()
        self.check()
        return self.search(experiment_ids, clauses, min(page_size, _BATCH))

    def search(
        self, experiment_ids: Sequence[str], clauses: Sequence[Clause], page: int = _BATCH
    ) -> Iterator[RunRecord]:
        """Active runs of the experiments matching every clause, newest first (then by id, as
        MLflow), read ``page`` at a time."""
        ids = [_int(e) for e in experiment_ids]
        if not ids:
            return
        where = [f"runs.experiment_id IN ({', '.join('?' * len(ids))})", "runs.lifecycle_stage = 'active'"]
        args: list[object] = list(ids)
        for clause in clauses:
            where.append(clause.sql)
            args.extend(clause.args)
        sql = (
            f"SELECT {self._RUN_COLUMNS} FROM runs WHERE {' AND '.join(where)} "
            "ORDER BY runs.start_time DESC, runs.run_uuid LIMIT ? OFFSET ?"
        )
        offset = 0
        while True:
            rows = self._rows(sql, [*args, page, offset])
            yield from self._complete(rows)
            if len(rows) < page:
                return
            offset += len(rows)

    def _complete(self, rows: list[tuple[Any, ...]]) -> list[RunRecord]:
        """Runs from their ``runs`` rows, with their tags, params and latest metrics."""
        runs = {
            str(r[0]): RunRecord(
                run_id=str(r[0]),
                name=str(r[1] or ""),
                experiment_id=str(r[2]),
                status=str(r[3]),
                start_time=int(r[4] or 0),
                end_time=int(r[5]) if r[5] else None,
            )
            for r in rows
        }
        if not runs:
            return []
        marks = ", ".join("?" * len(runs))
        ids = list(runs)
        for key, value, run_id in self._rows(f"SELECT key, value, run_uuid FROM tags WHERE run_uuid IN ({marks})", ids):
            runs[str(run_id)].tags[str(key)] = str(value) if value is not None else ""
        for key, value, run_id in self._rows(
            f"SELECT key, value, run_uuid FROM params WHERE run_uuid IN ({marks})", ids
        ):
            runs[str(run_id)].params[str(key)] = str(value)
        for key, value, is_nan, run_id in self._rows(
            f"SELECT key, value, is_nan, run_uuid FROM latest_metrics WHERE run_uuid IN ({marks})", ids
        ):
            runs[str(run_id)].metrics[str(key)] = math.nan if is_nan else float(value)
        return [runs[str(r[0])] for r in rows]


def local_folder(uri: str) -> Path | None:
    """The folder of a ``file://`` artifact URI, when it is local and absolute."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    root = Path(unquote(parts.path))
    return root if root.is_absolute() else None


def _int(value: str) -> int | str:
    return int(value) if value.isdigit() else value
