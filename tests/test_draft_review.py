"""Screening drafted cases in an MLflow review queue: ``ragexp draft review`` then ``ragexp draft accept``.

Reviewer answers are written as the Review page writes them: HUMAN-source feedback on the trace,
named after the label schema (``mlflow.log_feedback``), as tests/test_label_queue.py does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import AssessmentSource
from mlflow.genai import label_schemas, review_queues

from ragexp.draft.review import KEEP, PROBLEM
from tests.conftest import write_jsonl
from tests.test_draft import KB_ZH, OFFLINE, drafter, drafter_args, read_cases  # noqa: F401  (drafter: fixture)


@pytest.fixture(autouse=True)
def tracking_uri_restored() -> Iterator[None]:
    """The helpers below use MLflow's fluent API, which keeps the URI globally: put it back."""
    environ = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    mlflow.set_tracking_uri(None)
    if environ is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = environ


def queued_cases(uri: str, queue_id: str) -> dict[str, str]:
    """Case id -> trace id of every item of the queue."""
    mlflow.set_tracking_uri(uri)
    ids, token = [], None
    while True:
        page = review_queues.list_review_queue_items(queue_id, max_results=100, page_token=token)
        ids += [item.item_id for item in page]
        token = page.token
        if not token or not page:
            break
    client = MlflowClient(uri)
    return {client.get_trace(tid).info.trace_metadata["ragexp.case_id"]: tid for tid in ids}


def answer(uri: str, trace_id: str, name: str, value: Any, who: str) -> None:
    mlflow.set_tracking_uri(uri)
    mlflow.log_feedback(
        trace_id=trace_id, name=name, value=value, source=AssessmentSource(source_type="HUMAN", source_id=who)
    )


def draft_file(ragexp: Any, drafter: str, tmp_path: Path) -> Path:  # noqa: F811
    out = tmp_path / "draft.jsonl"
    made = ragexp("draft", "--corpus", str(KB_ZH), "--out", str(out), "--n", "26", *drafter_args(drafter))
    assert made.code == 0, made.stderr
    return out


