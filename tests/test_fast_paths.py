"""The quick paths of `ragexp run` give exactly what the general ones give.

``provider=fake`` builds its outputs from the labels; ``provider=replay`` reads the same outputs
recorded in the file: the same per-case scores, summary and dataset hash. The loader's quick check
of common rows builds the very case its full validation builds, and leaves every other row to it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from mlflow.tracking import MlflowClient

from ragexp.config.compose import compose
from ragexp.datasets.audit import shares_ids
from ragexp.datasets.loader import (
    _CHUNK,
    _HASH_CHUNK,
    _case_from_row,
    _fast_case,
    _label_columns,
    _parse_rows,
    _Problems,
    dataset_hash,
    load_dataset,
)
from ragexp.datasets.loader import (
    LABEL_FIELDS as LABEL_KEYS,
)
from ragexp.providers.base import RunSettings
from ragexp.providers.fake import FakeProvider
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.tracking.artifacts import error_text, write_cases
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
GENERAL_ONLY = [
    {"id": "a", "question": "q", "relevant_ids": ["x", ""]},
    {"id": "a", "question": "q", "relevant_ids": ["x", "\u3000"]},
    {"id": "a", "question": "q", "relevant_ids": ["x", 3]},
    {"id": "a", "question": "q", "relevant_ids": "x"},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "expected_facts": [" "]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "expected_facts": ["f" * 1_000_001]},
    {"id": "a", "question": " ", "relevant_ids": ["x"]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "reference": ""},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "unanswerable": 1},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "unanswerable": True},
    {"id": "a", "question": "q"},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "response": 3},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "response": None},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "response": "r", "retrieved_ids": ["x", " "]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_ids": [1]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_contexts": "c"},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "retrieved_contexts": [None]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "citations": [0]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "citations": [True]},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "citations": 0},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": -1},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": False},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "latency_seconds": "1"},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "human": {"answer_accuracy": 1}},
    {"id": "a", "question": "q", "relevant_ids": ["x"], "relevnt_ids": ["x"]},
]


@pytest.mark.parametrize("row", VALID)
def test_quick_check_builds_the_case_the_full_validation_builds(row: dict[str, Any]) -> None:
    problems = _Problems("d.jsonl")
    assert _fast_case(row, 7) == _case_from_row(row, 7, problems)
    assert problems.errors == []


@pytest.mark.parametrize("row", GENERAL_ONLY)
def test_quick_check_leaves_everything_else_to_the_full_validation(row: dict[str, Any]) -> None:
    assert _fast_case(row, 7) is None
    # ... which rejects it, or (the quirks it accepts: `citations: 0`) builds a case of its own.
    problems = _Problems("d.jsonl")
    case = _case_from_row(row, 7, problems)
    assert (case is None) == bool(problems.errors)


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
    """More rows than the column check takes at once, from the varied label rows."""
    return [{**row, "id": f"{row['id']}-{n}"} for n in range(count // 60 + 1) for row in label_rows()][:count]


@pytest.mark.parametrize(
    "lines",
    [
        jsonl_lines(label_rows()),
        jsonl_lines([*LABEL_ONLY, {"id": "n", "question": "q", "relevant_ids": ["x"], "reference": None}]),
        jsonl_lines(label_rows(), newline="\r\n"),
        # Blank lines shift line numbers across the chunks the column check takes.
        jsonl_lines(many_rows(2 * _CHUNK + 5), blank_every=7),
    ],
    ids=["labels", "valid-rows", "crlf", "chunks"],
)
def test_column_check_builds_the_cases_the_row_path_builds(lines: list[bytes]) -> None:
    cases = _label_columns(lines)
    assert cases is not None
    assert cases == _parse_rows("d.jsonl", lines)
    # Each case owns its human-score dict, as the row path gives it.
    assert len({id(case.human) for case in cases}) == len(cases)


# The last: an id the first chunk already holds.
ODD_ROWS = [
    *(row for row in VALID if row not in LABEL_ONLY),
    *GENERAL_ONLY,
    {"id": "c5-0", "question": "q", "relevant_ids": ["x"]},
]


@pytest.mark.parametrize("odd", ODD_ROWS, ids=range(len(ODD_ROWS)))
def test_column_check_leaves_every_other_file_to_the_row_path(odd: dict[str, Any]) -> None:
    # The odd row sits in a later chunk: what the first chunks built is dropped, not kept.
    rows = many_rows(_CHUNK + 100)
    lines = jsonl_lines([*rows[: _CHUNK + 50], odd, *rows[_CHUNK + 50 :]])
    assert _label_columns(lines) is None


@pytest.mark.parametrize(
    "odd_line",
    ["{", "[1]", "\u3000", "\x1c", '{"id": "z", "question": "q", "unanswerable": true} x'],
    ids=["bad-json", "array", "ideographic-space", "file-separator", "trailing-text"],
)
def test_column_check_leaves_odd_lines_to_the_row_path(odd_line: str) -> None:
    lines = jsonl_lines(label_rows())
    lines.insert(5, odd_line.encode("utf-8"))
    assert _label_columns(lines) is None


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


@pytest.mark.parametrize("count", [0, 1, _HASH_CHUNK, _HASH_CHUNK + 1, 2 * _HASH_CHUNK + 3])
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
    cases = [Case(f"c{n}", f"q{n}", ["x"], [], None, n == 2, n + 1) for n in range(_CHUNK + 3)]
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
        for n, (case, result, row) in enumerate(zip(cases, results, rows, strict=True)):
            expected: dict[str, Any] = {
                "id": case.id,
                "question": case.question,
                "unanswerable": case.unanswerable,
                "metrics": {name: values[n] for name, values in given_columns.items()},
                "error": error_text(result),
                "output": result.output.to_json() if result.output is not None else None,
                "latency_seconds": latency[n],
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
