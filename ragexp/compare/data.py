"""A logged run, read back for comparison: its tags and its per-case scores as arrays.

Scores come from the run's columnar ``scores.json``; ``cases.jsonl`` (tens of MB at 100,000
cases) is read only when a caller asks what a few cases retrieved and answered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ragexp import artifacts
from ragexp.errors import StoreUnreachable, TrackingError
from ragexp.metrics.offline import nearest_rank
from ragexp.metrics.population import covered
from ragexp.metrics.registry import METRICS, MetricSpec, lookup
from ragexp.metrics.summary import mean_or_none
from ragexp.tracking.store import FINISHED, RunRecord, Store


@dataclass
class RunData:
    record: RunRecord
    case_ids: list[str]
    unanswerable: np.ndarray
    errored: np.ndarray
    """(n,) bool: the case has a system or metric error."""
    scores: dict[str, np.ndarray]
    """Per-case metric -> (n,) float, NaN where missing."""
    latency: np.ndarray
    line_index: np.ndarray
    """(n,) int: where each case stands in the run's cases.jsonl."""
    read_lines: Callable[[], Sequence[bytes]] = field(repr=False)
    _lines: Sequence[bytes] | None = field(default=None, repr=False)
    human: dict[str, np.ndarray] = field(default_factory=dict)
    """Metric -> (n,) human scores from the dataset, NaN where unlabelled."""
    custom: dict[str, MetricSpec] = field(default_factory=dict)
    """The run's metrics of the user's own config, as the run recorded them."""
    ttft: np.ndarray | None = None
    """(n,) seconds to the first piece of a streamed answer, NaN where none (None: not streamed)."""
    conversations: list[str | None] | None = None
    """Each case's conversation id (None: a single question); None when the run has none."""
    restricted: bool = False
    """Cut to some of its cases for a comparison (``--common-cases``): a mean or a percentile of
    per-case values is taken over the cases kept, not read from the run's logged summary."""
    canaries: dict[str, Any] | None = None
    """The run's ``canaries.json`` (each canary's judge grade and human score), read when the run
    graded canaries (its ``ragexp.judge.canaries`` tag); None otherwise."""

    @property
    def unit(self) -> str:
        """What comparisons pair and resample: ``conversation`` when the run has any, else ``case``."""
        return "case" if self.conversations is None else "conversation"

    def units(self) -> np.ndarray | None:
        """(n,) int: the unit each case belongs to (a conversation's turns share one, a single
        question is one of its own); None when the run has no conversation."""
        if self.conversations is None:
            return None
        labels: dict[str, int] = {}
        out = np.empty(len(self.conversations), dtype=np.int64)
        for position, conversation in enumerate(self.conversations):
            key = conversation if conversation is not None else f"\0{position}"
            out[position] = labels.setdefault(key, len(labels))
        return out

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def metrics(self) -> list[str]:
        return [name for name in self.record.tag("metrics").split(",") if name]

    def spec(self, name: str) -> MetricSpec | None:
        """What the metric ``name`` is in this run: its own custom metric, else the registry's."""
        return lookup(name, self.custom)

    def summary(self, name: str) -> float | None:
        """The run's logged value of a metric (None when it had no score)."""
        spec = self.spec(name)
        values = self.per_case(name) if self.restricted and spec is not None else None
        if values is not None and spec is not None and spec.mean_of_cases:
            return mean_or_none(values[covered(spec, self.unanswerable)])
        if values is not None and spec is not None and spec.percentile is not None:
            return nearest_rank(values, spec.percentile)
        if name not in self.record.metrics and spec is not None and spec.case_values == "errored":
            return float(self.errored.mean()) if self.errored.size else None
        return self.record.metrics.get(name)

    def calibration(self, name: str) -> dict[str, float]:
        """The run's logged calibration figures of a metric (empty: not calibrated)."""
        prefix = f"calibration.{name}."
        return {key[len(prefix) :]: value for key, value in self.record.metrics.items() if key.startswith(prefix)}

    def per_case(self, name: str) -> np.ndarray | None:
        """Per-case values behind a metric: its scores, latency for p95, time to first token for the
        ttft percentiles, the error flag."""
        if name in self.scores:
            return self.scores[name]
        spec = self.spec(name)
        if spec is None or spec.per_case:
            return None
        if spec.case_values == "latency":
            return self.latency
        if spec.case_values == "ttft":
            return self.ttft
        if spec.case_values == "errored":
            return self.errored.astype(np.float64)
        return None

    def row(self, position: int) -> dict[str, Any]:
        """The full cases.jsonl record of the case at ``position``."""
        if self._lines is None:
            self._lines = self.read_lines()
        return artifacts.case_row(self._lines[int(self.line_index[position])])

    def select(self, case_ids: list[str]) -> RunData:
        """The same run restricted to ``case_ids``, in that order (each id must be present)."""
        if case_ids == self.case_ids:
            return self
        position = {case_id: i for i, case_id in enumerate(self.case_ids)}
        return self.take(np.array([position[case_id] for case_id in case_ids], dtype=np.int64))

    def take(self, order: np.ndarray) -> RunData:
        """The same run restricted to the cases at positions ``order``, in that order."""
        return RunData(
            self.record,
            [self.case_ids[i] for i in order.tolist()],
            self.unanswerable[order],
            self.errored[order],
            {name: values[order] for name, values in self.scores.items()},
            self.latency[order],
            self.line_index[order],
            self.read_lines,
            self._lines,
            {name: values[order] for name, values in self.human.items()},
            self.custom,
            self.ttft[order] if self.ttft is not None else None,
            [self.conversations[i] for i in order.tolist()] if self.conversations is not None else None,
            self.restricted,
            canaries=self.canaries,
        )

    def restrict(self, case_ids: list[str]) -> RunData:
        """:meth:`select`, its means then taken over those cases (see :attr:`restricted`)."""
        return dataclasses.replace(self.select(case_ids), restricted=True)


