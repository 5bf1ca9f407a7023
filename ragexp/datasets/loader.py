"""Read a dataset file into :class:`~ragexp.records.Case` objects, or say exactly what is wrong.

Validation is hand-written rather than a pydantic model per line: a 100,000-case file must load
in well under a second, and each rejection must name file, line and field.
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from operator import attrgetter, eq
from pathlib import Path
from typing import Any

import orjson

from ragexp.errors import DatasetError, DatasetErrors
from ragexp.metrics.registry import METRICS, labelled_metric
from ragexp.records import Case, SystemOutput
from ragexp.tracking import limits

MAX_TEXT = 1_000_000
MAX_ERRORS = 50
LABEL_FIELDS = ("id", "question", "relevant_ids", "expected_facts", "reference", "unanswerable")
OUTPUT_FIELDS = ("response", "retrieved_ids", "retrieved_contexts", "citations", "latency_seconds")
KNOWN_FIELDS = frozenset((*LABEL_FIELDS, *OUTPUT_FIELDS, "metadata", "human", "draft"))
DRAFT_STATUSES = ("draft", "screened")
"""``draft.status`` of a drafted case: ``draft`` until people screened it (see ``ragexp draft``)."""
COLUMN_KEYS = ("user_input", "response", "retrieved_contexts", "reference", "human")


@dataclass(slots=True)
class Dataset:
    """A validated evaluation set."""

    path: Path
    format: str
    cases: list[Case]
    file_sha256: str
    """sha256 of the file's bytes: enters the config hash."""
    dataset_hash: str
    """sha256 over the cases' inputs and labels only (not recorded outputs), human scores included."""
    cases_hash: str
    """The same without human scores: two runs whose outputs were labelled apart stay comparable."""
    label_fields: frozenset[str]
    """Label fields every case that needs them carries (e.g. ``relevant_ids``, ``reference``)."""
    output_fields: frozenset[str]
    """Recorded output fields every case carries (what ``provider=replay`` can give)."""

    @property
    def answerable_count(self) -> int:
        return sum(not case.unanswerable for case in self.cases)


