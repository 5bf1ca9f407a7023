"""The quick paths of `ragexp run` give exactly what the general ones give.

``provider=fake`` builds its outputs from the labels; ``provider=replay`` reads the same outputs
recorded in the file: the same per-case scores, summary and dataset hash. The loader builds from
every valid row the case the dataset format describes, and refuses every other row naming its line
and field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from mlflow.tracking import MlflowClient

from ragexp.artifacts import error_text, write_cases
from ragexp.config.compose import compose
from ragexp.datasets.audit import shares_ids
from ragexp.datasets.ledger import case_hashes
from ragexp.datasets.loader import LABEL_FIELDS as LABEL_KEYS
from ragexp.datasets.loader import OUTPUT_FIELDS, dataset_hash, load_dataset
from ragexp.errors import DatasetErrors
from ragexp.providers.base import RunSettings
from ragexp.providers.fake import FakeProvider
from ragexp.records import Case, CaseResult, SystemOutput
from tests.conftest import write_jsonl

K = 3


def label_rows() -> list[dict[str, Any]]:
    """Varied label-only cases: repeated ids, more ids than K, full-width facts, refusals."""
    rows: list[dict[str, Any]] = []
    for i in range(60):
        if i % 7 == 3:
            rows.append({"id": f"u{i}", "question": f"第 {i} 题答不了？", "unanswerable": True})
            continue
        # Up to five relevant ids against K=3, some repeated: recall and nDCG below 1 for some.
        relevant = [f"doc-{i}-{j}" for j in range(1 + i % 5)] + ([f"doc-{i}-0"] if i % 2 else [])
        row: dict[str, Any] = {"id": f"c{i}", "question": f"问题 {i}", "relevant_ids": relevant}
        row["expected_facts"] = [f"事实{i}", "ＡＢＣ１" if i % 2 else "abc1"]
        if i % 5 == 0:
            row["reference"] = f"参考 {i}"
        rows.append(row)
    return rows


def artifact(client: MlflowClient, run_id: str, path: str, tmp: Path) -> Any:
    text = Path(client.download_artifacts(run_id, path, str(tmp))).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()] if path.endswith(".jsonl") else json.loads(text)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.differential
def test_fake_run_equals_replay_of_the_same_outputs(ragexp, store_uri: str, tmp_path: Path) -> None:
    labels = write_jsonl(tmp_path / "labels.jsonl", label_rows())
    # The replay file records exactly what the fake provider returns for these cases.
    config = compose([f"dataset.path={labels}", "provider=fake", f"k={K}"])
    dataset = load_dataset(labels)
    results: list[CaseResult] = []
    provider = FakeProvider(config.provider.system, RunSettings(K, 1, config.dataset))
    provider.run(dataset.cases, lambda _, result: results.append(result))
    recorded = []
    for row, result in zip(label_rows(), results, strict=True):
        output = result.output
        assert output is not None
        recorded.append(
            {
                **row,
                "response": output.answer,
                "retrieved_ids": output.ranked_ids,
                "retrieved_contexts": output.contexts,
                "citations": output.citations,
                "latency_seconds": 0.0,
            }
        )
    replay = write_jsonl(tmp_path / "recorded.jsonl", recorded)

    fake_run = ragexp("run", f"dataset.path={labels}", "provider=fake", f"k={K}", "--json")
    replay_run = ragexp("run", f"dataset.path={replay}", "provider=replay", f"k={K}", "--json")
    assert fake_run.code == 0, fake_run.stderr
    assert replay_run.code == 0, replay_run.stderr
    fake, replayed = fake_run.json(), replay_run.json()
    assert fake["dataset_hash"] == replayed["dataset_hash"] == dataset.dataset_hash
    assert fake["case_count"] == replayed["case_count"] == 60 and fake["error_count"] == replayed["error_count"] == 0

    def without_latency(summary: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in summary.items() if name != "p95_seconds"}

    assert without_latency(fake["summary"]) == without_latency(replayed["summary"])
    # Not a trivial set: more relevant ids than K leave some scores short of 1.
    assert 0 < fake["summary"]["recall_at_k"] < 1 and fake["summary"]["answer_accuracy"] == 1.0

    client = MlflowClient(store_uri)
    fake_dir, replay_dir = tmp_path / "fake", tmp_path / "replay"
    fake_scores = artifact(client, fake["run_id"], "scores.json", fake_dir)
    replay_scores = artifact(client, replayed["run_id"], "scores.json", replay_dir)
    assert fake_scores["metrics"] == replay_scores["metrics"]
    assert fake_scores["case_ids"] == replay_scores["case_ids"] == [row["id"] for row in label_rows()]
    fake_cases = artifact(client, fake["run_id"], "cases.jsonl", fake_dir)
    replay_cases = artifact(client, replayed["run_id"], "cases.jsonl", replay_dir)
    for ours, theirs in zip(fake_cases, replay_cases, strict=True):
        ours.pop("latency_seconds"), theirs.pop("latency_seconds")
        assert ours == theirs


VALID = [
    {"id": "a", "question": "q", "relevant_ids": ["x", "x", "y"]},
    {"id": "b", "question": "q", "relevant_ids": ["x"], "expected_facts": ["f", "ｇ"], "reference": "r"},
    {"id": "c", "question": "q", "unanswerable": True},
    {"id": "d", "question": "q", "unanswerable": False, "relevant_ids": ["x"], "expected_facts": []},
    {"id": "e", "question": "q", "unanswerable": True, "relevant_ids": [], "reference": "r"},
    {"id": "f", "question": "q", "relevant_ids": ["x"], "metadata": {"any": ["thing"]}},
    {
        "id": "g",
        "question": "q",
        "relevant_ids": ["x"],
        "response": "",
        "retrieved_ids": ["x", "x", "y"],
        "retrieved_contexts": ["", "c"],
        "citations": [1, 9],
        "latency_seconds": 0,
    },
    {"id": "h", "question": "q", "unanswerable": True, "response": "无法回答", "latency_seconds": 0.25},
    {"id": "i", "question": "q", "unanswerable": True, "retrieved_ids": [], "citations": []},
    {"id": "j", "question": "q", "relevant_ids": ["x"], "retrieved_contexts": ["c"], "metadata": None},
]
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"id": "a", "question": "q", "relevant_ids": ["x", ""]}, "relevant_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x", "\u3000"]}, "relevant_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x", 3]}, "relevant_ids"),
    ({"id": "a", "question": "q", "relevant_ids": "x"}, "relevant_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "expected_facts": [" "]}, "expected_facts"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "expected_facts": ["f" * 1_000_001]}, "expected_facts"),
    ({"id": "a", "question": " ", "relevant_ids": ["x"]}, "question"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "reference": ""}, "reference"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "unanswerable": 1}, "unanswerable"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "unanswerable": True}, "relevant_ids"),
    ({"id": "a", "question": "q"}, "relevant_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "response": 3}, "response"),
    (
        {"id": "a", "question": "q", "relevant_ids": ["x"], "response": "r", "retrieved_ids": ["x", " "]},
        "retrieved_ids",
    ),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_ids": [1]}, "retrieved_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_contexts": "c"}, "retrieved_contexts"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_contexts": [None]}, "retrieved_contexts"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "citations": [0]}, "citations"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "citations": [True]}, "citations"),
    # Not a list: refused like any wrong type (a falsy one was once read as no citations).
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "citations": 0}, "citations"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "citations": ""}, "citations"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": -1}, "latency_seconds"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": False}, "latency_seconds"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": "1"}, "latency_seconds"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "human": {"answer_accuracy": 1.5}}, "human.answer_accuracy"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "relevnt_ids": ["x"]}, "relevnt_ids"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "metadata": []}, "metadata"),
    ({"id": "a", "question": "q", "relevant_ids": ["x"], "draft": {"status": "ok"}}, "draft.status"),
    ({"id": "a\x1b[2J", "question": "q", "relevant_ids": ["x"]}, "id"),
    ({"id": "a", "relevant_ids": ["x"]}, "question"),
    ({"id": None, "question": "q", "relevant_ids": ["x"]}, "id"),
]
"""Rows the loader refuses, and the field it names."""


def expected_case(row: dict[str, Any], line: int) -> Case:
    """The case docs/datasets.md describes for a valid row: a null field is an absent one, and
    the recorded output holds the output fields the row gives (defaults for the others)."""
    given = {key: value for key, value in row.items() if value is not None}
    outputs = {key: given[key] for key in OUTPUT_FIELDS if key in given}
    recorded = None
    if outputs:
        latency = outputs.get("latency_seconds")
        recorded = SystemOutput(
            ranked_ids=outputs.get("retrieved_ids", []),
            contexts=outputs.get("retrieved_contexts", []),
            answer=outputs.get("response", ""),
            citations=outputs.get("citations", []),
            latency_seconds=None if latency is None else float(latency),
        )
    return Case(
        id=given["id"],
        question=given["question"],
        relevant_ids=given.get("relevant_ids", []),
        expected_facts=given.get("expected_facts", []),
        reference=given.get("reference"),
        unanswerable=given.get("unanswerable", False),
        line=line,
        recorded=recorded,
        recorded_fields=frozenset(outputs),
        human={},
        metadata=given.get("metadata", {}),
    )


def refusal(path: Path) -> list[tuple[int | None, str | None]]:
    """Where the loader refuses ``path``: (line, field) of every problem."""
    with pytest.raises(DatasetErrors) as caught:
        load_dataset(path)
    return [(error.line, error.field) for error in caught.value.errors]


NULL_IS_ABSENT = [
    {"id": "n1", "question": "q", "relevant_ids": ["x"], "response": None, "reference": None},
    {"id": "n2", "question": "q", "unanswerable": True, "relevant_ids": None, "citations": None, "human": None},
    {"id": "n3", "question": "q", "relevant_ids": ["x"], "unanswerable": None, "draft": None, "latency_seconds": None},
]


@pytest.mark.parametrize("row", VALID + NULL_IS_ABSENT)
def test_a_valid_row_loads_as_the_case_the_format_describes(row: dict[str, Any], tmp_path: Path) -> None:
    # Second in its file, so its line number is checked too.
    first = {"id": "first", "question": "q", "unanswerable": True}
    dataset = load_dataset(write_jsonl(tmp_path / "d.jsonl", [first, row]))
    assert dataset.cases == [expected_case(first, 1), expected_case(row, 2)]


@pytest.mark.parametrize(("row", "field"), REFUSED, ids=range(len(REFUSED)))
def test_every_other_row_is_refused_naming_its_line_and_field(row: dict[str, Any], field: str, tmp_path: Path) -> None:
    good = {"id": "good", "question": "q", "relevant_ids": ["x"]}
    assert refusal(write_jsonl(tmp_path / "d.jsonl", [good, good | {"id": "good2"}, row])) == [(3, field)]


def test_cases_hash_is_the_hash_without_human_scores(tmp_path: Path) -> None:
    rows = [{"id": "a", "question": "q", "relevant_ids": ["x"]}, {"id": "b", "question": "q", "unanswerable": True}]
    plain = load_dataset(write_jsonl(tmp_path / "plain.jsonl", rows))
    assert plain.cases_hash == plain.dataset_hash == dataset_hash(plain.cases, human=False)
    rows[0]["human"] = {"answer_accuracy": 1}
    labelled = load_dataset(write_jsonl(tmp_path / "human.jsonl", rows))
    assert labelled.cases_hash == plain.cases_hash == dataset_hash(labelled.cases, human=False)
    assert labelled.dataset_hash != plain.dataset_hash


def test_format_detection(tmp_path: Path) -> None:
    # JSON Lines whose first line is a whole object (even one with a user_input key) stay JSON Lines.
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(
        '{"id": "a", "question": "q", "relevant_ids": ["x"]}\n{"id": "b", "question": "q", "unanswerable": true}\n'
    )
    assert load_dataset(jsonl).format == "jsonl"
    columns = {"user_input": ["q1", "q2"], "response": ["a", "b"]}
    one_line, pretty = tmp_path / "one.json", tmp_path / "pretty.json"
    one_line.write_text(json.dumps(columns) + "\n\n")
    pretty.write_text(json.dumps(columns, indent=2))
    assert load_dataset(one_line).format == load_dataset(pretty).format == "columns"
    assert [case.question for case in load_dataset(pretty).cases] == ["q1", "q2"]


LABEL_ONLY = [row for row in VALID if row.keys() <= {*LABEL_KEYS, "metadata"}]


def jsonl_lines(rows: list[dict[str, Any]], *, blank_every: int = 0, newline: str = "\n") -> list[bytes]:
    """A JSON Lines file's lines as the loader splits them, with blank lines sprinkled in."""
    text = ""
    for number, row in enumerate(rows, start=1):
        text += json.dumps(row, ensure_ascii=False) + newline
        if blank_every and number % blank_every == 0:
            text += " \t" + newline
    return text.encode("utf-8").split(b"\n")


