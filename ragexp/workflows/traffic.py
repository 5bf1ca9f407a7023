"""Production traffic as a dataset (``dataset=traces``): an MLflow experiment's traces sampled
into cases whose recorded output is what production answered.

A trace gives its question (the root span's input), what production retrieved (the documents of
its RETRIEVER spans) and answered (the root span's output); traces that share a session id are
one conversation, its turns in the order they were asked. The sample is drawn per stratum (a
tag or metadata value) in proportion to the strata's sizes. Its identity is its content: the
dataset hash covers each sampled trace's id, question and recorded output, so a rerun on the
same sample compares with the first and a new sample is a new dataset version.

A trace that cannot be read (no root span, no question in its input, no output) is not a case:
it is counted and listed (``Traffic.unreadable``), as are the traces ragexp itself wrote (a run's
case traces), which are always left out.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ragexp import strict_json
from ragexp.case_traces import CASE_METADATA, SESSION_METADATA, TRACE_NAME
from ragexp.config.models import DatasetConfig
from ragexp.datasets.fields import TURN_SEPARATOR
from ragexp.datasets.loader import Dataset
from ragexp.errors import ConfigError
from ragexp.records import Case, SystemOutput
from ragexp.tracking.store import Store
from ragexp.tracking.trace_source import TraceRecord, read_traces

UNKNOWN = "unknown"
"""The stratum of a trace that lacks the ``stratify_by`` key."""
STRATUM = "stratum"
"""The case metadata key holding its stratum."""
TRACE_ID = "trace_id"
"""The case metadata key holding the production trace it was read from."""

QUESTION_KEYS = ("question", "query", "input", "user_input", "query_str", "str_or_query_bundle", "prompt", "text")
"""Keys of a root span's input that hold the question, tried in this order."""
ANSWER_KEYS = ("answer", "output", "response", "result", "output_text", "text", "content")
"""Keys of a root span's output that hold the answer, tried in this order."""
MESSAGES = ("messages", "chat_history")
INPUT_FIELDS = frozenset({"id", "question", "user_input", "unanswerable"})
"""What every sampled case gives the metrics: its question, and no gold."""


@dataclass(frozen=True)
class Unreadable:
    trace_id: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"trace_id": self.trace_id, "reason": self.reason}


@dataclass
class Traffic:
    """The sampled traffic as a dataset, and what reading it found."""

    dataset: Dataset
    experiment: str
    read: int
    """Traces the search returned (the filter and time window applied)."""
    own: int
    """Of them, traces ragexp wrote (left out)."""
    unreadable: list[Unreadable] = field(default_factory=list)
    strata: dict[str, str] = field(default_factory=dict)
    """Case id -> stratum."""
    population: dict[str, int] = field(default_factory=dict)
    """Stratum -> units (traces, or conversations) readable before sampling."""

    def sampled(self) -> dict[str, int]:
        """Stratum -> cases in the sample."""
        counts: dict[str, int] = {}
        for stratum in self.strata.values():
            counts[stratum] = counts.get(stratum, 0) + 1
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "read": self.read,
            "written_by_ragexp": self.own,
            "unreadable_count": len(self.unreadable),
            "unreadable": [item.to_json() for item in self.unreadable],
            "population": dict(sorted(self.population.items())),
            "sampled": self.sampled(),
            "dataset_hash": self.dataset.dataset_hash,
        }

    def describe(self) -> str:
        sampled = self.sampled()
        return (
            f"read {self.read} traces of experiment {self.experiment!r}: {len(self.dataset.cases)} cases sampled "
            f"in {len(sampled)} strata, {len(self.unreadable)} unreadable, {self.own} written by ragexp left out"
        )


