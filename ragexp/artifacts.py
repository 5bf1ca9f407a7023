"""The run-artifact format: what ``ragexp run`` writes next to a run, and how it is read back.

This module is the only code that knows the layout of ``cases.jsonl`` (one JSON object per case,
everything the case did), ``scores.json`` (the same scores as columns, for fast comparison) and
``summary.json`` (the run's figures). It does not import mlflow: the store moves bytes, this
module gives them their meaning.

``scores.json`` and ``summary.json`` carry ``format_version``; a run's ``cases.jsonl`` has the
version of its ``scores.json``. Runs logged before the field existed have no version and are read
as version 1, which is the same layout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, overload

import numpy as np
import orjson

from ragexp.datasets.ledger import KEY as CONTENT_HASH
from ragexp.datasets.ledger import iter_case_hashes
from ragexp.errors import TrackingError
from ragexp.metrics.custom_spec import spec_from_json, spec_json
from ragexp.metrics.registry import MetricSpec
from ragexp.metrics.wording import KEY as RATIONALE_CODES
from ragexp.metrics.wording import CaseCodes
from ragexp.records import Case, CaseResult

FORMAT_VERSION = 1
"""The version this ragexp writes."""
READABLE_VERSIONS = frozenset({1})
"""The versions this ragexp reads."""

_BLANK = np.array([9, 11, 12, 32], dtype=np.uint8)
"""Bytes bytes.strip removes, other than the line breaks \\n and \\r."""

CASES = "cases.jsonl"
SCORES = "scores.json"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
TABLE = "cases_table.json"
AUDIT = "audit.json"
TIMINGS = "timings.json"
"""Per stage of the system's timings: its name, the key prefix of its metrics, its figures."""
SEQUENTIAL = "sequential.json"
"""Where a run of ``run --until-decided`` stopped: cases evaluated, decision, each rule's bound."""
CUSTOM_METRICS = "custom_metrics.json"
"""What each metric of the user's own config was in this run (``metrics.custom``): commands that
read the run know its direction, range and definition without the user's config."""

CONVERSATIONS = "conversations.jsonl"
"""One row per conversation: its turns, whether all were correct, the first that was not."""
CANARIES = "canaries.json"
"""With ``judge.canaries``: each canary's grade by the run's judge, the human scores, the agreement
and what served the judge (``--bridge-judge canaries`` reads it)."""
TRAFFIC = "traffic.json"
"""A run on production traffic (``dataset=traces``): what was read, left out and sampled, and
each case's stratum (``strata``)."""
SHADOW = "shadow.json"
"""``ragexp shadow``'s outcome, on the candidate."""
DRAFT = "draft.jsonl"
"""The drafted cases ``ragexp draft`` logged, which ``draft review`` and ``draft accept`` read."""
SWEEP = "sweep/sweep.json"
SWEEP_FRONT = "sweep/front.png"
"""What ``ragexp sweep`` logs to the parent run: the analysis (as ``--json`` prints it) and the plot."""
GATE = "gate.json"
DIFF = "diff.json"
ATTRIBUTION = "attribution.json"
"""Comparisons, kept on the candidate under :func:`comparison`: every gate and diff of a pair, and
``diff --attribute``'s result."""


def comparison(baseline: str, name: str = "") -> str:
    """Where the candidate keeps its comparisons with ``baseline`` (``name``: one of them)."""
    return f"comparisons/{baseline}/{name}" if name else f"comparisons/{baseline}"


def nullable(values: np.ndarray) -> list[float | None]:
    """A float column as JSON can hold it: NaN (no score) becomes null."""
    return [None if value != value else value for value in values.tolist()]


def error_text(result: CaseResult) -> str | None:
    """One line saying why a case has no (or an incomplete) score."""
    if result.error is not None:
        return result.error
    if result.metric_errors:
        return "; ".join(f"{name}: {reason}" for name, reason in result.metric_errors.items())
    return None