def load_run(store: Store, run: str | RunRecord) -> RunData:
    """A run's record and score columns (``run``: its id, or its record when the caller holds it)."""
    record = run if isinstance(run, RunRecord) else store.get_run(run)
    run_id = record.run_id
    if not record.tag("config_hash"):
        raise TrackingError(f"run {run_id} was not logged by ragexp run (no ragexp.config_hash tag)")
    if record.status != FINISHED:
        raise TrackingError(f"run {run_id} is {record.status.lower()}, not finished: it cannot be compared")
    columns = artifacts.read_scores(store.read_artifact(run_id, artifacts.SCORES), run_id)

    def read_lines() -> Sequence[bytes]:
        return artifacts.CaseLines(store.read_artifact(run_id, artifacts.CASES))

    return RunData(
        record=record,
        case_ids=columns.case_ids,
        unanswerable=columns.unanswerable,
        errored=columns.errored,
        scores=columns.metrics,
        latency=columns.latency,
        line_index=np.arange(len(columns.case_ids), dtype=np.int64),
        read_lines=read_lines,
        human=columns.human,
        custom=custom_specs(store, record),
        ttft=columns.ttft,
        conversations=columns.conversations,
        canaries=canary_grades(store, record),
    )


def canary_grades(store: Store, record: RunRecord) -> dict[str, Any] | None:
    """The run's ``canaries.json`` when it graded canaries; None when it did not, or its artifact
    is gone or not an object (its logged agreement figures still compare, unpaired)."""
    if not record.tag("judge.canaries"):
        return None
    try:
        found = orjson.loads(store.read_artifact(record.run_id, artifacts.CANARIES))
    except StoreUnreachable:
        raise
    except (TrackingError, orjson.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None


def custom_specs(store: Store, record: RunRecord) -> dict[str, MetricSpec]:
    """The run's metrics of the user's own config, read from its ``custom_metrics.json`` when
    its metric list names one the registry does not know (none otherwise: nothing is read)."""
    names = [name for name in record.tag("metrics").split(",") if name]
    if all(name in METRICS for name in names):
        return {}
    try:
        data = store.read_artifact(record.run_id, artifacts.CUSTOM_METRICS)
    except StoreUnreachable:
        raise
    except TrackingError:  # a run of an older ragexp or of another tool: its names stay unknown
        return {}
    return artifacts.read_custom_metrics(data, record.run_id)
