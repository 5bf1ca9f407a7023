"""Reviewers' answers on a run's traces, read from MLflow's trace entities (no mlflow import).

A reviewer's answer on the UI's Review page is a ``Feedback`` assessment on the trace, named after
the label schema, with a ``HUMAN`` source (:mod:`ragexp.tracking.review_queues` reads the traces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ragexp.case_traces import CASE_METADATA


def case_id(info: Any) -> str | None:
    """The ragexp case a trace shows (None: not a ragexp case trace)."""
    value = (info.trace_metadata or {}).get(CASE_METADATA)
    return str(value) if value is not None else None


@dataclass(frozen=True)
class HumanLabel:
    """One reviewer's answer on one trace."""

    trace_id: str
    name: str
    value: Any
    time_ms: int
    source_id: str = ""
    """Who answered (the assessment source's id: the reviewer's user name on the Review page)."""


def human_feedback(info: Any) -> dict[str, list[HumanLabel]]:
    """The valid HUMAN feedback on a trace by name, newest first (a reviewer who changed an
    answer, or a second reviewer, comes before the older answers)."""
    found: dict[str, list[HumanLabel]] = {}
    for item in info.assessments or []:
        source = getattr(item, "source", None)
        if getattr(item, "feedback", None) is None or source is None or source.source_type != "HUMAN":
            continue
        if getattr(item, "valid", True) is False or getattr(item, "error", None) is not None:
            continue
        when = int(item.last_update_time_ms or item.create_time_ms or 0)
        label = HumanLabel(info.trace_id, item.name, item.value, when, str(source.source_id or ""))
        found.setdefault(item.name, []).append(label)
    for answers in found.values():
        answers.sort(key=lambda label: label.time_ms, reverse=True)
    return found


def as_score(value: Any) -> float | None:
    """A label's value as a score: a pass/fail answer is 1 or 0, a number itself; None otherwise."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def queue_url(base: str | None, experiment_id: str, queue_id: str) -> str | None:
    """A review queue on the MLflow UI's Review page (None without a known UI address)."""
    if base is None:
        return None
    return f"{base}/#/experiments/{experiment_id}/review-queue?selectedQueueId={queue_id}"