def review_and_accept(ragexp: Any, uri: str, draft: Path, tmp_path: Path) -> None:
    cases = read_cases(draft)
    corpus = {row["id"]: row["text"] for row in map(json.loads, KB_ZH.read_text("utf-8").splitlines())}
    made = ragexp("draft", "review", str(draft), "--corpus", str(KB_ZH), "--json")
    assert made.code == 0, made.stderr
    queue = made.json()
    assert (queue["traces"], queue["passed_through"], queue["language"]) == (len(cases), 0, "zh")
    assert queue["experiment_id"] == MlflowClient(uri).get_experiment_by_name("ragexp-draft-review").experiment_id

    by_case = queued_cases(uri, queue["queue_id"])
    assert set(by_case) == {case["id"] for case in cases}
    # Each trace shows the case: question, source chunk text(s), facts, reference, kind.
    client = MlflowClient(uri)
    for case in cases:
        trace = client.get_trace(by_case[case["id"]])
        root = trace.data.spans[0]
        assert root.inputs["question"] == case["question"]
        retrieved = next(span for span in trace.data.spans if span.span_type == "RETRIEVER").outputs
        assert [doc["id"] for doc in retrieved] == case["draft"]["source_ids"]
        assert [doc["page_content"] for doc in retrieved] == [corpus[i] for i in case["draft"]["source_ids"]]
        expected = {a.name: a.value for a in trace.info.assessments if a.expectation is not None}
        assert expected["draft_kind"] == case["draft"]["kind"]
        assert expected.get("expected_facts") == (case.get("expected_facts") or None)
    # Two questions in the draft's language: keep (pass/fail), what is wrong (free text).
    mlflow.set_tracking_uri(uri)
    keep = label_schemas.get_label_schema(KEEP, experiment_id=queue["experiment_id"])
    assert isinstance(keep.input, label_schemas.InputPassFail) and keep.input.positive_label == "通过"
    problem = label_schemas.get_label_schema(PROBLEM, experiment_id=queue["experiment_id"])
    assert isinstance(problem.input, label_schemas.InputText) and "问题" in problem.instruction
    text = ragexp("draft", "review", str(draft), "--corpus", str(KB_ZH))
    assert text.code == 0 and "review-queue?selectedQueueId=" in text.stdout and "ragexp draft accept" in text.stdout

    # Reviewers: bob keeps the first half, carol rejects three with a reason, one answer is changed
    # (newest wins), the last two cases are not reviewed yet.
    ids = [case["id"] for case in cases]
    kept, rejected, pending = ids[: len(ids) - 5], ids[-5:-2], ids[-2:]
    for case in kept:
        answer(uri, by_case[case], KEEP, True, "bob")
    for case in rejected:
        answer(uri, by_case[case], KEEP, True, "bob")
        time.sleep(0.01)
        answer(uri, by_case[case], KEEP, False, "carol")
        answer(uri, by_case[case], PROBLEM, f"fact of {case} is wrong", "carol")
    answer(uri, by_case[kept[0]], PROBLEM, "reference a bit long", "bob")

    before = time.time()
    screened = tmp_path / "screened.jsonl"
    accepted = ragexp("draft", "accept", queue["queue"], "--out", str(screened), "--json")
    assert accepted.code == 0, accepted.stderr
    outcome = accepted.json()
    assert (outcome["accepted"], outcome["rejected"], outcome["not_reviewed"]) == (len(kept), 3, 2)
    assert outcome["rejected_cases"] == [{"id": c, "problem": f"fact of {c} is wrong"} for c in rejected]
    written = read_cases(screened)
    assert [case["id"] for case in written] == kept + pending
    original = {case["id"]: case for case in cases}
    for case in written:
        draft_info = dict(case["draft"])
        if case["id"] in pending:
            assert case == original[case["id"]]
            continue
        assert draft_info.pop("status") == "screened" and draft_info.pop("reviewer") == "bob"
        reviewed = datetime.fromisoformat(draft_info.pop("reviewed_at"))
        assert reviewed.tzinfo is not None and abs(reviewed.timestamp() - before) < 120
        assert draft_info.pop("review_note", None) == ("reference a bit long" if case["id"] == kept[0] else None)
        assert draft_info == {k: v for k, v in original[case["id"]]["draft"].items() if k != "status"}
        assert {k: v for k, v in case.items() if k != "draft"} == {
            k: v for k, v in original[case["id"]].items() if k != "draft"
        }
    # The two not reviewed keep the set from counting; accepting again once they are reviewed finishes it.
    assert ragexp("validate", "--path", str(screened)).code == 1
    for case in pending:
        answer(uri, by_case[case], KEEP, True, "dave")
    by_id = ragexp("draft", "accept", queue["queue_id"], "--out", str(screened))
    assert by_id.code == 0, by_id.stderr
    assert f"{len(kept) + 2} accepted, 3 rejected (dropped), 0 not reviewed yet" in by_id.stdout
    final = read_cases(screened)
    assert [case["id"] for case in final] == kept + pending
    assert {case["draft"]["reviewer"] for case in final if case["id"] in pending} == {"dave"}
    validated = ragexp("validate", "--path", str(screened), "--corpus", str(KB_ZH), "--json")
    assert validated.code == 0 and validated.json()["findings"] == []
    run = ragexp("run", f"dataset.path={screened}", "provider=sample", "metrics=offline", "--json")
    assert run.code == 0, run.stderr
    assert run.json()["case_count"] == len(final) and run.json()["error_count"] == 0
    assert set(run.json()["summary"]) >= set(OFFLINE)
    assert "ragexp.draft" not in MlflowClient(uri).get_run(run.json()["run_id"]).data.tags


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_review_queue_round_trip_keeps_exactly_the_accepted_cases(
    ragexp: Any,
    drafter: str,  # noqa: F811
    tmp_path: Path,
    store_uri: str,
) -> None:
    review_and_accept(ragexp, store_uri, draft_file(ragexp, drafter, tmp_path), tmp_path)


