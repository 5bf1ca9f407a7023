"""Read a dataset file into :class:`~ragexp.records.Case` objects, or say exactly what is wrong.

Validation is a table (:data:`RULES`: field, type, check, words) rather than a pydantic model per
line: a 100,000-case file must load in well under a second, and each rejection must name file,
line and field. Every row goes through the same rules; the words are only built for a value that
breaks one.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import orjson

from ragexp import limits
from ragexp.datasets.fields import (
    CONVERSATION_FIELDS,
    GRADED,
    KNOWN_FIELDS,
    REQUIRED,
    RULES,
    TURN_FIELDS,
    TURN_SEPARATOR,
    Reason,
    case_id_problem,
    hop_union,
    object_problem,
    relevance_problem,
    type_name,
    unknown_field,
)
from ragexp.errors import ConfigError, DatasetError, DatasetErrors
from ragexp.escape import folded, look_alike, other_code_points
from ragexp.metrics.registry import labelled_metric
from ragexp.records import Case, Evidence, Hop, SystemOutput, graded_hash

MAX_ERRORS = 50
LABEL_FIELDS = ("id", "question", "relevant_ids", "expected_facts", "reference", "unanswerable")
OUTPUT_FIELDS = (
    "response",
    "retrieved_ids",
    "retrieved_contexts",
    "citations",
    "latency_seconds",
    "retrieved_doc_ids",
)
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

    @property
    def has_conversations(self) -> bool:
        """Some case is a turn of a conversation."""
        return any(case.conversation is not None for case in self.cases)

    @property
    def hop_count(self) -> int:
        """The most hops a case gives (0: no case is multi-hop)."""
        return max((len(case.hops) for case in self.cases), default=0)

    @property
    def has_evidence(self) -> bool:
        """Some case gives its gold as evidence anchored to documents (``relevant``)."""
        return any(case.relevant for case in self.cases)


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


def only_cases(dataset: Dataset, case_ids: Sequence[str]) -> Dataset:
    """The cases of ``dataset`` named in ``case_ids`` (``dataset.case_ids``), in the file's order,
    with the hashes of that subset; an id the file does not hold is refused. A conversation's id
    chooses all its turns; a turn is asked after the turns before it, so choosing a turn without
    one of them is refused, naming the turns missing (never asked alone, as another question)."""
    turns: dict[str, list[Case]] = {}
    for case in dataset.cases:
        if case.conversation is not None:
            turns.setdefault(case.conversation, []).append(case)
    known = {case.id for case in dataset.cases}
    unknown = [case_id for case_id in case_ids if case_id not in known and case_id not in turns]
    if unknown:
        alike = look_alike(unknown[0], [*known, *turns])
        hint = f"; it has {alike!r}, which looks the same, {other_code_points(alike, unknown[0])}" if alike else ""
        raise ConfigError(f"config: dataset.case_ids: no case {unknown[0]!r} in {dataset.path}{hint}")
    wanted = {turn.id for case_id in case_ids if case_id not in known for turn in turns[case_id]}
    wanted.update(case_id for case_id in case_ids if case_id in known)
    for case in dataset.cases:
        if case.id not in wanted or case.conversation is None:
            continue
        missing = [turn.id for turn in turns[case.conversation] if turn.turn < case.turn and turn.id not in wanted]
        if missing:
            raise ConfigError(
                f"config: dataset.case_ids: turn {case.id} follows {', '.join(missing)}, not chosen: a turn is "
                f"asked after the turns before it; choose them too, or the whole conversation "
                f"({case.conversation!r})"
            )
    cases = [case for case in dataset.cases if case.id in wanted]
    labelled = dataset_hash(cases)
    unlabelled = dataset_hash(cases, human=False) if any(case.human for case in cases) else labelled
    return dataclasses.replace(dataset, cases=cases, dataset_hash=labelled, cases_hash=unlabelled)


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
        # Validation guarantees gold on every answerable case: ids, or evidence ("relevant"),
        # which the retrieval metrics read in place of ids.
        fields.add("relevant_ids")
        if any(case.relevant for case in cases):
            fields.add("relevant")
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


def _check(row: dict[str, Any], line: int, problems: _Problems) -> bool:
    """Apply :data:`RULES` to a row, adding every problem found; True when there is none."""
    bad: set[str] = set()
    for key, value in row.items():
        rule = RULES.get(key)
        if rule is None:
            reason: Reason | None = unknown_field(key)
        elif value is None:
            continue
        else:
            reason = rule.check(value)
        if reason is not None:
            field, words = (key, reason) if isinstance(reason, str) else reason
            problems.add(line, field, words)
            bad.add(key)
    for name, required in REQUIRED:
        if row.get(name) is None:
            problems.add(line, name, required)
            bad.add(name)
    if row.get("hops") is not None and not bad & {"hops", "relevant_ids", "relevant"}:
        field, union = hop_union(row["hops"])
        given = row.get(field)
        other = "relevant" if field == "relevant_ids" else "relevant_ids"
        if row.get(other):
            form = "ids" if field == "relevant_ids" else "evidence"
            problems.add(line, other, f"the hops give their gold as {form}: give the case's so, or leave it out")
            bad.add(other)
        elif given and sorted(map(repr, given)) != sorted(map(repr, union)):
            problems.add(line, field, "differs from the union of the hops' gold (hops[].relevant): leave it out")
            bad.add(field)
        elif not given:
            row[field] = union
    if not bad & {"relevant_ids", "relevant", "unanswerable", "hops"}:
        found = relevance_problem(
            row.get("unanswerable") or False, row.get("relevant_ids") or [], row.get("relevant") or []
        )
        if found is not None:
            problems.add(line, *found)
            bad.add(found[0])
    return not bad


def _recorded(row: dict[str, Any]) -> tuple[SystemOutput | None, frozenset[str]]:
    """The recorded system output of a checked row, and which output fields it gave."""
    present = frozenset(key for key in OUTPUT_FIELDS if row.get(key) is not None)
    if not present:
        return None, _NO_FIELDS
    latency = row.get("latency_seconds")
    output = SystemOutput(
        row.get("retrieved_ids") or [],
        row.get("retrieved_contexts") or [],
        row.get("response") or "",
        list(row.get("citations") or ()),
        float(latency) if latency is not None else None,
        None,
    )
    doc_ids = row.get("retrieved_doc_ids")
    if doc_ids:
        output.doc_ids = doc_ids
    return output, present


def _scores(value: dict[str, Any] | None) -> dict[str, float]:
    """Checked human scores by canonical metric name."""
    if not value:
        return {}
    return {
        labelled_metric(name).name: float(score)  # type: ignore[union-attr]
        for name, score in value.items()
        if name != GRADED
    }


def _grading(case: Case, value: dict[str, Any] | None) -> None:
    """What the case's human scores graded: ``human.graded`` (a hash, or the output itself),
    else the case's recorded output (a replay row's labels grade the row's answer)."""
    given = value.get(GRADED) if value else None
    if isinstance(given, str):
        case.graded, case.graded_given = given, True
    elif isinstance(given, dict):
        case.graded, case.graded_given = graded_hash(given["answer"], list(given["contexts"])), True
    elif case.human and case.recorded is not None:
        case.graded = case.recorded.graded_hash()