def epoch_ms(value: str | None, key: str) -> int | None:
    """A time given as ISO 8601 (UTC when it names no zone) or epoch milliseconds, in epoch ms."""
    if value is None:
        return None
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"config: {key}: {value!r} is not a time (ISO 8601 such as 2026-05-01T00:00:00Z, or epoch milliseconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def question_of(inputs: Any) -> str | None:
    """The question in a root span's input: the string itself, a known key, the last user
    message, or the one string value of a mapping."""
    if isinstance(inputs, str):
        return inputs if inputs.strip() else None
    if isinstance(inputs, dict):
        for key in QUESTION_KEYS:
            found = question_of(inputs.get(key))
            if found is not None:
                return found
        for key in MESSAGES:
            found = _last_message(inputs.get(key), ("user", "human"))
            if found is not None:
                return found
        texts = [value for value in inputs.values() if isinstance(value, str) and value.strip()]
        return texts[0] if len(texts) == 1 else None
    if isinstance(inputs, list):
        return _last_message(inputs, ("user", "human"))
    return None


def answer_of(outputs: Any) -> str | None:
    """The answer in a root span's output: the string itself, a known key, a chat completion's
    first choice, or the last assistant message."""
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, dict):
        for key in ANSWER_KEYS:
            found = answer_of(outputs.get(key))
            if found is not None:
                return found
        choices = outputs.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            return answer_of(choices[0].get("message"))
        return _last_message(outputs.get("messages"), ("assistant", "ai"))
    if isinstance(outputs, list):
        return _last_message(outputs, ("assistant", "ai"))
    return None


def _last_message(messages: Any, roles: Sequence[str]) -> str | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and (message.get("role") or message.get("type")) in roles:
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                return content
    return None


def documents_of(retrieved: Sequence[Any]) -> tuple[list[str], list[str]]:
    """(ids, texts) of the documents RETRIEVER spans returned: LangChain documents
    (``page_content``, ``id`` or ``metadata``) and LlamaIndex nodes with scores (``node``)."""
    ids: list[str] = []
    texts: list[str] = []
    for output in retrieved:
        for document in output if isinstance(output, list) else []:
            if not isinstance(document, dict):
                continue
            inner = document.get("node")
            node: dict[str, Any] = inner if isinstance(inner, dict) else document
            given = node.get("metadata")
            metadata: dict[str, Any] = given if isinstance(given, dict) else {}
            text = node.get("page_content", node.get("text"))
            found = (
                node.get("id")
                or node.get("id_")
                or metadata.get("id")
                or metadata.get("doc_id")
                or metadata.get("source")
                or metadata.get("file_name")
            )
            ids.append(str(found) if found is not None else f"doc-{len(ids) + 1}")
            texts.append(text if isinstance(text, str) else "")
    return ids, texts


@dataclass(frozen=True)
class _Turn:
    record: TraceRecord
    question: str
    answer: str
    ids: list[str]
    texts: list[str]


def _read(record: TraceRecord) -> _Turn | str:
    """The trace as a turn, or why it cannot be one."""
    if not record.has_root:
        return "no root span"
    question = question_of(record.root_inputs)
    if question is None:
        return "no question in the root span's input"
    answer = answer_of(record.root_outputs)
    if answer is None:
        return f"no answer in the root span's output (trace state {record.state})"
    ids, texts = documents_of(record.retrieved)
    return _Turn(record, question, answer, ids, texts)


def _own(record: TraceRecord) -> bool:
    return CASE_METADATA in record.metadata or record.tags.get("mlflow.traceName") == TRACE_NAME