@pytest.mark.system
@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_review_queue_round_trip_on_the_tracking_server(
    ragexp: Any,
    drafter: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draft = draft_file(ragexp, drafter, tmp_path)
    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    review_and_accept(ragexp, server, draft, tmp_path)


def test_review_and_accept_refuse_bad_input_in_one_line(
    ragexp: Any,
    drafter: str,  # noqa: F811
    tmp_path: Path,
    store_uri: str,
) -> None:
    draft = draft_file(ragexp, drafter, tmp_path)
    cases = read_cases(draft)
    # A source chunk missing from --corpus: file, line and field, before anything is logged.
    small = write_jsonl(tmp_path / "small.jsonl", [{"id": "other", "text": "无关内容。"}])
    missing = ragexp("draft", "review", str(draft), "--corpus", str(small))
    assert missing.code == 1
    assert missing.stderr.startswith(f"ragexp: error: {draft}:1: field 'draft.source_ids': chunk ")
    assert missing.stderr.count("\n") == 1
    assert MlflowClient(store_uri).get_experiment_by_name("ragexp-draft-review") is None
    # Nothing left to screen.
    for case in cases:
        case["draft"]["status"] = "screened"
    done = write_jsonl(tmp_path / "done.jsonl", cases)
    nothing = ragexp("draft", "review", str(done), "--corpus", str(KB_ZH))
    assert nothing.code == 1 and "nothing to screen" in nothing.stderr
    # Unknown queue, and the wrong combinations of options.
    unknown = ragexp("draft", "accept", "no such queue", "--out", str(tmp_path / "x.jsonl"))
    assert unknown.code == 1 and "no draft review" in unknown.stderr
    assert not (tmp_path / "x.jsonl").exists()
    both = ragexp("draft", "review", str(draft), "--out", "q", "--corpus", str(KB_ZH))
    assert both.code == 1 and "No such option: --out" in both.stderr
    no_out = ragexp("draft", "accept", "q")
    assert no_out.code == 1 and "--out" in no_out.stderr
    old = ragexp("draft", "--accept", "q", "--out", str(tmp_path / "x.jsonl"))
    assert old.code == 1 and "No such option: --accept" in old.stderr
    # A queue name MLflow would refuse, and a name already taken.
    reserved = ragexp("draft", "review", str(draft), "--corpus", str(KB_ZH), "--queue", "Default")
    assert reserved.code == 1 and "reserved" in reserved.stderr
    first = ragexp("draft", "review", str(draft), "--corpus", str(KB_ZH), "--queue", "pass 1")
    assert first.code == 0, first.stderr
    again = ragexp("draft", "review", str(draft), "--corpus", str(KB_ZH), "--queue", "pass 1")
    assert again.code == 1 and "exists" in again.stderr


def test_english_draft_with_screened_cases_passing_through(ragexp: Any, tmp_path: Path, store_uri: str) -> None:
    corpus = write_jsonl(
        tmp_path / "chunks.jsonl",
        [{"id": "refund", "text": "Refunds arrive within 7 days."}, {"id": "fees", "text": "Transfers cost 2 USD."}],
    )
    draft = {"source_ids": ["refund"], "model": "m", "prompt_hash": "h", "kind": "single", "status": "draft"}
    rows = [
        {"id": "q1", "question": "How long until a refund arrives?", "expected_facts": ["7 days"],
         "reference": "Within 7 days.", "relevant_ids": ["refund"], "draft": draft},
        {"id": "q2", "question": "What does a transfer cost?", "expected_facts": ["2 USD"], "reference": "2 USD.",
         "relevant_ids": ["fees"], "draft": {**draft, "source_ids": ["fees"], "status": "screened"}},
        {"id": "q3", "question": "Is there a fee?", "expected_facts": ["2 USD"], "reference": "2 USD.",
         "relevant_ids": ["fees"]},
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "draft.jsonl", rows)
    made = ragexp("draft", "review", str(path), "--corpus", str(corpus), "--queue", "english", "--json")
    assert made.code == 0, made.stderr
    queue = made.json()
    assert (queue["traces"], queue["passed_through"], queue["language"]) == (1, 2, "en")
    mlflow.set_tracking_uri(store_uri)
    keep = label_schemas.get_label_schema(KEEP, experiment_id=queue["experiment_id"])
    assert (keep.input.positive_label, keep.input.negative_label) == ("Pass", "Fail")
    assert keep.instruction.startswith("Keep this drafted case")
    (trace_id,) = queued_cases(store_uri, queue["queue_id"]).values()
    answer(store_uri, trace_id, KEEP, False, "erin")
    out = tmp_path / "screened.jsonl"
    accepted = ragexp("draft", "accept", "english", "--out", str(out))
    assert accepted.code == 0, accepted.stderr
    assert "0 accepted, 1 rejected (dropped), 0 not reviewed yet; wrote 2 cases" in accepted.stdout
    assert read_cases(out) == rows[1:]
    assert ragexp("validate", "--path", str(out), "--corpus", str(corpus)).code == 0
