"""Drafting replies kept on disk (SQLite), so an interrupted or repeated draft pays no call twice.

Keyed like the judge's score cache (:func:`ragexp.metrics.judge.cache.cache_key`): the kind of
case, the model and prompt identity, and the whole prompt sent. Only replies that parsed are kept.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson


class DraftCache:
    def __init__(self, path: Path | None) -> None:
        self.hits = 0
        self._db: sqlite3.Connection | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30)
            self._db.execute("pragma journal_mode=wal")
            # Every reply is committed as it comes (see put); with WAL, "normal" keeps each commit
            # through a killed process without waiting for the disk on each one.
            self._db.execute("pragma synchronous=normal")
            self._db.execute("create table if not exists replies (key text primary key, value text, at real)")

    def get(self, key: str) -> dict[str, Any] | None:
        if self._db is None:
            return None
        row = self._db.execute("select value from replies where key = ?", (key,)).fetchone()
        if row is None:
            return None
        self.hits += 1
        value: dict[str, Any] = orjson.loads(row[0])
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self._db is None:
            return
        # Committed at once: a draft killed midway keeps every reply it paid for.
        self._db.execute("insert or replace into replies values (?, ?, ?)", (key, orjson.dumps(value), time.time()))
        self._db.commit()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
