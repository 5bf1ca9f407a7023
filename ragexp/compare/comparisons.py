"""Comparisons kept on the candidate run (``comparisons/<baseline>/<name>``), and the check that a run is
not compared with itself: shared by ``ragexp diff``, ``gate`` and the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ragexp import artifacts, strict_json
from ragexp.errors import ConfigError, TrackingError
from ragexp.tracking.store import Store

Say = Callable[[str], None]


def silent(line: str) -> None:
    pass


def not_the_baseline(candidate: str, baseline: str) -> None:
    """Refuse to compare a run with itself, whichever way the two were chosen."""
    if candidate == baseline:
        raise ConfigError(f"the candidate {candidate} is the baseline itself: there is nothing to compare")


def record_comparison(
    store: Store, candidate: str, baseline: str, name: str, payload: dict[str, Any], say: Say = silent
) -> None:
    """Keep every comparison on the candidate run, as ``comparisons/<baseline>/<name>`` (the
    ``ragexp.gate.*`` tags only hold the latest verdict)."""
    data = strict_json.dumps(payload, indent=1).encode("utf-8")
    try:
        store.log_files(candidate, {artifacts.comparison(baseline, name): data})
    except TrackingError as exc:  # a read-only copy of a store: the result stands, unrecorded
        say(f"warning: the comparison is not recorded on run {candidate}: {exc}")


def read_comparison(store: Store, candidate: str, baseline: str, name: str) -> dict[str, Any] | None:
    """The comparison :func:`record_comparison` kept on ``candidate`` (None: none was recorded)."""
    path = artifacts.comparison(baseline, name)
    if path not in store.list_artifacts(candidate, artifacts.comparison(baseline)):
        return None
    found = json.loads(store.read_artifact(candidate, path))
    return found if isinstance(found, dict) else None