def _stratum(record: TraceRecord, key: str | None) -> str:
    if key is None:
        return UNKNOWN
    value = record.tags.get(key, record.metadata.get(key))
    return str(value) if value not in (None, "") else UNKNOWN


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many of ``n`` draws each stratum gets: in proportion to its size (largest remainders),
    at least one for every stratum while ``n`` allows, never more than it holds."""
    total = sum(sizes.values())
    if n >= total:
        return dict(sizes)
    names = sorted(sizes)
    exact = {name: n * sizes[name] / total for name in names}
    quota = {name: min(sizes[name], int(exact[name])) for name in names}
    if n >= len(names):
        for name in names:
            quota[name] = max(quota[name], 1)
    left = n - sum(quota.values())
    by_remainder = sorted(names, key=lambda name: (-(exact[name] - int(exact[name])), name))
    while left > 0:
        grew = False
        for name in by_remainder:
            if left and quota[name] < sizes[name]:
                quota[name] += 1
                left -= 1
                grew = True
        if not grew:
            break
    while left < 0:
        largest = max(names, key=lambda name: (quota[name], name))
        quota[largest] -= 1
        left += 1
    return quota


def draw(units: dict[str, list[str]], n: int | None, seed: int) -> set[str]:
    """The unit ids drawn: ``units`` is stratum -> unit ids; every one when ``n`` is None."""
    if n is None:
        return {unit for members in units.values() for unit in members}
    rng = random.Random(seed)
    quota = allocate({name: len(members) for name, members in units.items()}, n)
    chosen: set[str] = set()
    for name in sorted(units):
        chosen.update(rng.sample(sorted(units[name]), quota[name]))
    return chosen


def units_by_stratum(traffic: Traffic) -> dict[str, list[list[int]]]:
    """Stratum -> its units in dataset order: a unit is a single question's position, or a whole
    conversation's positions with its turns in order."""
    units: dict[str, list[list[int]]] = {}
    chats: dict[str, list[int]] = {}
    for index, case in enumerate(traffic.dataset.cases):
        stratum = traffic.strata.get(case.id, UNKNOWN)
        if case.conversation is None:
            units.setdefault(stratum, []).append([index])
        elif case.conversation in chats:
            chats[case.conversation].append(index)
        else:
            chats[case.conversation] = [index]
            units.setdefault(stratum, []).append(chats[case.conversation])
    return units


def shuffled_units(units: Mapping[str, Sequence[list[int]]], rng: np.random.Generator) -> dict[str, list[list[int]]]:
    """Each stratum's units in a random order (a conversation's turns stay together and in order)."""
    return {name: [list(units[name][i]) for i in rng.permutation(len(units[name]))] for name in sorted(units)}


def interleave(units: Mapping[str, Sequence[list[int]]], rng: np.random.Generator) -> list[int]:
    """The proportional order: each stratum's units shuffled, its k-th unit placed near k/size of
    the way through, so that any prefix is close to a proportional stratified sample."""
    keyed: list[tuple[float, int, list[int]]] = []
    for name in sorted(units):
        members = [list(units[name][i]) for i in rng.permutation(len(units[name]))]
        offset = float(rng.random())
        keyed.extend(((rank + offset) / len(members), unit[0], unit) for rank, unit in enumerate(members))
    return [index for _, _, unit in sorted(keyed, key=lambda item: item[:2]) for index in unit]


def stratified_order(traffic: Traffic, seed: int) -> list[int]:
    """The dataset positions in the proportional order (:func:`interleave`) of the traffic's
    units. A unit is a single question or a whole conversation, its turns together and in order:
    a later turn is asked after the turns before it, and a batch ends between units."""
    return interleave(units_by_stratum(traffic), np.random.default_rng(seed))


WARMUP = 0.1
"""Of each stratum, the share of its units :class:`FocusedOrder` asks first."""