def many_rows(count: int) -> list[dict[str, Any]]:
    """``count`` varied label rows with unique ids."""
    return [{**row, "id": f"{row['id']}-{n}"} for n in range(count // 60 + 1) for row in label_rows()][:count]


@pytest.mark.parametrize(
    ("rows", "blank_every", "newline"),
    [(label_rows(), 0, "\n"), (LABEL_ONLY, 0, "\n"), (label_rows(), 0, "\r\n"), (many_rows(4101), 7, "\n")],
    ids=["labels", "valid-rows", "crlf", "blank-lines"],
)
def test_a_large_file_loads_every_case_at_its_line(
    rows: list[dict[str, Any]], blank_every: int, newline: str, tmp_path: Path
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(jsonl_lines(rows, blank_every=blank_every, newline=newline)))
    cases = load_dataset(path).cases
    lines = [n for n, line in enumerate(path.read_bytes().split(b"\n"), start=1) if line.strip()]
    assert cases == [expected_case(row, line) for row, line in zip(rows, lines, strict=True)]
    # Each case owns its human-score dict.
    assert len({id(case.human) for case in cases}) == len(cases)


# The last: an id an early row already holds.
ODD_ROWS = [*REFUSED, ({"id": "c5-0", "question": "q", "relevant_ids": ["x"]}, "id")]


@pytest.mark.parametrize(("odd", "field"), ODD_ROWS, ids=range(len(ODD_ROWS)))
def test_one_odd_row_deep_in_a_large_file_is_the_one_refused(odd: dict[str, Any], field: str, tmp_path: Path) -> None:
    rows = many_rows(2100)
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(jsonl_lines([*rows[:2050], odd, *rows[2050:]])))
    assert refusal(path) == [(2051, field)]


@pytest.mark.parametrize(
    ("odd_line", "refused"),
    [
        ("{", True),
        ("[1]", True),
        ("\u3000", False),
        ("\x1c", False),
        ('{"id": "z", "question": "q", "unanswerable": true} x', True),
    ],
    ids=["bad-json", "array", "ideographic-space", "file-separator", "trailing-text"],
)
def test_an_odd_line_is_refused_or_blank(odd_line: str, refused: bool, tmp_path: Path) -> None:
    lines = jsonl_lines(label_rows())
    lines.insert(5, odd_line.encode("utf-8"))
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines))
    if refused:
        assert refusal(path) == [(6, None)]
    else:
        # Blank to str.strip, as every line's blankness is judged: skipped, the lines after it shift.
        cases = load_dataset(path).cases
        assert len(cases) == len(label_rows()) and cases[5].line == 7


