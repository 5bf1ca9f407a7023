"""What an MLflow store accepts in each field ragexp writes: the one place that knows.

MLflow validates keys and some lengths in its client and server (``mlflow/utils/validation.py``),
and its database columns have lengths of their own (``mlflow/store/tracking/dbmodels/models.py``).
SQLite ignores column lengths and stores NUL; PostgreSQL and MySQL refuse both, and a tracking
server passes the refusal on as an HTTP 400. A limit here is the strictest of the three, so a
value that passes is accepted by a SQLite file, a ``postgresql://`` database and a server alike.

Two ways a value is made safe, chosen per field:

- refused before any work (:func:`problem` / :func:`check`): what the user chose on purpose and
  would not want renamed (experiment, run name, tags, dataset name, case ids);
- mapped to a safe key (:func:`safe_segment`, :func:`client_request_id`): what a service or the
  dataset reports and ragexp only files under a name (stage names, long case ids in the trace's
  client request id); the original is kept beside the key.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragexp.errors import ConfigError
from ragexp.records import SystemOutput

_KEY_ALPHABET = re.compile(r"[/\w.\- :]*")
"""MLflow's alphabet for metric, param and tag keys (``validate_param_and_metric_name`` off
Windows): word characters (Unicode letters and digits included), ``/ . - _``, space and colon."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters: NUL is refused by PostgreSQL in any text column; the others reach a
terminal, a key or a file name as invisible or active text."""
_NUL = re.compile("\x00")
_UNSAFE_IN_SEGMENT = re.compile(r"[^\w.\- ]")
HASH_CHARS = 10
"""Hex characters of the sha256 that keeps two mapped names apart."""


@dataclass(frozen=True)
class Limit:
    """One field of an MLflow store."""

    what: str
    """How a message names the field."""
    chars: int
    """The most characters the field holds on every store (the smallest of MLflow's check and
    the database column)."""
    key: bool = False
    """The field is a key: MLflow's key alphabet applies, and it must read the same as a path."""
    control: bool = False
    """Control characters are refused too, not only NUL (identifiers a person reads and types)."""


METRIC_KEY = Limit("metric name", 250, key=True)
PARAM_KEY = Limit("param name", 250, key=True)
PARAM_VALUE = Limit("param value", 6000)
"""MLflow's check; the column holds 8,000."""
TAG_KEY = Limit("tag name", 250, key=True)
TAG_VALUE = Limit("tag value", 8000)
RUN_NAME = Limit("run name", 250, control=True)
"""The runs table's ``name`` column; MLflow's own check (on the ``mlflow.runName`` tag) allows
8,000, so a longer name passes MLflow and fails PostgreSQL."""
EXPERIMENT_NAME = Limit("experiment name", 256, control=True)
"""The experiments table's ``name`` column; MLflow's own check allows 500."""
DATASET_NAME = Limit("dataset name", 500, control=True)
DATASET_DIGEST = Limit("dataset digest", 36)
CLIENT_REQUEST_ID = Limit("trace client request id", 50)
ASSESSMENT_SOURCE_ID = Limit("assessment source id", 250)
PREVIEW = Limit("trace request/response preview", 1000)
TEXT = Limit("text", 1 << 30)
"""A column without a length (an assessment's rationale): only NUL is refused."""
CASE_ERROR = Limit("case error", 1000)
"""A case's error as ragexp records it (``cases.jsonl``, the trace, the run's table): what a system
or a target's exception said, cut; a message of megabytes says no more than its start."""
CASE_ID = Limit("case id", 8000, control=True)
"""A case id is whole in the trace's metadata (a trace metadata value) and in every artifact; the
client request id maps it (see :func:`client_request_id`)."""


def problem(limit: Limit, value: str) -> str | None:
    """Why ``value`` cannot be stored in the field, in a few words; None if it can."""
    bad = (_CONTROL if limit.control else _NUL).search(value)
    if bad is not None:
        return f"contains the control character U+{ord(bad.group()):04X}"
    if len(value) > limit.chars:
        return f"has {len(value)} characters; an MLflow {limit.what} holds at most {limit.chars}"
    if limit.key:
        if not value:
            return f"is empty; an MLflow {limit.what} cannot be"
        if _KEY_ALPHABET.fullmatch(value) is None:
            odd = sorted({c for c in value if _KEY_ALPHABET.fullmatch(c) is None})
            shown = " ".join(repr(c) for c in odd[:5])
            return (
                f"contains {shown}; an MLflow {limit.what} may only hold letters, digits, "
                "'_', '-', '.', ' ', ':' and '/'"
            )
        if _path_not_unique(value):
            return (
                f"reads as the path {posixpath.normpath(value)!r}; an MLflow {limit.what} must not start with "
                "'/' or '..' nor hold '//', './' or a trailing '/'"
            )
    return None


def check(limit: Limit, value: str, where: str) -> None:
    """Raise a :class:`ConfigError` naming ``where`` (a config key or a file and field) if
    ``value`` cannot be stored in the field."""
    reason = problem(limit, value)
    if reason is not None:
        raise ConfigError(f"{where}: {_shown(value)} {reason}")


def safe_segment(name: str, budget: int) -> str:
    """``name`` as a piece of a metric or tag key of at most ``budget`` characters: itself when
    it is a fine piece already, else its safe characters (the others become ``_``) cut to fit
    and a short hash of the whole name, so two different names never share a key."""
    if name and len(name) <= budget and problem(METRIC_KEY, f"x.{name}.x") is None:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    cleaned = _UNSAFE_IN_SEGMENT.sub("_", name).strip(" .")
    keep = max(budget - HASH_CHARS - 1, 0)
    return f"{cleaned[:keep]}_{digest}" if cleaned[:keep] else digest


