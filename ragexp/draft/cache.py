"""Drafting replies kept on disk (SQLite), so an interrupted or repeated draft pays no call twice.

Keyed like the judge's score cache (:func:`ragexp.metrics.judge.cache.cache_key`): the kind of
case, the model and prompt identity, and the whole prompt sent. Only replies that parsed are kept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from ragexp.sqlite_cache import SqliteCache


class DraftCache(SqliteCache):
    def __init__(self, path: Path | None) -> None:
        super().__init__(
            path, ["create table if not exists replies (key text primary key, value text, at real)"], commit_every=0
        )

    def get(self, key: str) -> dict[str, Any] | None:
        row = self.row("select value from replies where key = ?", (key,))
        if row is None:
            return None
        self.hits += 1
        value: dict[str, Any] = orjson.loads(row[0])
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        # Committed at once (commit_every=0): a draft killed midway keeps every reply it paid for.
        self.write("insert or replace into replies values (?, ?, ?)", (key, orjson.dumps(value), time.time()))
