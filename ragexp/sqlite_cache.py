"""One SQLite file of cached replies, shared by the judge's score cache and the drafting cache.

Both keep paid-for answers across processes: WAL so a reader never waits on the writer, and
``synchronous=normal``, which keeps every commit through a killed process without waiting for the
disk on each one. ``commit_every`` is how many seconds of writes may wait for a commit (0: each
write is committed as it comes, so a process killed midway keeps every reply it paid for).
Without a path the cache keeps nothing and finds nothing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class SqliteCache:
    def __init__(self, path: Path | None, tables: Sequence[str], *, commit_every: float) -> None:
        """``tables``: the ``create table if not exists`` statements of the file's schema."""
        self.hits = 0
        self.commit_every = commit_every
        self._db: sqlite3.Connection | None = None
        self._committed = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30, isolation_level="DEFERRED")
            self._db.execute("pragma journal_mode=wal")
            self._db.execute("pragma synchronous=normal")
            for table in tables:
                self._db.execute(table)

    @property
    def enabled(self) -> bool:
        return self._db is not None

    def row(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """The first row ``sql`` selects (None: none, or no file)."""
        if self._db is None:
            return None
        found: tuple[Any, ...] | None = self._db.execute(sql, params).fetchone()
        return found

    def rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self._db is None:
            return []
        return list(self._db.execute(sql, params).fetchall())

    def write(self, sql: str, params: Sequence[Any]) -> None:
        """Run one write, committed once ``commit_every`` seconds have passed since the last commit."""
        if self._db is None:
            return
        self._db.execute(sql, params)
        if time.monotonic() - self._committed >= self.commit_every:
            self.commit()

    def commit(self) -> None:
        if self._db is not None:
            self._db.commit()
            self._committed = time.monotonic()

    def close(self) -> None:
        if self._db is not None:
            self._db.commit()
            self._db.close()
            self._db = None
