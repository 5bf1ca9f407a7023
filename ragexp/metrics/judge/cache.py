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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ragexp.sqlite_cache import SqliteCache

COMMIT_EVERY = 1.0
"""Seconds of grades that may wait for a commit: a judged run writes many, and each commit syncs."""


def cache_key(metric: str, judge: str, inputs: dict[str, Any], repeat: int) -> str:
    payload = {"metric": metric, "judge": judge, "inputs": inputs, "repeat": repeat}
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class Graded:
    """A cached grade and the served identity that made it."""

    served: str
    value: float
    rationale: str | None


class JudgeCache(SqliteCache):
    def __init__(self, path: Path | None) -> None:
        super().__init__(
            path,
            [
                "create table if not exists scores (key text primary key, value real, at real)",
                "create table if not exists rationales (key text primary key, rationale text)",
                "create table if not exists graded (key text, served text, value real, rationale text, at real, "
                "primary key (key, served))",
            ],
            commit_every=COMMIT_EVERY,
        )

    def get(self, key: str) -> float | None:
        row = self.row("select value from scores where key = ?", (key,))
        if row is None:
            return None
        self.hits += 1
        return float(row[0])

    def rationale(self, key: str) -> str | None:
        """The rationale kept with the score of ``key`` (None: none was)."""
        row = self.row("select rationale from rationales where key = ?", (key,))
        return None if row is None else str(row[0])

    def put(self, key: str, value: float, rationale: str | None = None) -> None:
        if rationale:
            self.write("insert or replace into rationales values (?, ?)", (key, rationale))
        self.write("insert or replace into scores values (?, ?, ?)", (key, value, time.time()))

    def graded(self, key: str) -> list[Graded]:
        """Every grade kept for ``key``, one per served identity, the newest first."""
        rows = self.rows("select served, value, rationale from graded where key = ? order by at desc", (key,))
        return [Graded(str(served), float(value), rationale) for served, value, rationale in rows]

    def put_graded(self, key: str, served: str, value: float, rationale: str | None = None) -> None:
        self.write(
            "insert or replace into graded values (?, ?, ?, ?, ?)", (key, served, value, rationale or None, time.time())
        )