def test_bom_and_crlf_files_load_the_same_cases(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "plain.jsonl", label_rows())
    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    # A line of ideographic spaces is blank to str.strip (the rule for every file): skipped.
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_bytes(plain.read_bytes().replace(b"\n", "\n\u3000\n".encode(), 1))
    a, b, c = load_dataset(plain), load_dataset(windows), load_dataset(spaced)
    assert a.cases == b.cases and a.dataset_hash == b.dataset_hash == c.dataset_hash
    assert [case.line for case in c.cases][:3] == [1, 3, 4]
    assert {case.id: case.question for case in c.cases} == {case.id: case.question for case in a.cases}


# Counts around the hash's chunk of 4,096 cases: the digest must not depend on how it is fed.
@pytest.mark.parametrize("count", [0, 1, 4096, 4097, 8195])
def test_dataset_hash_is_the_hash_of_the_sorted_labels(count: int) -> None:
    cases = [
        Case(f"c{n % 97}-{n}", f"问题 {n}", [f"d{n}"], ["事实"] if n % 2 else [], None, False, n + 1)
        for n in range(count)
    ]
    for n, case in enumerate(cases):
        if n % 5 == 0:
            case.human = {"faithfulness": 0.5, "answer_accuracy": 1.0}
    for human in (True, False):
        labels = sorted((case.labels(human=human) for case in cases), key=lambda item: item["id"])
        plain = hashlib.sha256(orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)).hexdigest()
        assert dataset_hash(cases, human=human) == plain