def _case(row: dict[str, Any], line: int, problems: _Problems) -> Case | None:
    if not _check(row, line, problems):
        return None
    recorded, fields = (None, _NO_FIELDS) if row.keys() <= _NOT_OUTPUT else _recorded(row)
    draft = row.get("draft")
    evidence = row.get("relevant")
    # By position, defaults included: half the cost of keywords and default factories.
    case = Case(
        row["id"],
        row["question"],
        row.get("relevant_ids") or [],
        row.get("expected_facts") or [],
        row.get("reference"),
        row.get("unanswerable") or False,
        line,
        recorded,
        fields,
        _scores(row.get("human")),
        row.get("metadata") or {},
        draft["status"] if draft is not None else None,
    )
    if evidence:
        case.relevant = [
            Evidence(item["doc"], item.get("span") or "", item.get("start"), item.get("end")) for item in evidence
        ]
    hops = row.get("hops")
    if hops:
        case.hops = [_hop(hop) for hop in hops]
    if case.human:
        _grading(case, row.get("human"))
    return case


def _hop(hop: dict[str, Any]) -> Hop:
    relevant = hop["relevant"]
    if type(relevant[0]) is str:
        return Hop(list(relevant), [], hop.get("bridge"))
    evidence = [Evidence(item["doc"], item.get("span") or "", item.get("start"), item.get("end")) for item in relevant]
    return Hop([], evidence, hop.get("bridge"))


