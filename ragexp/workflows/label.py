"""``ragexp label`` whole: ``ragexp label RUN_ID`` (:func:`label_run`) and ``ragexp label export``
(:func:`export_labels`); ``ragexp calibrate`` is :mod:`ragexp.workflows.calibrate`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragexp.compare.data import load_run
from ragexp.compare.shadow_pair import PAIR_TAG, traffic_strata
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
from ragexp.workflows.traffic import draw

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
    production: LabelQueue | None = None
    """A shadow's candidate: production's traces of the same cases, in the same queue."""
    strata: dict[str, int] = field(default_factory=dict)
    """A shadow's candidate: stratum -> pairs queued."""

    def to_json(self) -> dict[str, Any]:
        if self.production is None:
            return self.made.to_json(self.base)
        return {
            **self.made.to_json(self.base),
            "production": self.production.to_json(self.base),
            "pairs_by_stratum": self.strata,
        }


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
    """Put (a sample of) the run's traces in a review queue, with a question per metric. The
    candidate of a shadow: a stratified sample of the cases both runs answered (in proportion to
    the strata, at least one each), each queued with both answers, production's and the
    candidate's, so that people's labels give paired differences (PPI by stratum in ``diff``)."""
    store = Store(tracking_uri)
    base = Links.for_store(store.uri, ui_url).base
    production = store.get_run(run_id).tags.get(PAIR_TAG)
    if production is None:
        made = create_label_queue(store, run_id, metrics=metrics, sample=sample, seed=seed, queue=queue)
        return Queued(made, base, store.uri)
    if sample is not None and sample < 1:
        raise ConfigError(f"--sample: expected at least 1 pair, got {sample}")
    shared = set(load_run(store, run_id).case_ids) & set(load_run(store, production).case_ids)
    strata = traffic_strata(store, run_id)
    members: dict[str, list[str]] = {}
    for case_id in shared:
        members.setdefault(strata.get(case_id, "unknown"), []).append(case_id)
    cases = draw(members, sample, seed)
    name = queue if queue is not None else f"ragexp {run_id}"
    made = create_label_queue(store, run_id, metrics=metrics, queue=name, cases=cases)
    paired = create_label_queue(store, production, metrics=list(made.schemas), queue=name, cases=cases)
    counts: dict[str, int] = {}
    for case_id in cases:
        counts[strata.get(case_id, "unknown")] = counts.get(strata.get(case_id, "unknown"), 0) + 1
    return Queued(made, base, store.uri, paired, dict(sorted(counts.items())))


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