class FocusedOrder:
    """The order ``shadow --until-decided`` asks traffic in, chosen as the answers come: first a
    warm-up of every stratum (:data:`WARMUP` of its units, at least one), then each batch from the
    one open stratum that is closest to a regression (the smallest margin the caller gives, e.g.
    :func:`passing_share` of its anytime-valid interval). Units are handed out whole, each
    stratum's in its own shuffled order.

    Why the decision stays anytime-valid: each stratum's confidence sequence sees only that
    stratum's cases, which are drawn without replacement in a random order fixed in advance;
    choosing WHICH stratum to ask next from the bounds so far only decides when each sequence
    is looked at again, and a confidence sequence holds at every look, whenever it is made. So each
    stratum's level (and a Bonferroni bound over the strata) is that of a fixed order. A mean over
    all strata pooled would not be: the adaptive draw over-weights the suspicious stratum."""

    def __init__(self, units: Mapping[str, Sequence[list[int]]], step: int, warmup: float = WARMUP) -> None:
        self.units = {name: [list(unit) for unit in units[name]] for name in sorted(units)}
        self.step = max(1, step)
        self.warmup_share = warmup
        self.taken = dict.fromkeys(self.units, 0)
        """Stratum -> units handed out."""

    def left(self, name: str) -> int:
        """Units of the stratum not yet handed out."""
        return len(self.units[name]) - self.taken[name]

    def asked(self, name: str) -> int:
        """Cases of the stratum handed out."""
        return sum(len(unit) for unit in self.units[name][: self.taken[name]])

    def warmup(self) -> list[int]:
        """The first batch: every stratum's first :data:`WARMUP` of its units (at least one)."""
        found: list[int] = []
        for name, members in self.units.items():
            count = min(len(members), max(1, round(self.warmup_share * len(members))))
            found.extend(self._take(name, count))
        return found

    def next(self, margins: Mapping[str, float]) -> tuple[str, list[int]] | None:
        """The next batch, from the open stratum (one ``margins`` names) with units left whose
        margin is smallest (ties: the one asked least, then by name); units to at least ``step``
        cases. None: nothing open is left to ask."""
        name = most_suspicious(
            margins, {name: self.left(name) for name in self.units}, {name: self.asked(name) for name in self.units}
        )
        if name is None:
            return None
        found: list[int] = []
        while len(found) < self.step and self.left(name):
            found.extend(self._take(name, 1))
        return name, found

    def _take(self, name: str, count: int) -> list[int]:
        start = self.taken[name]
        self.taken[name] = min(len(self.units[name]), start + count)
        return [index for unit in self.units[name][start : self.taken[name]] for index in unit]


def most_suspicious(
    margins: Mapping[str, float], left: Mapping[str, int], asked: Mapping[str, int] | None = None
) -> str | None:
    """The stratum asked next: of those open (in ``margins``) with units left, the one whose margin
    to failing is smallest; None when none is. Ties (early on, when every sequence still spans the
    whole range) go to the stratum asked least, then by name, so that no stratum is asked whole
    while the others wait only because its name sorts first."""
    open_ = [name for name in sorted(margins) if left.get(name, 0) > 0]
    counts = asked or {}
    return min(open_, key=lambda name: (margins[name], counts.get(name, 0), name)) if open_ else None


def passing_share(low: float, high: float, line: float, *, fails_above: bool = False) -> float:
    """The share of an interval [low, high] that lies on the passing side of ``line`` (a rule fails
    once the whole interval is beyond it: below it, or above it with ``fails_above``); 0 or less:
    failed. Measured in widths of the interval, not in the metric's unit, so that a stratum asked
    many times, whose interval has narrowed around no change, does not look nearer to failing
    than one barely asked; a stratum whose interval has narrowed around a drop does."""
    width = high - low
    side = (line - low) if fails_above else (high - line)
    return side / width if width > 0 else (0.0 if side <= 0 else float("inf"))


def focused_order(traffic: Traffic, seed: int, step: int) -> FocusedOrder:
    """:class:`FocusedOrder` over the traffic's units, each stratum's shuffled by ``seed``."""
    return FocusedOrder(shuffled_units(units_by_stratum(traffic), np.random.default_rng(seed)), step)


