"""Numbers from outside ragexp (a reply's token counts and stage timings, a dataset's recorded
latency) bounded before anything is written: one that cannot be recorded is an error for its
case, never a crash of the run or of its ``--resume``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp import limits
from tests.conftest import write_jsonl

DOCS = {"d1": "Refunds arrive within 3 business days.", "d2": "Overseas shipping takes 5 days."}

TARGET = """
import json
import sqlite3

def answer(question, case_id):
    extra = json.loads(question.split("|", 1)[1]) if "|" in question else {}
    reply = {
        "ranked_ids": ["d1", "d2"],
        "contexts": ["Refunds arrive within 3 business days.", "Overseas shipping takes 5 days."],
        "answer": "Refunds arrive within 3 business days.",
        "usage": {"p": 10, "c": 5},
        "timings": {"retrieve": 0.01},
    }
    for key, value in extra.items():
        where, _, field = key.partition(".")
        reply[where][field] = value
    return reply
"""
MAPPING = (
    "provider.system.response={answer: answer, ranked_ids: ranked_ids, contexts: contexts, "
    "timings: timings, prompt_tokens: usage.p, completion_tokens: usage.c}"
)


def case(case_id: str, extra: str = "") -> dict[str, Any]:
    question = "when do refunds arrive" + (f"|{extra}" if extra else "")
    return {"id": case_id, "question": question, "relevant_ids": ["d1"], "expected_facts": ["3 business days"]}


def run(ragexp: Any, tmp_path: Path, rows: list[dict[str, Any]], *more: str) -> Any:
    (tmp_path / "numbers_target.py").write_text(TARGET)
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    return ragexp(
        "run",
        "system=python",
        "provider.system.target=numbers_target:answer",
        f"provider.system.path={tmp_path}",
        MAPPING,
        f"dataset.path={data}",
        "metrics.names=[recall_at_k,answer_accuracy,p95_seconds,error_rate]",
        "k=2",
        *more,
        "--json",
    )


def errors_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, str | None]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row["error"] for row in map(json.loads, Path(path).read_text().splitlines())}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ('{"usage.p": 1e300}', "prompt_tokens"),
        ('{"usage.c": 18446744073709551616}', "completion_tokens"),
        ('{"usage.p": 100000000000000000000000000000000000000000}', "prompt_tokens"),
        ('{"usage.p": -3}', "prompt_tokens"),
        ('{"usage.c": 2.5}', "completion_tokens"),
    ],
)
def test_a_token_count_that_cannot_be_recorded_is_an_error_for_its_case(
    ragexp: Any, store_uri: str, tmp_path: Path, extra: str, said: str
) -> None:
    result = run(ragexp, tmp_path, [case("good"), case("bad", extra)])
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1
    errors = errors_of(store_uri, payload["run_id"], tmp_path)
    assert errors["good"] is None
    assert errors["bad"] is not None and said in errors["bad"]
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert metrics["system.prompt_tokens"] == 10 and metrics["system.usage_cases"] == 1


@pytest.mark.parametrize("seconds", ["1.7e12", "1e300", "2e6"])
def test_a_stage_timing_that_cannot_be_recorded_is_an_error_for_its_case_and_traces_are_written(
    ragexp: Any, store_uri: str, tmp_path: Path, seconds: str
) -> None:
    result = run(ragexp, tmp_path, [case("good"), case("bad", f'{{"timings.model": {seconds}}}')])
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1
    errors = errors_of(store_uri, payload["run_id"], tmp_path)
    assert errors["good"] is None
    assert errors["bad"] is not None and "'model' is" in errors["bad"] and "1e+06 s" in errors["bad"]
    run_info = MlflowClient(store_uri).get_run(payload["run_id"])
    assert run_info.data.tags["ragexp.status"] == "finished"
    assert run_info.data.tags["ragexp.traces.count"] == "2"


def test_a_recorded_latency_past_the_bound_is_refused_with_its_line(ragexp: Any, tmp_path: Path) -> None:
    row = {**case("r1"), "response": "Refunds arrive within 3 business days.", "retrieved_ids": ["d1"]}
    data = write_jsonl(tmp_path / "cases.jsonl", [{**row, "latency_seconds": 1.7e12}])
    result = ragexp("run", "provider=replay", f"dataset.path={data}", "metrics=offline")
    assert result.code == 1
    assert "cases.jsonl:1:" in result.stderr and "latency_seconds" in result.stderr and "1e+06 s" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_last_check_before_writing_catches_what_a_reader_let_through() -> None:
    from ragexp.records import CaseResult, SystemOutput
    from ragexp.workflows.run import recordable

    huge = CaseResult("c1", SystemOutput(answer="a", tokens={"prompt": 2**64}))
    checked = recordable(huge)
    assert checked.output is None and checked.error is not None and "tokens.prompt" in checked.error
    slow = CaseResult("c2", SystemOutput(answer="a", timings={"model": 1.7e12}, latency_seconds=0.5))
    assert "timings['model']" in (recordable(slow).error or "")
    fine = CaseResult("c3", SystemOutput(answer="a", tokens={"prompt": 3}, latency_seconds=limits.MAX_SECONDS))
    assert recordable(fine) is fine


def test_resume_of_a_run_whose_checkpoint_holds_an_unrecordable_timing_finishes(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # An older ragexp checkpointed the huge timing, then failed at trace logging: the resumed run
    # makes that case an error and finishes.
    first = run(ragexp, tmp_path, [case("good"), case("other")])
    assert first.code == 0
    db = Path(store_uri.removeprefix("sqlite:///"))
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TRIGGER ragexp_test_fault BEFORE INSERT ON assessments "
            "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END;"
        )
    broken = run(ragexp, tmp_path, [case("good"), case("other")], "experiment=second")
    assert broken.code == 1
    checkpoints = list((db.parent / "checkpoints").glob("*.jsonl"))
    assert len(checkpoints) == 1
    rows = [json.loads(line) for line in checkpoints[0].read_text().splitlines()]
    for row in rows:
        if row["id"] == "other":
            row["output"]["timings"] = {"model": 1.7e12}
            row["output"]["tokens"] = {"prompt": 10, "completion": 5}
    checkpoints[0].write_text("".join(json.dumps(row) + "\n" for row in rows))
    with sqlite3.connect(db) as con:
        con.execute("DROP TRIGGER ragexp_test_fault")
    resumed = run(ragexp, tmp_path, [case("good"), case("other")], "experiment=second", "--resume", checkpoints[0].stem)
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["error_count"] == 1
    errors = errors_of(store_uri, checkpoints[0].stem, tmp_path)
    assert errors["good"] is None and "timings['model']" in (errors["other"] or "")


def test_a_targets_exception_message_is_stored_cut_and_run_json_prints_a_run_whose_every_case_errored(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    (tmp_path / "loud_target_46b.py").write_text(
        "def answer(question):\n    raise ValueError('the index is gone ' + 'x' * 200_000)\n"
    )
    data = write_jsonl(tmp_path / "cases.jsonl", [case("c1")])
    result = ragexp(
        "run",
        "system=python",
        "provider.system.target=loud_target_46b:answer",
        f"provider.system.path={tmp_path}",
        f"dataset.path={data}",
        "metrics.names=[recall_at_k]",
        "--json",
    )
    # Every case errored: exit 1 with one line, and --json still prints the logged run.
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "every case errored" in result.stderr and len(result.stderr) < 2 * limits.CASE_ERROR.chars
    payload = result.json()
    assert payload["status"] == "failed" and payload["error_count"] == payload["case_count"] == 1
    error = errors_of(store_uri, payload["run_id"], tmp_path)["c1"]
    assert error is not None and error.startswith("ValueError: the index is gone xxx")
    assert len(error) == limits.CASE_ERROR.chars and error.endswith("…")
