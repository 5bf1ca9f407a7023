"""A persistent cache of judge scores (SQLite), so an unchanged case costs no call on a rerun.

Keys cover the metric, the judge identity (model, embeddings, language, prompts in use, ragas
version; a rubric of the user's adds its own), the fields the metric reads and the repeat index.
Failures are never cached. A judge's rationale is kept beside its score where the metric gives
one worth keeping (a rubric's).

The judge metrics' grades are kept under their key and the served identity that made them
(:mod:`ragexp.metrics.judge.identity`): what served a call is known only from its reply, so a
grade is looked up by key, and the scorer uses one made under a served identity its run has seen.
A judge swapped behind the same config never gets another model's grades, and a swap back finds
the first model's grades still there.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

COMMIT_EVERY = 1.0


def cache_key(metric: str, judge: str, inputs: dict[str, Any], repeat: int) -> str:
    payload = {"metric": metric, "judge": judge, "inputs": inputs, "repeat": repeat}
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class Graded:
    """A cached grade and the served identity that made it."""

    served: str
    value: float
    rationale: str | None


class JudgeCache:
    def __init__(self, path: Path | None) -> None:
        self.hits = 0
        self._db: sqlite3.Connection | None = None
        self._committed = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30, isolation_level="DEFERRED")
            self._db.execute("pragma journal_mode=wal")
            self._db.execute("create table if not exists scores (key text primary key, value real, at real)")
            self._db.execute("create table if not exists rationales (key text primary key, rationale text)")
            self._db.execute(
                "create table if not exists graded (key text, served text, value real, rationale text, at real, "
                "primary key (key, served))"
            )

    def get(self, key: str) -> float | None:
        if self._db is None:
            return None
        row = self._db.execute("select value from scores where key = ?", (key,)).fetchone()
        if row is None:
            return None
        self.hits += 1
        return float(row[0])

    def rationale(self, key: str) -> str | None:
        """The rationale kept with the score of ``key`` (None: none was)."""
        if self._db is None:
            return None
        row = self._db.execute("select rationale from rationales where key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, value: float, rationale: str | None = None) -> None:
        if self._db is None:
            return
        self._db.execute("insert or replace into scores values (?, ?, ?)", (key, value, time.time()))
        if rationale:
            self._db.execute("insert or replace into rationales values (?, ?)", (key, rationale))
        if time.monotonic() - self._committed > COMMIT_EVERY:
            self.commit()

    def graded(self, key: str) -> list[Graded]:
        """Every grade kept for ``key``, one per served identity, the newest first."""
        if self._db is None:
            return []
        rows = self._db.execute(
            "select served, value, rationale from graded where key = ? order by at desc", (key,)
        ).fetchall()
        return [Graded(str(served), float(value), rationale) for served, value, rationale in rows]

    def put_graded(self, key: str, served: str, value: float, rationale: str | None = None) -> None:
        if self._db is None:
            return
        self._db.execute(
            "insert or replace into graded values (?, ?, ?, ?, ?)", (key, served, value, rationale or None, time.time())
        )
        if time.monotonic() - self._committed > COMMIT_EVERY:
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