def load_traffic(config: DatasetConfig, store: Store) -> Traffic:
    """Read, sample and turn into cases the traces ``config`` names (``dataset.experiment``)."""
    if config.experiment is None:
        raise ConfigError("config: dataset.experiment: name the MLflow experiment whose traces are the cases")
    start = epoch_ms(config.start, "dataset.start")
    end = epoch_ms(config.end, "dataset.end")
    if start is not None and end is not None and start >= end:
        raise ConfigError(f"config: dataset.start ({config.start}) is not before dataset.end ({config.end})")
    records = read_traces(store, config.experiment, config.filter, start_ms=start, end_ms=end)
    own = sum(_own(record) for record in records)
    unreadable: list[Unreadable] = []
    sessions: dict[str, list[_Turn]] = {}
    singles: dict[str, _Turn] = {}
    for record in records:
        if _own(record):
            continue
        turn = _read(record)
        if isinstance(turn, str):
            unreadable.append(Unreadable(record.trace_id, turn))
            continue
        session = record.metadata.get(SESSION_METADATA)
        if session:
            sessions.setdefault(session, []).append(turn)
        else:
            singles[record.trace_id] = turn
    units: dict[str, list[_Turn]] = {trace_id: [turn] for trace_id, turn in singles.items()}
    for session, turns in sessions.items():
        units[session] = sorted(turns, key=lambda turn: (turn.record.timestamp_ms, turn.record.trace_id))
    by_stratum: dict[str, list[str]] = {}
    for unit, turns in units.items():
        by_stratum.setdefault(_stratum(turns[0].record, config.stratify_by), []).append(unit)
    chosen = draw(by_stratum, config.sample, config.seed)
    cases: list[Case] = []
    strata: dict[str, str] = {}
    for unit in sorted(chosen):
        turns = units[unit]
        stratum = _stratum(turns[0].record, config.stratify_by)
        conversation = unit if unit in sessions else None
        for number, turn in enumerate(turns, start=1):
            case = _case(turn, stratum, len(cases) + 1, conversation, number)
            strata[case.id] = stratum
            cases.append(case)
    if not cases:
        raise ConfigError(
            f"config: dataset.experiment: no readable trace in experiment {config.experiment!r} "
            f"({len(records)} read, {len(unreadable)} unreadable, {own} written by ragexp)"
        )
    dataset = _dataset(config.experiment, cases)
    population = {name: len(members) for name, members in by_stratum.items()}
    return Traffic(dataset, config.experiment, len(records), own, unreadable, strata, population)


def _case(turn: _Turn, stratum: str, line: int, conversation: str | None, number: int) -> Case:
    fields = {"response"}
    if turn.ids:
        fields |= {"retrieved_ids", "retrieved_contexts"}
    latency = turn.record.duration_ms / 1000 if turn.record.duration_ms is not None else None
    if latency is not None:
        fields.add("latency_seconds")
    output = SystemOutput(list(turn.ids), list(turn.texts), turn.answer, [], latency, None)
    metadata = {STRATUM: stratum, TRACE_ID: turn.record.trace_id}
    case_id = turn.record.trace_id if conversation is None else f"{conversation}{TURN_SEPARATOR}{number}"
    return Case(
        case_id,
        turn.question,
        [],
        [],
        None,
        False,
        line,
        output,
        frozenset(fields),
        metadata=metadata,
        conversation=conversation,
        turn=number if conversation is not None else 0,
    )


def content(case: Case) -> dict[str, Any]:
    """What identifies a sampled case: its trace, question and what production gave."""
    recorded = case.recorded or SystemOutput()
    return {
        **case.labels(),
        TRACE_ID: case.metadata.get(TRACE_ID),
        STRATUM: case.metadata.get(STRATUM),
        "response": recorded.answer,
        "retrieved_ids": recorded.ranked_ids,
        "retrieved_contexts": recorded.contexts,
    }


def _dataset(experiment: str, cases: list[Case]) -> Dataset:
    ordered = sorted(cases, key=lambda case: case.id)
    digest = hashlib.sha256(orjson.dumps([content(case) for case in ordered], option=orjson.OPT_SORT_KEYS))
    sha = digest.hexdigest()
    shared = frozenset.intersection(*(case.recorded_fields for case in cases))
    return Dataset(
        path=Path(f"mlflow-traces/{experiment}"),
        format="traces",
        cases=cases,
        file_sha256=sha,
        dataset_hash=sha,
        cases_hash=sha,
        label_fields=INPUT_FIELDS,
        output_fields=shared,
    )


def traffic_json(traffic: Traffic) -> bytes:
    """The ``traffic.json`` artifact of a run on traffic: what was read, left out and sampled."""
    return strict_json.dumps({**traffic.to_json(), "strata": traffic.strata}, indent=1).encode()
