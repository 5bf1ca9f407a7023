"""``ragexp runs``: recent runs of an experiment, the points of a sweep, or the runs of a config
hash wherever they are."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from ragexp.errors import ConfigError
from ragexp.metrics.registry import headline_metrics
from ragexp.tracking.store import TAG_PREFIX, RunRecord, Store

DEFAULT_EXPERIMENT = "ragexp"


@dataclass(frozen=True)
class RunList:
    experiment: str | None
    """The experiment listed; None when every experiment was searched (``--config-hash``)."""
    runs: list[dict[str, Any]]
    """One entry per run, newest first (see :func:`run_entry`)."""
    cells_left_out: int = 0
    """Attribution cell runs passed over among the newest runs read (``--cells`` lists them)."""

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "runs": self.runs, "cells_left_out": self.cells_left_out}

    def where(self) -> str:
        return f"experiment '{self.experiment}'" if self.experiment is not None else "any experiment"


def role(record: RunRecord) -> dict[str, str] | None:
    """What a run is other than an ordinary run: a swapped cell of ``diff --attribute`` (the
    generator's config replayed on the other run's retrieval, so it shares that run's config hash)
    says so, with the candidate it attributes and its cell; None for an ordinary run."""
    of = record.tag("attribution.of")
    if not of:
        return None
    return {"kind": "attribution_cell", "of": of, "cell": record.tag("attribution.cell")}


def role_words(found: dict[str, str] | None) -> str:
    """``cell candidate/baseline of <run>``; empty for an ordinary run."""
    if found is None:
        return ""
    return f"cell {found['cell']} of {found['of']}"


def list_runs(
    *,
    limit: int = 20,
    experiment: str | None = None,
    sweep: str | None = None,
    config_hash: str | None = None,
    tracking_uri: str | None = None,
    cells: bool = False,
) -> RunList:
    """Newest first: the runs of ``experiment`` (default ``ragexp``), of a sweep (its parent's
    experiment), or, given only a config hash prefix, the runs with that hash in every experiment
    (a hash names a run wherever it was logged). The attribution cell runs of ``diff --attribute``
    are left out unless ``cells`` is set or a config hash is asked for (each run's ``role`` then
    says which are cells); :attr:`RunList.cells_left_out` counts those passed over."""
    clauses = []
    if config_hash is not None:
        prefix = config_hash.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            raise ConfigError(f"--config-hash: expected hexadecimal digits, got {config_hash!r}")
        clauses.append(f"tags.`{TAG_PREFIX}config_hash` LIKE '{prefix}%'")
    store = Store(tracking_uri, must_exist=True)
    if sweep:
        parent = store.get_run(sweep)
        experiment = store.experiment_name(parent.experiment_id)
        clauses.append(f"tags.`{TAG_PREFIX}sweep` = '{sweep}'")
    query = " and ".join(clauses)
    shown = Shown(cells or config_hash is not None)
    if experiment is None and config_hash is not None:
        records = list(islice(shown.filter(store.iter_runs(store.experiment_ids(), query)), limit))
        names = {e: store.experiment_name(e) for e in {r.experiment_id for r in records}}
        return RunList(None, [run_entry(r, names[r.experiment_id]) for r in records])
    name = experiment or DEFAULT_EXPERIMENT
    experiment_id = store.experiment_id(name, create=False)
    found = (
        list(islice(shown.filter(store.iter_runs([experiment_id], query, page_size=min(limit, 1000))), limit))
        if experiment_id is not None
        else []
    )
    return RunList(name, [run_entry(r, name) for r in found], shown.left_out)


@dataclass
class Shown:
    """Which runs a listing shows: every run, or all but the attribution cells (counted)."""

    cells: bool
    left_out: int = 0

    def filter(self, records: Iterator[RunRecord]) -> Iterator[RunRecord]:
        for record in records:
            if self.cells or role(record) is None:
                yield record
            else:
                self.left_out += 1


def run_entry(record: RunRecord, experiment: str) -> dict[str, Any]:
    headline = headline_metrics()
    return {
        "run_id": record.run_id,
        "name": record.name,
        "experiment": experiment,
        "status": record.status,
        "start_time": datetime.fromtimestamp(record.start_time / 1000).isoformat(timespec="seconds"),
        "config_hash": record.tag("config_hash"),
        "dataset": record.tag("dataset"),
        "provider": record.tag("provider"),
        "k": record.tag("k"),
        "point": record.tag("sweep.point"),
        "role": role(record),
        "metrics": {name: record.metrics[name] for name in headline if name in record.metrics},
        "case_count": int(record.metrics.get("case_count", 0)),
        "error_count": int(record.metrics.get("error_count", 0)),
    }