def write_cases(
    path: Path,
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    columns: Mapping[str, list[float | None]],
    latency: list[float | None],
    spread: Mapping[str, list[float | None]],
) -> None:
    """``cases.jsonl``: per case its id, question, scores, error, system output and latency; a
    turn of a conversation also its ``conversation`` id and 1-based ``turn``; every case its
    content hashes (:func:`ragexp.datasets.ledger.case_hashes`), which tell dataset versions apart."""
    names = list(columns)
    hashes = iter_case_hashes(cases)
    # One pass over the rows of a transposed table instead of a dict lookup per metric and case,
    # and one write per chunk instead of one per case: this file is written for every case.
    n = len(cases)
    scores = zip(*(columns[name] for name in names), strict=True) if names else repeat((), n)
    spreads = zip(*spread.values(), strict=True) if spread else repeat((), n)
    spread_names = list(spread)
    dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    chunk: list[bytes] = []
    with path.open("wb") as out:
        for case, result, values, seconds, spread_values, hashed in zip(
            cases, results, scores, latency, spreads, hashes, strict=True
        ):
            output = result.output
            row: dict[str, Any] = {
                "id": case.id,
                "question": case.question,
                "unanswerable": case.unanswerable,
                "metrics": dict(zip(names, values, strict=True)),
                "error": error_text(result) if result.error is not None or result.metric_errors else None,
                "output": output.to_json() if output is not None else None,
                "latency_seconds": seconds,
                CONTENT_HASH: hashed,
            }
            if result.metric_errors:
                row["metric_errors"] = result.metric_errors
            if case.conversation is not None:
                row["conversation"] = case.conversation
                row["turn"] = case.turn
            if result.rationale:
                row["rationale"] = result.rationale
            codes = result.rationale_codes
            if codes is not None:
                said = codes.to_json() if isinstance(codes, CaseCodes) else dict(codes)
                if said:
                    row[RATIONALE_CODES] = said
            if spread:
                row["spread"] = dict(zip(spread_names, spread_values, strict=True))
            chunk.append(dumps(row, option=newline))
            if len(chunk) == _CHUNK:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))


_CHUNK = 4096
"""Rows joined per write: few calls, and never the whole file in memory twice."""


def write_scores(
    path: Path,
    cases: Sequence[Case],
    errored: np.ndarray,
    latency: list[float | None],
    columns: Mapping[str, list[float | None]],
    human: Mapping[str, np.ndarray],
    ttft: np.ndarray | None = None,
) -> None:
    """``scores.json``: the per-case columns comparisons read (null: no score); ``ttft_seconds``
    when some case was streamed (what the time-to-first-token metrics are compared on); with
    conversations, ``conversations``: each case's conversation id (null for a single question),
    the unit comparisons pair and resample by."""
    payload: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "case_ids": [case.id for case in cases],
        "unanswerable": [case.unanswerable for case in cases],
        "errored": errored.tolist(),
        "latency_seconds": latency,
        "metrics": dict(columns),
        "human": {name: nullable(values) for name, values in human.items()},
    }
    if ttft is not None and np.isfinite(ttft).any():
        payload["ttft_seconds"] = nullable(ttft)
    if any(case.conversation is not None for case in cases):
        payload["conversations"] = [case.conversation for case in cases]
    path.write_bytes(orjson.dumps(payload))


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """``summary.json``: the run's figures, human-readable."""
    payload = {"format_version": FORMAT_VERSION, **summary}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")


def write_config(path: Path, config: Mapping[str, Any]) -> None:
    """``config.yaml``: the resolved config, secrets left out."""
    import yaml

    text: str = yaml.safe_dump(dict(config), allow_unicode=True, sort_keys=False)
    path.write_bytes(text.encode("utf-8"))


def write_timings(path: Path, stages: Sequence[Mapping[str, Any]]) -> None:
    """``timings.json``: per stage its name, the key prefix of its metrics and its figures."""
    path.write_bytes(orjson.dumps({"stages": list(stages)}, option=orjson.OPT_INDENT_2))


def write_custom_metrics(path: Path, specs: Sequence[MetricSpec]) -> None:
    """``custom_metrics.json``: the specs of the run's metrics of the user's own config."""
    payload = {"format_version": FORMAT_VERSION, "metrics": [spec_json(spec) for spec in specs]}
    path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))