_NO_FIELDS: frozenset[str] = frozenset()
_NOT_OUTPUT = KNOWN_FIELDS - set(OUTPUT_FIELDS)


def _conversation(row: dict[str, Any], line: int, problems: _Problems) -> list[Case] | None:
    """The turns of a conversation row as cases (``conv-7#1``, ``conv-7#2``...), each turn checked
    by the rules of its fields; None when the row has any problem (each one added)."""
    fine = True
    for key in row:
        if key not in CONVERSATION_FIELDS:
            close = difflib.get_close_matches(key, CONVERSATION_FIELDS + TURN_FIELDS, n=1)
            where = " (a turn's field goes inside its item of turns)" if key in TURN_FIELDS else ""
            hint = f" (did you mean '{close[0]}'?)" if close and not where else ""
            problems.add(line, key, f"not a field of a conversation{where or hint}: {', '.join(CONVERSATION_FIELDS)}")
            fine = False
    conversation_id = row.get("id")
    reason = case_id_problem(conversation_id)
    if reason is not None:
        problems.add(line, "id", reason)
        fine = False
    metadata = row.get("metadata")
    if metadata is not None and object_problem(metadata) is not None:
        problems.add(line, "metadata", object_problem(metadata))  # type: ignore[arg-type]  # not None: checked
        fine = False
    turns = row.get("turns")
    if type(turns) is not list or not turns:
        got = "an empty list" if turns == [] else type_name(turns)
        problems.add(line, "turns", f"required: a non-empty list of turns ({{question, ...}}), got {got}")
        return None
    for index, turn in enumerate(turns):
        at = f"turns[{index}]"
        if type(turn) is not dict:
            problems.add(line, at, f"expected an object {{question, ...}}, got {type_name(turn)}")
            fine = False
            continue
        bad: set[str] = set()
        for key, value in turn.items():
            if key not in TURN_FIELDS:
                close = difflib.get_close_matches(key, TURN_FIELDS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                problems.add(line, f"{at}.{key}", f"not a field of a turn{hint}: {', '.join(TURN_FIELDS)}")
                bad.add(key)
                continue
            if value is None:
                continue
            found = RULES[key].check(value)
            if found is not None:
                field, words = (key, found) if isinstance(found, str) else found
                problems.add(line, f"{at}.{field}", words)
                bad.add(key)
        if turn.get("question") is None:
            problems.add(
                line, f"{at}.question", "required: every turn asks a question (a string of 1 to 1,000,000 characters)"
            )
            bad.add("question")
        if not bad & {"relevant_ids", "relevant", "unanswerable"}:
            rule = relevance_problem(
                turn.get("unanswerable") or False, turn.get("relevant_ids") or [], turn.get("relevant") or []
            )
            if rule is not None:
                problems.add(line, f"{at}.{rule[0]}", rule[1])
                bad.add(rule[0])
        if bad:
            fine = False
        elif reason is None:
            turn_id = f"{conversation_id}{TURN_SEPARATOR}{index + 1}"
            too_long = limits.problem(limits.CASE_ID, turn_id)
            if too_long is not None:
                problems.add(line, "id", f"the turn id {turn_id[:60]!r} {too_long}")
                fine = False
    if not fine:
        return None
    cases = []
    for index, turn in enumerate(turns):
        case = Case(
            f"{conversation_id}{TURN_SEPARATOR}{index + 1}",
            turn["question"],
            turn.get("relevant_ids") or [],
            turn.get("expected_facts") or [],
            turn.get("reference"),
            turn.get("unanswerable") or False,
            line,
            metadata=metadata or {},
            conversation=conversation_id,
            turn=index + 1,
        )
        evidence = turn.get("relevant")
        if evidence:
            case.relevant = [
                Evidence(item["doc"], item.get("span") or "", item.get("start"), item.get("end")) for item in evidence
            ]
        cases.append(case)
    return cases


def _parse_jsonl(name: str, data: bytes) -> list[Case]:
    """``data``: the file's bytes, known to be UTF-8, without a byte-order mark.

    Lines are parsed as bytes: orjson reads UTF-8 as it is, where a str is encoded back to UTF-8
    first, and the decoded text (twice the file's size for CJK) is never held whole. A line that
    does not parse is decoded and handled as text, so the rules for blank lines (Unicode spaces
    count) and the error words stay those of str.
    """
    problems = _Problems(name)
    cases: list[Case] = []
    first_line: dict[str, int] = {}
    seen: dict[str, str] = {}
    """An id as it looks (:func:`ragexp.escape.folded`) -> the first id that looks so."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
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
        if type(row) is not dict:
            problems.add(number, None, f"expected a JSON object, got {type_name(row)}")
            continue
        if "turns" in row:
            turns = _conversation(row, number, problems)
            if turns is None:
                continue
            conversation = turns[0].conversation
            clash = next((turn.id for turn in turns if turn.id in first_line), None)
            if conversation in first_line or clash is not None:
                # A reused conversation id clashes on its turns' ids too: the id the row gives is the one to name.
                taken = conversation if conversation in first_line else clash
                problems.add(number, "id", f"duplicate id {taken!r} (first on line {first_line[taken]})")  # type: ignore[index]
                continue
            first_line[conversation] = number  # type: ignore[index]  # checked as a string
            for turn in turns:
                first_line[turn.id] = number
            cases.extend(turns)
            continue
        case = _case(row, number, problems)
        if case is None:
            continue
        if case.id in first_line:
            problems.add(number, "id", f"duplicate id {case.id!r} (first on line {first_line[case.id]})")
            continue
        twin = seen.setdefault(folded(case.id), case.id)
        if twin != case.id:  # every table and message would show the two as one id
            seen_as = f"looks the same as the id on line {first_line[twin]} ({twin!r})"
            problems.add(number, "id", f"id {case.id!r} {seen_as} but is {other_code_points(case.id, twin)}")
            continue
        first_line[case.id] = number
        cases.append(case)
    if not cases and not problems.errors:
        problems.add(None, None, "empty file: no cases")
    problems.raise_if_any()
    return cases


_SPACE = re.compile(r"\s*")
_NOT_SPACE = re.compile(r"\S")


def _parse_columns(name: str, text: str) -> list[Case]:
    """The MindSDK/ragas layout: one object of parallel lists, checked for equal lengths; each
    item by the rule of the case field it fills."""
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
            problems.add(line_of(key), key, f"expected a list, got {type_name(column)}")
        elif len(column) != count:
            problems.add(
                line_of(key), key, f"has {len(column)} items but user_input has {count}: lists must be equally long"
            )
    problems.raise_if_any()
    columns = [(column, _COLUMN_FIELDS[column]) for column in COLUMN_KEYS if column in table]
    first = line_of("user_input")
    cases: list[Case] = []
    for index in range(count):
        row = {field: table[column][index] for column, field in columns}
        fine = True
        for column, field in columns:
            value, rule = row[field], RULES[field]
            reason = rule.check(value) if value is not None else rule.required
            if reason is None:
                continue
            fine = False
            if not isinstance(reason, str):
                sub, words = reason
                reason = f"{sub.split('.', 1)[1]}: {words}"
            problems.add(line_of(column), column, f"item {index}: {reason}")
        if not fine:
            continue
        recorded, fields = _recorded(row)
        cases.append(
            case := Case(
                id=f"row-{index + 1}",
                question=row["question"],
                relevant_ids=[],
                expected_facts=[],
                reference=row.get("reference"),
                unanswerable=False,
                line=first,
                recorded=recorded,
                recorded_fields=fields,
                human=_scores(row.get("human")),
            )
        )
        if case.human:
            _grading(case, row.get("human"))
    problems.raise_if_any()
    return cases


_COLUMN_FIELDS = {
    "user_input": "question",
    "response": "response",
    "retrieved_contexts": "retrieved_contexts",
    "reference": "reference",
    "human": "human",
}
"""The case field each column fills (and whose rule checks its items)."""


def _line_of_offset(text: str, offset: int) -> int:
    return text.count("\n", 0, max(offset, 0)) + 1
