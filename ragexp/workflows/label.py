"""``ragexp label`` whole: ``ragexp label RUN_ID`` (:func:`label_run`) and ``ragexp label export``
(:func:`export_labels`); ``ragexp calibrate`` is :mod:`ragexp.workflows.calibrate`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragexp.compare.data import load_run
from ragexp.compare.summary import Links
from ragexp.errors import ConfigError
from ragexp.labels.collect import (
    collect_labels,
    export_rows,
    trace_expectations,
)
from ragexp.labels.queue import LabelQueue, create_label_queue
from ragexp.outputs import check_writable, write_file
from ragexp.tracking.store import Store

Say = Callable[[str], None]


def _silent(line: str) -> None:
    pass


@dataclass(frozen=True)
class Queued:
    """A review queue made for a run, and where the UI shows it."""

    made: LabelQueue
    base: str | None
    """The MLflow UI's address (None: none known, e.g. a SQLite store)."""
    store_uri: str

    def to_json(self) -> dict[str, Any]:
        return self.made.to_json(self.base)


def label_run(
    run_id: str,
    *,
    metrics: list[str] | None = None,
    sample: int | None = None,
    seed: int = 0,
    queue: str | None = None,
    ui_url: str | None = None,
    tracking_uri: str | None = None,
) -> Queued:
    """Put (a sample of) the run's traces in a review queue, with a question per metric."""
    store = Store(tracking_uri)
    made = create_label_queue(store, run_id, metrics=metrics, sample=sample, seed=seed, queue=queue)
    return Queued(made, Links.for_store(store.uri, ui_url).base, store.uri)


@dataclass(frozen=True)
class Exported:
    run_id: str
    out: Path
    cases: int
    labels: dict[str, int]
    """Labelled cases per metric."""

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "out": str(self.out), "cases": self.cases, "labels": self.labels}


def export_labels(run_id: str, out: str | None, *, tracking_uri: str | None = None, say: Say = _silent) -> Exported:
    """Write the run's labelled cases to ``out`` (JSONL), each with its output and its labels."""
    path = check_writable("--out", out)
    if path is None:
        raise ConfigError("label export: --out FILE is required")
    store = Store(tracking_uri, must_exist=True)
    data = load_run(store, run_id)
    labels = collect_labels(store, data)
    if (line := labels.ignored_line()) is not None:
        say(line)
    rows = export_rows(data, labels, trace_expectations(store, data))
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_file("--out", path, text.encode("utf-8"))
    return Exported(run_id, path, len(rows), labels.counts())
