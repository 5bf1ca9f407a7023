"""``ragexp runs``: recent runs of an experiment, the points of a sweep, or the runs of a config
hash wherever they are."""

from __future__ import annotations

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

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "runs": self.runs}

    def where(self) -> str:
        return f"experiment '{self.experiment}'" if self.experiment is not None else "any experiment"


def list_runs(
    *,
    limit: int = 20,
    experiment: str | None = None,
    sweep: str | None = None,
    config_hash: str | None = None,
    tracking_uri: str | None = None,
) -> RunList:
    """Newest first: the runs of ``experiment`` (default ``ragexp``), of a sweep (its parent's
    experiment), or, given only a config hash prefix, the runs with that hash in every experiment
    (a hash names a run wherever it was logged)."""
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
    if experiment is None and config_hash is not None:
        records = list(islice(store.iter_runs(store.experiment_ids(), query), limit))
        names = {e: store.experiment_name(e) for e in {r.experiment_id for r in records}}
        return RunList(None, [run_entry(r, names[r.experiment_id]) for r in records])
    name = experiment or DEFAULT_EXPERIMENT
    return RunList(name, [run_entry(r, name) for r in store.search(name, limit=limit, filter_string=query)])


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
        "metrics": {name: record.metrics[name] for name in headline if name in record.metrics},
        "case_count": int(record.metrics.get("case_count", 0)),
        "error_count": int(record.metrics.get("error_count", 0)),
    }