def resolve_path(path: str, roots: Path | Sequence[Path] | None = None) -> Path:
    """A relative path is tried against the working directory, then each of ``roots`` in turn
    (see :func:`ragexp.paths.data_roots`); the first that exists wins."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists() or roots is None:
        return candidate
    for root in [roots] if isinstance(roots, Path) else roots:
        if (root / candidate).exists():
            return root / candidate
    return candidate


def load_dataset(path: Path, fmt: str = "auto") -> Dataset:
    """Load and validate; raises :class:`DatasetErrors` listing every problem found."""
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetErrors([DatasetError(name, None, None, "no such file")]) from None
    except OSError as exc:
        raise DatasetErrors([DatasetError(name, None, None, f"cannot read: {exc.strerror}")]) from None
    if not data.strip():
        raise DatasetErrors([DatasetError(name, None, None, "empty file: no cases")])
    try:
        # Windows editors and PowerShell start UTF-8 files with a byte-order mark.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetErrors([DatasetError(name, line, None, "not valid UTF-8")]) from None
    if fmt == "auto":
        fmt = "columns" if _is_single_object(text) else "jsonl"
    if fmt == "columns":
        cases = _parse_columns(name, text)
    else:
        del text  # JSON Lines are parsed from the bytes (see _parse_jsonl): free the copy now
        cases = _parse_jsonl(name, data[len(codecs.BOM_UTF8) :] if data.startswith(codecs.BOM_UTF8) else data)
    file_sha = hashlib.sha256(data).hexdigest()
    labelled = dataset_hash(cases)
    return Dataset(
        path=path,
        format=fmt,
        cases=cases,
        file_sha256=file_sha,
        dataset_hash=labelled,
        # Without human scores both hashes cover the same bytes: hash them once.
        cases_hash=dataset_hash(cases, human=False) if any(case.human for case in cases) else labelled,
        label_fields=_label_fields(cases, fmt),
        output_fields=_output_fields(cases),
    )


def dataset_hash(cases: list[Case], *, human: bool = True) -> str:
    """Order-independent hash of inputs and labels, so replays of the same cases compare."""
    # The sha256 of orjson.dumps(labels sorted by id), fed in chunks: a compact JSON array is its
    # items' JSON joined by commas, so the digest is the same without the whole list of label
    # dicts and its serialisation in memory at once.
    ordered = sorted(cases, key=_BY_ID)
    digest = hashlib.sha256(b"[")
    for start in range(0, len(ordered), _HASH_CHUNK):
        if start:
            digest.update(b",")
        chunk = [case.labels(human=human) for case in ordered[start : start + _HASH_CHUNK]]
        digest.update(memoryview(orjson.dumps(chunk, option=orjson.OPT_SORT_KEYS))[1:-1])
    digest.update(b"]")
    return digest.hexdigest()


_BY_ID = attrgetter("id")
_HASH_CHUNK = 4096


def _is_single_object(text: str) -> bool:
    start = _SPACE.match(text).end()  # type: ignore[union-attr]  # \s* always matches
    if not text.startswith("{", start):
        return False
    end = text.find("\n", start)
    if end != -1 and _NOT_SPACE.search(text, end):
        # A first line that is a whole JSON value followed by more text is JSON Lines: one JSON
        # text holds one value, so the file cannot parse as a single object. Checking that line
        # (without copying the text) spares parsing a large JSONL file as one document.
        try:
            orjson.loads(text[start:end])
        except orjson.JSONDecodeError:
            pass
        else:
            return False
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and "user_input" in value


def _label_fields(cases: list[Case], fmt: str) -> frozenset[str]:
    fields = {"id", "question", "user_input", "unanswerable"}
    answerable = [case for case in cases if not case.unanswerable]
    if fmt == "jsonl":
        fields.add("relevant_ids")  # validation guarantees them on every answerable case
    if all(case.expected_facts for case in answerable):
        fields.add("expected_facts")
    if all(case.reference for case in cases):
        fields.add("reference")
    return frozenset(fields)


def _output_fields(cases: list[Case]) -> frozenset[str]:
    common: frozenset[str] | None = None
    for case in cases:
        common = case.recorded_fields if common is None else common & case.recorded_fields
        if not common:
            break  # nothing left in common: label-only files stop at the first case
    return common or frozenset()


class _Problems:
    """Collects errors; stops collecting (not validating) after MAX_ERRORS."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[DatasetError] = []

    def add(self, line: int | None, field: str | None, reason: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(DatasetError(self.path, line, field, reason))

    def raise_if_any(self) -> None:
        if self.errors:
            raise DatasetErrors(self.errors)


def _parse_jsonl(name: str, data: bytes) -> list[Case]:
    """``data``: the file's bytes, known to be UTF-8, without a byte-order mark.

    Lines are parsed as bytes: orjson reads UTF-8 as it is, where a str is encoded back to UTF-8
    first, and the decoded text (twice the file's size for CJK) is never held whole. A line that
    does not parse is decoded and handled as text, as every line once was, so the rules for blank
    lines (Unicode spaces count) and the error words stay those of str.
    """
    lines = data.split(b"\n")
    quick = _label_columns(lines)
    return quick if quick is not None else _parse_rows(name, lines)


def _parse_rows(name: str, lines: list[bytes]) -> list[Case]:
    """Every row on its own: the quick check where it applies, else the full validation."""
    problems = _Problems(name)
    cases: list[Case] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                problems.add(number, None, f"invalid JSON ({str(exc).split(':')[0]})")
                continue
        if not isinstance(row, dict):
            problems.add(number, None, f"expected a JSON object, got {_type_name(row)}")
            continue
        case = _fast_case(row, number)
        if case is None:
            case = _case_from_row(row, number, problems)
        if case is None:
            continue
        if case.id in first_line:
            problems.add(number, "id", f"duplicate id {case.id!r} (first on line {first_line[case.id]})")
            continue
        first_line[case.id] = number
        cases.append(case)
    if not cases and not problems.errors:
        problems.add(None, None, "empty file: no cases")
    problems.raise_if_any()
    return cases


def _label_columns(lines: list[bytes]) -> list[Case] | None:
    """A file of valid label-only rows (what ``provider=fake`` runs on), checked a column at a time.

    The rules are :func:`_fast_case`'s, applied with ``map`` and set operations that loop in C
    rather than a dozen Python steps per row. Rows go a chunk at a time, so the parsed dicts of
    one chunk are freed before the next is parsed (holding them all costs more in memory traffic
    than the checks save). Anything else, or any doubt (a parse error, a duplicate id, outputs,
    human scores), returns None: the file goes through the row-by-row path, which finds and words
    every problem.
    """
    cases: list[Case] = []
    seen: set[str] = set()
    for start in range(0, len(lines), _CHUNK):
        chunk = lines[start : start + _CHUNK]
        present = list(map(bytes.strip, chunk))
        try:
            rows = list(map(orjson.loads, compress(chunk, present)))
        except orjson.JSONDecodeError:
            return None
        if not rows:
            continue
        if set(map(type, rows)) != _DICT or not set().union(*rows) <= _COLUMN_KEYS:
            return None
        ids = [row.get("id") for row in rows]
        questions = [row.get("question") for row in rows]
        if not (_fine_column(ids) and _fine_column(questions)) or not _fine_ids(ids):
            return None
        seen.update(ids)
        if len(seen) != len(cases) + len(rows):
            return None  # a repeated id
        unanswerable = [row.get("unanswerable", False) for row in rows]
        relevant = [row.get("relevant_ids", []) for row in rows]
        facts = [row.get("expected_facts", []) for row in rows]
        references = [row.get("reference") for row in rows]
        metadata = [row.get("metadata") or {} for row in rows]
        if (
            not set(map(type, metadata)) <= _DICT
            or not set(map(type, unanswerable)) <= _BOOL
            or set(map(type, relevant)) != _LIST
            or set(map(type, facts)) != _LIST
            or not _fine_column(list(chain.from_iterable(relevant)), allow_none=True)
            or not _fine_column(list(chain.from_iterable(facts)), allow_none=True)
            # An answerable case needs relevant ids, an unanswerable one must have none.
            or any(map(eq, unanswerable, map(bool, relevant)))
            or not _fine_column([text for text in references if text is not None], allow_none=True)
        ):
            return None
        size = len(rows)
        # By position, as _fast_case builds them: no recorded output, a dict of its own per case.
        cases.extend(
            map(
                Case,
                ids,
                questions,
                relevant,
                facts,
                references,
                unanswerable,
                compress(count(start + 1), present),
                repeat(None, size),
                repeat(_NO_FIELDS, size),
                map(dict, repeat((), size)),
                metadata,
            )
        )
    return cases or None


_CHUNK = 2048


def _fine_column(values: list[Any], *, allow_none: bool = False) -> bool:
    """Every value a string of 1 to MAX_TEXT characters that is not blank (an empty column too,
    when ``allow_none``: the items of lists that may all be empty)."""
    if not values:
        return allow_none
    return set(map(type, values)) == _STR and all(map(str.strip, values)) and max(map(len, values)) <= MAX_TEXT


def _fine_ids(ids: list[str]) -> bool:
    """No id that an MLflow store refuses (control characters, length): one check over the
    joined ids, as the fast paths check a column at a time."""
    return not limits.has_control("".join(ids)) and max(map(len, ids)) <= limits.CASE_ID.chars


def _fine_strings(value: Any) -> bool:
    # A plain loop: three times faster than all() over a generator, on every case of a large set.
    if type(value) is not list:
        return False
    for item in value:  # noqa: SIM110 - see above
        if type(item) is not str or not item.strip() or len(item) > MAX_TEXT:
            return False
    return True


def _fast_case(row: dict[str, Any], line: int) -> Case | None:
    """The common, valid row (labels, and recorded outputs for replay), checked with few calls;
    None sends the row to :func:`_case_from_row`, which finds and words every problem."""
    keys = row.keys()
    if not keys <= _QUICK_KEYS:
        return None
    case_id, question = row.get("id"), row.get("question")
    if type(case_id) is not str or type(question) is not str or not case_id.strip() or not question.strip():
        return None
    if limits.has_control(case_id) or len(case_id) > limits.CASE_ID.chars:
        return None
    unanswerable = row.get("unanswerable", False)
    relevant = row.get("relevant_ids", [])
    facts = row.get("expected_facts", [])
    reference = row.get("reference")
    if (
        type(unanswerable) is not bool
        or len(question) > MAX_TEXT
        or not _fine_strings(relevant)
        or unanswerable == bool(relevant)
        or not _fine_strings(facts)
        or (
            reference is not None and (type(reference) is not str or not reference.strip() or len(reference) > MAX_TEXT)
        )
    ):
        return None
    metadata = row.get("metadata")
    if metadata is not None and type(metadata) is not dict:
        return None
    recorded: SystemOutput | None = None
    fields = _NO_FIELDS
    if not keys <= _LABEL_KEYS:
        checked = _fast_output(row, keys & _OUTPUT_KEYS)
        if checked is None:
            return None
        recorded, fields = checked
    # By position, defaults included: half the cost of keywords and default factories.
    return Case(case_id, question, relevant, facts, reference, unanswerable, line, recorded, fields, {}, metadata or {})


def _fast_output(row: dict[str, Any], present: set[str]) -> tuple[SystemOutput | None, frozenset[str]] | None:
    """The recorded output of a common, valid row (what :func:`_recorded` builds from it); None
    sends the row to the full validation."""
    if not present:
        return None, _NO_FIELDS
    for key in present:
        if row[key] is None:
            return None
    response = row.get("response", "")
    ranked = row.get("retrieved_ids", [])
    contexts = row.get("retrieved_contexts", [])
    citations = row.get("citations", [])
    latency = row.get("latency_seconds")
    if type(response) is not str or not _fine_strings(ranked) or type(contexts) is not list:
        return None
    for text in contexts:
        if type(text) is not str or len(text) > MAX_TEXT:
            return None
    if type(citations) is not list:
        return None
    for number in citations:
        if type(number) is not int or number < 1:
            return None
    if latency is not None and (type(latency) not in (int, float) or latency < 0):
        return None
    seconds = float(latency) if latency is not None else None
    return SystemOutput(ranked, contexts, response, list(citations), seconds, None), frozenset(present)


_SPACE = re.compile(r"\s*")
_NOT_SPACE = re.compile(r"\S")
_LABEL_KEYS = frozenset(LABEL_FIELDS)
_OUTPUT_KEYS = frozenset(OUTPUT_FIELDS)
_QUICK_KEYS = _LABEL_KEYS | _OUTPUT_KEYS | {"metadata"}
"""Fields the quick check knows (``metadata`` is a free-form object)."""
_NO_FIELDS: frozenset[str] = frozenset()
_COLUMN_KEYS = _LABEL_KEYS | {"metadata"}
"""Fields of the rows the column check takes: labels, and ``metadata`` (a free-form object)."""
_DICT, _LIST, _STR, _BOOL = {dict}, {list}, {str}, {bool}


def _case_from_row(row: dict[str, Any], line: int, problems: _Problems) -> Case | None:
    before = len(problems.errors)
    for key in row:
        if key not in KNOWN_FIELDS:
            close = difflib.get_close_matches(key, sorted(KNOWN_FIELDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.add(line, key, f"unknown field{hint}")
    case_id = row.get("id")
    if not isinstance(case_id, str) or not case_id.strip():
        problems.add(line, "id", "required: a non-empty string")
        case_id = ""
    elif (reason := limits.problem(limits.CASE_ID, case_id)) is not None:
        problems.add(line, "id", f"{case_id[:60]!r} {reason} (an id is stored in MLflow and shown in reports)")
    question = _text(row, "question", line, problems, required=True)
    unanswerable = row.get("unanswerable", False)
    if not isinstance(unanswerable, bool):
        problems.add(line, "unanswerable", f"expected true or false, got {_type_name(unanswerable)}")
        unanswerable = False
    relevant = _str_list(row, "relevant_ids", line, problems)
    if unanswerable and relevant:
        problems.add(line, "relevant_ids", "an unanswerable case must not have relevant ids")
    elif not unanswerable and not relevant and "relevant_ids" not in _bad_fields(problems, before):
        problems.add(line, "relevant_ids", "an answerable case needs at least one relevant id")
    facts = _str_list(row, "expected_facts", line, problems)
    reference = _text(row, "reference", line, problems, required=False)
    recorded, recorded_fields = _recorded(row, line, problems)
    human = _human(row.get("human"), line, problems)
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        problems.add(line, "metadata", f"expected an object, got {_type_name(metadata)}")
    draft = _draft_status(row.get("draft"), line, problems)
    if len(problems.errors) != before:
        return None
    return Case(
        id=case_id,
        question=question or "",
        relevant_ids=relevant,
        expected_facts=facts,
        reference=reference,
        unanswerable=unanswerable,
        line=line,
        recorded=recorded,
        recorded_fields=recorded_fields,
        human=human,
        metadata=metadata or {},
        draft=draft,
    )


def _draft_status(value: Any, line: int, problems: _Problems) -> str | None:
    """The ``status`` of a ``draft`` object (its other keys are provenance, kept as written)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add(line, "draft", f"expected an object with 'status', got {_type_name(value)}")
        return None
    status = value.get("status")
    if status not in DRAFT_STATUSES:
        problems.add(line, "draft.status", f"expected one of {', '.join(DRAFT_STATUSES)}, got {status!r}")
        return None
    return str(status)


def _human(value: Any, line: int, problems: _Problems) -> dict[str, float]:
    """``{metric: score}`` human scores: metrics that take them, values in the metric's range."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(line, "human", f"expected an object {{metric: score}}, got {_type_name(value)}")
        return {}
    labels: dict[str, float] = {}
    for name, score in value.items():
        spec = labelled_metric(name)
        if spec is None:
            known = sorted(s.name for s in METRICS.values() if s.human_labels)
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.add(line, f"human.{name}", f"not a metric that takes human scores{hint}: {', '.join(known)}")
            continue
        high = spec.high if spec.high is not None else math.inf
        if isinstance(score, bool) or not isinstance(score, int | float) or not spec.low <= score <= high:
            problems.add(line, f"human.{name}", f"expected a number in [{spec.low:g}, {high:g}], got {score!r}")
            continue
        if spec.name in labels:
            problems.add(line, f"human.{name}", f"repeats '{spec.name}'")
            continue
        labels[spec.name] = float(score)
    return labels


def _bad_fields(problems: _Problems, since: int) -> set[str]:
    return {error.field or "" for error in problems.errors[since:]}


def _recorded(row: dict[str, Any], line: int, problems: _Problems) -> tuple[SystemOutput | None, frozenset[str]]:
    present = frozenset(key for key in OUTPUT_FIELDS if row.get(key) is not None)
    if not present:
        return None, present
    response = row.get("response")
    if response is not None and not isinstance(response, str):
        problems.add(line, "response", f"expected a string, got {_type_name(response)}")
    ranked = _str_list(row, "retrieved_ids", line, problems)
    contexts = _str_list(row, "retrieved_contexts", line, problems, allow_empty_items=True)
    citations = row.get("citations") or []
    if not isinstance(citations, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 1 for item in citations
    ):
        problems.add(line, "citations", "expected a list of 1-based integers")
        citations = []
    latency = row.get("latency_seconds")
    if latency is not None and (isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0):
        problems.add(line, "latency_seconds", "expected a non-negative number")
        latency = None
    output = SystemOutput(
        ranked_ids=ranked,
        contexts=contexts,
        answer=response if isinstance(response, str) else "",
        citations=list(citations),
        latency_seconds=float(latency) if latency is not None else None,
    )
    return output, present


def _text(row: dict[str, Any], key: str, line: int, problems: _Problems, *, required: bool) -> str | None:
    value = row.get(key)
    if value is None:
        if required:
            problems.add(line, key, "required: a string of 1 to 1,000,000 characters")
        return None
    if not isinstance(value, str):
        problems.add(line, key, f"expected a string, got {_type_name(value)}")
        return None
    if not value.strip():
        problems.add(line, key, "must not be empty")
        return None
    if len(value) > MAX_TEXT:
        problems.add(line, key, f"too long: {len(value):,} characters (at most 1,000,000)")
        return None
    return value


def _str_list(
    row: dict[str, Any], key: str, line: int, problems: _Problems, *, allow_empty_items: bool = False
) -> list[str]:
    value = row.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(line, key, f"expected a list of strings, got {_type_name(value)}")
        return []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            problems.add(line, key, f"item {index} is {_type_name(item)}, expected a string")
            return []
        if not allow_empty_items and not item.strip():
            problems.add(line, key, f"item {index} is an empty string")
            return []
        if len(item) > MAX_TEXT:
            problems.add(line, key, f"item {index} is longer than 1,000,000 characters")
            return []
    return value


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _parse_columns(name: str, text: str) -> list[Case]:
    """The MindSDK/ragas layout: one object of parallel lists, checked for equal lengths."""
    problems = _Problems(name)
    try:
        table = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        line = _line_of_offset(text, exc.pos)
        raise DatasetErrors([DatasetError(name, line, None, f"invalid JSON ({exc.msg})")]) from None
    if not isinstance(table, dict):
        raise DatasetErrors([DatasetError(name, 1, None, "expected one JSON object of parallel lists")])

    def line_of(key: str) -> int:
        match = re.search(rf'"{re.escape(key)}"\s*:', text)
        return _line_of_offset(text, match.start()) if match else 1

    for key in table:
        if key not in COLUMN_KEYS:
            problems.add(line_of(key), key, f"unknown column (expected {', '.join(COLUMN_KEYS)})")
    questions = table.get("user_input")
    if not isinstance(questions, list) or not questions:
        problems.add(line_of("user_input"), "user_input", "required: a non-empty list of strings")
        raise DatasetErrors(problems.errors)
    count = len(questions)
    for key in COLUMN_KEYS[1:]:
        column = table.get(key)
        if column is None:
            continue
        if not isinstance(column, list):
            problems.add(line_of(key), key, f"expected a list, got {_type_name(column)}")
        elif len(column) != count:
            problems.add(
                line_of(key), key, f"has {len(column)} items but user_input has {count}: lists must be equally long"
            )
    problems.raise_if_any()
    cases: list[Case] = []
    for index in range(count):
        row: dict[str, Any] = {"id": f"row-{index + 1}", "question": questions[index]}
        for key in ("response", "reference"):
            if key in table:
                row[key] = table[key][index]
        if "retrieved_contexts" in table:
            row["retrieved_contexts"] = table["retrieved_contexts"][index]
        before = len(problems.errors)
        question = _text(row, "question", 0, problems, required=True)
        reference = _text(row, "reference", 0, problems, required=False) if "reference" in row else None
        recorded, fields = _recorded(row, 0, problems)
        human = _human(table["human"][index], 0, problems) if "human" in table else {}
        for position in range(before, len(problems.errors)):
            error = problems.errors[position]
            column = "user_input" if error.field == "question" else error.field or "user_input"
            if column.startswith("human."):
                column, reason = "human", f"{column[len('human.') :]}: {error.reason}"
            else:
                reason = error.reason
            problems.errors[position] = DatasetError(name, line_of(column), column, f"item {index}: {reason}")
        if len(problems.errors) != before:
            continue
        cases.append(
            Case(
                id=row["id"],
                question=question or "",
                relevant_ids=[],
                expected_facts=[],
                reference=reference,
                unanswerable=False,
                line=line_of("user_input"),
                recorded=recorded,
                recorded_fields=fields,
                human=human,
            )
        )
    problems.raise_if_any()
    return cases


def _line_of_offset(text: str, offset: int) -> int:
    return text.count("\n", 0, max(offset, 0)) + 1