def shortened(limit: Limit, value: str) -> str:
    """``value`` when it fits the field, else its start, ``~`` and a short hash of the whole
    value: for ids ragexp files under a field too short for them (the whole value is kept
    elsewhere, where it fits)."""
    if len(value) <= limit.chars:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{value[: limit.chars - HASH_CHARS - 1]}~{digest}"


def client_request_id(case_id: str) -> str:
    """A trace's client request id for a case (the whole id is in the trace's metadata)."""
    return shortened(CLIENT_REQUEST_ID, case_id)


def fit(limit: Limit, value: str) -> str:
    """``value`` cut to the field's length, NUL made visible: for texts ragexp composes itself
    (a stop reason, a sweep's point list), where a cut is better than a refusal."""
    value = _NUL.sub("\\\\0", value)
    if len(value) <= limit.chars:
        return value
    return value[: limit.chars - 1] + "…"


def _path_not_unique(name: str) -> bool:
    # MLflow's path_not_unique: keys may become file names on a file store.
    norm = posixpath.normpath(name)
    return norm != name or norm == "." or norm.startswith("..") or norm.startswith("/")


def _shown(value: str, most: int = 60) -> str:
    text = value if len(value) <= most else value[:most] + "…"
    return repr(text)


# -- numbers ---------------------------------------------------------------------------------

MAX_COUNT = 2**53
"""The largest count (tokens) ragexp records: a count is summed into an MLflow metric, a double,
which holds every whole number up to here exactly; past 64 bits the checkpoint's JSON cannot
hold it at all."""
MAX_SECONDS = 1e6
"""The longest duration (a stage's timing, a latency) ragexp records, about eleven days: longer
than any one call, while a trace's spans end in nanoseconds on a 64-bit clock. An epoch in
milliseconds read as seconds (about 1.7e12) is far past it."""
MAX_STAGES = 1000
"""The most stages one case's timings or stage detail may name: each becomes a span of the
case's trace, laid end to end, so the count bounds the trace's length too."""


def count_problem(value: Any) -> str | None:
    """Why ``value`` is not a count ragexp can record (a non-negative whole number up to
    :data:`MAX_COUNT`), in a few words; None if it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"is {type(value).__name__}, not a whole number"
    if isinstance(value, numbers.Integral):
        whole = int(value)
    else:
        number = float(value)
        if not math.isfinite(number) or number != math.floor(number):
            return f"is {_number(value)}, not a whole number"
        whole = int(number)
    if whole < 0:
        return f"is {_number(value)}, not a non-negative whole number"
    if whole > MAX_COUNT:
        return f"is {_number(value)}, past the largest count recorded ({MAX_COUNT:,})"
    return None


def seconds_problem(value: Any) -> str | None:
    """Why ``value`` is not a duration ragexp can record (finite, non-negative seconds up to
    :data:`MAX_SECONDS`); None if it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"is {type(value).__name__}, not a number of seconds"
    if isinstance(value, numbers.Integral):
        number: float = int(value)  # a Python int of any size compares exactly; float() could overflow
    else:
        number = float(value)
        if not math.isfinite(number):
            return f"is {_number(value)}, not a finite number of seconds"
    if number < 0:
        return f"is {_number(value)}, not a non-negative number of seconds"
    if number > MAX_SECONDS:
        return f"is {_number(value)} s, past the longest duration recorded ({MAX_SECONDS:g} s)"
    return None


def output_problem(output: SystemOutput) -> str | None:
    """Why a number in what a system returned cannot be recorded (in the checkpoint, a trace, the
    store), naming the field; None if every one can. Whatever read the output checked it already:
    this is the last check before anything is written, so a value that slipped through is an
    error for its case, never the run's."""
    latency, ttft = output.latency_seconds, output.ttft_seconds
    if (
        not (output.timings or output.tokens or output.stages)
        and (latency is None or (type(latency) is float and 0.0 <= latency <= MAX_SECONDS))
        and (ttft is None or (type(ttft) is float and 0.0 <= ttft <= MAX_SECONDS))
    ):
        return None  # the usual output, checked without building the list below: every case passes here
    checks: list[tuple[str, Any, Callable[[Any], str | None]]] = [
        ("latency_seconds", output.latency_seconds, seconds_problem),
        ("ttft_seconds", output.ttft_seconds, seconds_problem),
    ]
    if len(output.timings or {}) > MAX_STAGES or len(output.stages or {}) > MAX_STAGES:
        return f"the reply names more than {MAX_STAGES} stages"
    checks += [(f"timings[{stage!r}]", value, seconds_problem) for stage, value in (output.timings or {}).items()]
    checks += [(f"tokens.{name}", value, count_problem) for name, value in (output.tokens or {}).items()]
    for name, value, check in checks:
        if value is None:
            continue
        reason = check(value)
        if reason is not None:
            return f"{name} {reason}"
    return None


def _number(value: Any) -> str:
    if isinstance(value, numbers.Integral):
        digits = len(str(abs(int(value))))
        return str(value) if digits <= 24 else f"a {digits}-digit number"
    text = repr(value)
    return text if len(text) <= 24 else f"{float(value):.3g}"