def read_custom_metrics(data: bytes, run_id: str) -> dict[str, MetricSpec]:
    """Metric name -> spec, from a run's ``custom_metrics.json``."""
    payload = _object(data, CUSTOM_METRICS, run_id)
    check_version(payload, CUSTOM_METRICS, run_id)
    try:
        specs = [spec_from_json(item) for item in payload["metrics"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise TrackingError(f"run {run_id}: {CUSTOM_METRICS} is not one this ragexp wrote ({exc!r})") from None
    return {spec.name: spec for spec in specs}


def write_audit(path: Path, findings: Sequence[Mapping[str, Any]]) -> None:
    """``audit.json``: the label audit's findings against the dataset's corpus."""
    path.write_bytes(orjson.dumps({"findings": list(findings)}, option=orjson.OPT_INDENT_2))


def write_conversations(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``conversations.jsonl``: per conversation its id, turn count, ``all_correct``,
    ``first_failed_turn`` and ``errored_turn`` (null where it has none)."""
    path.write_bytes(b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE) for row in rows))


def write_canaries(path: Path, graded: Mapping[str, Any]) -> None:
    """``canaries.json``: ``digest``, ``ids``, ``human`` and ``judge`` (metric -> a value per
    canary, null where none), ``agreement`` (metric -> figures), ``served``."""
    path.write_bytes(orjson.dumps(dict(graded)))


def check_version(payload: Mapping[str, Any], artifact: str, run_id: str) -> int:
    """The payload's format version, or one line saying this ragexp cannot read it."""
    version = payload.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        hint = "upgrade ragexp to read it" if newer else "rerun it with this ragexp"
        readable = ", ".join(str(v) for v in sorted(READABLE_VERSIONS))
        raise TrackingError(
            f"run {run_id}: {artifact} has artifact format {version!r}, this ragexp reads format {readable}; {hint}"
        )
    return version


def _object(data: bytes, artifact: str, run_id: str) -> dict[str, Any]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TrackingError(f"run {run_id}: {artifact} is not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise TrackingError(f"run {run_id}: {artifact} should hold a JSON object")
    return payload


@dataclass
class ScoreColumns:
    """A run's ``scores.json`` as arrays (NaN where a score is missing)."""

    case_ids: list[str]
    unanswerable: np.ndarray
    errored: np.ndarray
    latency: np.ndarray
    metrics: dict[str, np.ndarray]
    human: dict[str, np.ndarray]
    format_version: int
    ttft: np.ndarray | None = None
    """Seconds to the first piece of a streamed answer (None: no case was streamed)."""
    conversations: list[str | None] | None = None
    """Each case's conversation id (None: a single question); None when the run has none."""


def read_scores(data: bytes, run_id: str) -> ScoreColumns:
    payload = _object(data, SCORES, run_id)
    version = check_version(payload, SCORES, run_id)
    try:
        return ScoreColumns(
            case_ids=list(payload["case_ids"]),
            unanswerable=np.array(payload["unanswerable"], dtype=bool),
            errored=np.array(payload["errored"], dtype=bool),
            latency=np.array(payload["latency_seconds"], dtype=np.float64),
            # dtype float turns None into NaN: a missing score stays missing.
            metrics={name: np.array(v, dtype=np.float64) for name, v in payload["metrics"].items()},
            human={name: np.array(v, dtype=np.float64) for name, v in payload.get("human", {}).items()},
            format_version=version,
            ttft=np.array(payload["ttft_seconds"], dtype=np.float64) if "ttft_seconds" in payload else None,
            conversations=payload.get("conversations"),
        )
    except KeyError as exc:
        raise TrackingError(f"run {run_id}: {SCORES} has no field {exc.args[0]!r}") from None


def read_summary(data: bytes, run_id: str) -> dict[str, Any]:
    payload = _object(data, SUMMARY, run_id)
    check_version(payload, SUMMARY, run_id)
    return payload


def case_lines(data: bytes) -> list[bytes]:
    """The raw lines of ``cases.jsonl``, one per case (parse one with :func:`case_row`)."""
    return [line for line in data.splitlines() if line.strip()]


class CaseLines(Sequence[bytes]):
    """The same lines as :func:`case_lines`, found with numpy instead of split into 100,000 bytes
    objects: a comparison shows a handful of cases out of the file (5x faster at 100,000 cases)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        buffer = np.frombuffer(data, dtype=np.uint8)
        # Line breaks as bytes.splitlines sees them: \n, \r and \r\n (which leaves an empty piece).
        breaks = np.flatnonzero(buffer == 10)
        if data.find(b"\r") >= 0:
            breaks = np.union1d(breaks, np.flatnonzero(buffer == 13))
        starts = np.concatenate(([0], breaks + 1))
        ends = np.concatenate((breaks, [len(data)]))
        keep = ends > starts
        # A piece that starts with blank space may be blank throughout: bytes.strip decides.
        first = buffer[np.minimum(starts[keep], max(len(data) - 1, 0))] if data else np.zeros(0, dtype=np.uint8)
        for i in np.flatnonzero(keep)[np.isin(first, _BLANK)].tolist():
            keep[i] = bool(data[starts[i] : ends[i]].strip())
        self._starts, self._ends = starts[keep], ends[keep]

    def __len__(self) -> int:
        return int(self._starts.size)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._data[int(self._starts[index]) : int(self._ends[index])]


def case_row(line: bytes) -> dict[str, Any]:
    row: dict[str, Any] = orjson.loads(line)
    return row


def write_table(path: Path, columns: Mapping[str, Sequence[Any]]) -> None:
    """Write a table in the layout ``MlflowClient.log_table`` uses (pandas "split", no index),
    without building a DataFrame: for 100,000 rows that costs seconds."""
    names = list(columns)
    rows = list(zip(*(columns[name] for name in names), strict=True))
    path.write_bytes(orjson.dumps({"columns": names, "data": rows}))