def test_cases_jsonl_rows_hold_every_field(tmp_path: Path) -> None:
    cases = [Case(f"c{n}", f"q{n}", ["x"], [], None, n == 2, n + 1) for n in range(2051)]
    results = []
    for n, case in enumerate(cases):
        output = SystemOutput(["x"], ["c"], f"a{n}", [1], 0.5, {"model": 0.1} if n % 3 == 0 else None)
        if n % 4 == 1:
            results.append(CaseResult(case.id, None, "HTTP 500", {}, True))
        elif n % 4 == 2:
            results.append(CaseResult(case.id, output, None, {"faithfulness": "judge timed out"}))
        else:
            results.append(CaseResult(case.id, output))
    size = len(cases)
    columns = {"recall_at_k": [float(n % 2) for n in range(size)], "mrr": [None] * size}
    latency: list[float | None] = [None if n % 4 == 1 else 0.5 for n in range(size)]
    spread = {"faithfulness": [0.1 * (n % 3) for n in range(size)]}
    for given_columns, given_spread in ((columns, spread), ({}, {})):
        path = tmp_path / "cases.jsonl"
        write_cases(path, cases, results, given_columns, latency, given_spread)
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert len(rows) == size
        hashes = case_hashes(cases)
        assert len({found["case"] for found in hashes.values()}) == size  # every question differs
        for n, (case, result, row) in enumerate(zip(cases, results, rows, strict=True)):
            expected: dict[str, Any] = {
                "id": case.id,
                "question": case.question,
                "unanswerable": case.unanswerable,
                "metrics": {name: values[n] for name, values in given_columns.items()},
                "error": error_text(result),
                "output": result.output.to_json() if result.output is not None else None,
                "latency_seconds": latency[n],
                "content_hash": hashes[case.id],
            }
            if result.metric_errors:
                expected["metric_errors"] = result.metric_errors
            if given_spread:
                expected["spread"] = {name: values[n] for name, values in given_spread.items()}
            assert list(row) == list(expected) and row == expected
    with pytest.raises(ValueError):
        write_cases(tmp_path / "short.jsonl", cases, results[:-1], columns, latency, spread)


def test_a_corpus_shares_ids_with_a_dataset_if_any_relevant_id_is_in_it(tmp_path: Path) -> None:
    rows = many_rows(300)
    dataset = load_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    last_id = next(row["relevant_ids"][-1] for row in reversed(rows) if row.get("relevant_ids"))
    assert not shares_ids(dataset, {"elsewhere": "text"})
    assert shares_ids(dataset, {"elsewhere": "text", last_id: "text"})
    unanswerable = [row for row in rows if row.get("unanswerable")]
    # No relevant ids at all: nothing says the corpus belongs to another set.
    assert shares_ids(load_dataset(write_jsonl(tmp_path / "u.jsonl", unanswerable)), {"elsewhere": "text"})
