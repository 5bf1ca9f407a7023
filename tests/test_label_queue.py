"""People label in MLflow's review queues; ragexp calibrates from those labels.

Reviewer answers are written as the UI's Review page writes them: a ``Feedback`` assessment on
the trace, named after the label schema, with a ``HUMAN`` source (``mlflow.log_feedback``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import AssessmentSource
from mlflow.genai import label_schemas, review_queues
from ppi_py import ppi_mean_ci

from tests.conftest import ROOT, write_jsonl
from tests.test_compare import replay_rows
from tests.test_ui import render, text_of, ui_server  # noqa: F401  (ui_server: the fixture)

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

ANSWER = "answer_accuracy"
"""The pass/fail metric every offline run has (people can score it)."""


@pytest.fixture(autouse=True)
def tracking_uri_restored() -> Iterator[None]:
    """The helpers below use MLflow's fluent API, which keeps the URI globally (and in the
    environment): each test ends with the global unset and the variable as it was, so later
    tests that read MLFLOW_TRACKING_URI (through monkeypatch) are not pinned to this one's store."""
    environ = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    mlflow.set_tracking_uri(None)
    if environ is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = environ


def specs(n: int) -> list[dict[str, Any]]:
    """``n`` cases; every third answer is wrong (answer accuracy 0), ranks vary."""
    return [{"rank": 1 + i % 3, "correct": i % 3 != 0} for i in range(n)]


def run_json(ragexp: Any, *args: str) -> dict[str, Any]:
    result = ragexp("run", *args, "--json")
    assert result.code == 0, result.stderr
    payload: dict[str, Any] = result.json()
    return payload


def replay_run(ragexp: Any, path: Path, *extra: str) -> dict[str, Any]:
    return run_json(ragexp, f"dataset.path={path}", "dataset.name=labels", "provider=replay", "k=3", *extra)


def queue_traces(uri: str, queue_id: str) -> list[str]:
    mlflow.set_tracking_uri(uri)
    ids, token = [], None
    while True:
        page = review_queues.list_review_queue_items(queue_id, max_results=100, page_token=token)
        ids += [item.item_id for item in page]
        token = page.token
        if not token or not page:
            return ids


def trace_cases(uri: str, trace_ids: list[str]) -> dict[str, str]:
    """Trace id -> case id."""
    client = MlflowClient(uri)
    return {tid: client.get_trace(tid).info.trace_metadata["ragexp.case_id"] for tid in trace_ids}


def review(uri: str, trace_id: str, name: str, value: Any, who: str = "alice") -> None:
    """A reviewer's answer, as the Review page stores it."""
    mlflow.set_tracking_uri(uri)
    mlflow.log_feedback(
        trace_id=trace_id, name=name, value=value, source=AssessmentSource(source_type="HUMAN", source_id=who)
    )


def test_label_queue_then_calibrate_equals_the_dataset_human_path(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    rows = replay_rows(specs(40))
    run = replay_run(ragexp, write_jsonl(tmp_path / "cases.jsonl", rows))
    run_id = run["run_id"]

    made = ragexp("label", run_id, "--sample", "25", "--seed", "7", "--queue", "first pass", "--json")
    assert made.code == 0, made.stderr
    queue = made.json()
    assert (queue["traces"], queue["cases"], queue["already_labelled"]) == (25, 40, 0)
    assert list(queue["schemas"]) == [ANSWER]  # the offline run's only labellable metric
    queued = queue_traces(store_uri, queue["queue_id"])
    cases = trace_cases(store_uri, queued)
    assert len(set(cases.values())) == 25
    # The traces are the run's own.
    assert {MlflowClient(store_uri).get_trace(t).info.trace_metadata["mlflow.sourceRun"] for t in queued} == {run_id}
    # One pass/fail question, its instruction the metric's definition in the run's language (zh).
    mlflow.set_tracking_uri(store_uri)
    schema = label_schemas.get_label_schema(ANSWER, experiment_id=queue["experiment_id"])
    assert isinstance(schema.input, label_schemas.InputPassFail)
    assert schema.instruction == "期望事实全部出现在回答中记 1；不可回答样本要求回答拒答。"
    text = ragexp("label", run_id, "--sample", "25", "--seed", "7", "--queue", "first pass")
    assert text.code == 0 and f"review-queue?selectedQueueId={queue['queue_id']}" in text.stdout

    # People agree with the automatic score except on four cases.
    automatic = {row["id"]: 1.0 if row["response"] == row["reference"] else 0.0 for row in rows}
    flipped = sorted(cases.values())[:4]
    human = {case: (1.0 - automatic[case] if case in flipped else automatic[case]) for case in cases.values()}
    by_case = {case: tid for tid, case in cases.items()}
    for case, value in human.items():
        review(store_uri, by_case[case], ANSWER, bool(value))
    # A changed mind: the newest answer counts.
    first = sorted(cases.values())[5]
    review(store_uri, by_case[first], ANSWER, not bool(human[first]), who="bob")
    review(store_uri, by_case[first], ANSWER, bool(human[first]), who="bob")
    # Left out and counted: a value off a pass/fail scale, a question with no schema.
    review(store_uri, by_case[sorted(cases.values())[6]], ANSWER, 0.5, who="carol")
    review(store_uri, by_case[sorted(cases.values())[7]], "tone", 4.0)

    calibrated = ragexp("calibrate", run_id, "--json")
    assert calibrated.code == 0, calibrated.stderr
    assert (
        calibrated.stderr.strip() == "labels ignored: 1 not a label schema of this run's metrics, "
        "1 outside the metric's range"
    )
    figures = calibrated.json()
    assert figures["labels"] == {ANSWER: 25}

    # The same labels in the dataset's `human` field give the same figures.
    labelled_rows = [{**row, "human": {ANSWER: human[row["id"]]}} if row["id"] in human else row for row in rows]
    from_file = replay_run(ragexp, write_jsonl(tmp_path / "labelled.jsonl", labelled_rows))
    assert figures["calibration"] == from_file["calibration"]
    assert figures["ppi"] == from_file["ppi"]
    kappa = figures["calibration"][ANSWER]
    assert kappa["n"] == 25 and kappa["accuracy"] == pytest.approx(21 / 25)

    # ... and ppi-python's interval.
    ids = [row["id"] for row in rows]
    judge = np.array([automatic[i] for i in ids])
    labels = np.array([human.get(i, np.nan) for i in ids])
    mask = np.isfinite(labels)
    low, high = ppi_mean_ci(labels[mask], judge[mask], judge, alpha=0.05, lam=1)
    assert figures["ppi"][ANSWER]["ci_low"] == pytest.approx(float(np.ravel(low)[0]))
    assert figures["ppi"][ANSWER]["ci_high"] == pytest.approx(float(np.ravel(high)[0]))

    # Logged on the run, so a gate's calibration rules read them.
    logged = MlflowClient(store_uri).get_run(run_id).data.metrics
    assert logged[f"calibration.{ANSWER}.kappa"] == pytest.approx(kappa["kappa"])
    assert logged[f"ppi.{ANSWER}.n_labelled"] == 25
    other = replay_run(ragexp, write_jsonl(tmp_path / "cases.jsonl", rows), "run_name=again")
    gate = ragexp(
        "gate", "--baseline", other["run_id"], "--candidate", run_id, "--json", f"+gates.rules.{ANSWER}.min_kappa=0.99"
    )
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    assert rules[(ANSWER, "min_kappa")]["outcome"] == "failed"
    assert f"κ {kappa['kappa']:.2f} < 0.99 on 25 labelled cases" in rules[(ANSWER, "min_kappa")]["message"]

    # Labelling more keeps the labelled cases and adds new ones at random.
    more = ragexp("label", run_id, "--sample", "30", "--seed", "1", "--queue", "second pass", "--json").json()
    assert (more["traces"], more["already_labelled"]) == (30, 25)
    second = set(trace_cases(store_uri, queue_traces(store_uri, more["queue_id"])).values())
    assert set(human) <= second and len(second) == 30

    # Export: the labelled cases in the dataset format, replayable.
    out = tmp_path / "labels.jsonl"
    exported = ragexp("label", "export", run_id, "--out", str(out))
    assert exported.code == 0, exported.stderr
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert {row["id"]: row["human"] for row in written} == {case: {ANSWER: value} for case, value in human.items()}
    source = {row["id"]: row for row in rows}
    for row in written:
        for key in ("question", "relevant_ids", "expected_facts", "reference", "response", "retrieved_ids"):
            assert row[key] == source[row["id"]][key], key
    assert ragexp("validate", "--path", str(out)).code == 0


def test_calibrate_says_how_many_labels_it_has_and_needs_and_where_people_disagree(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    rows = replay_rows(specs(30))
    run_id = replay_run(ragexp, write_jsonl(tmp_path / "cases.jsonl", rows))["run_id"]
    made = ragexp("label", run_id, "--json")
    assert made.code == 0, made.stderr
    cases = trace_cases(store_uri, queue_traces(store_uri, made.json()["queue_id"]))
    by_case = {case: tid for tid, case in cases.items()}
    automatic = {row["id"]: 1.0 if row["response"] == row["reference"] else 0.0 for row in rows}
    labelled = sorted(by_case)[:8]
    flipped = labelled[1:3]
    for case in labelled:
        review(store_uri, by_case[case], ANSWER, bool(automatic[case]) != (case in flipped))

    shown = ragexp("calibrate", run_id)
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert (
        f"  {ANSWER}: 8 labelled, scored cases; calibration needs 10 (calibration.min_labelled): "
        "not calibrated: 2 more needed"
    ) in lines
    start = lines.index("people and the automatic score disagree on 2 labelled cases (pass at >= 0.5):")
    listed = [line.split() for line in lines[start + 3 : start + 5]]
    assert listed == [[case, ANSWER, f"{1 - automatic[case]:.2f}", f"{automatic[case]:.2f}"] for case in flipped]
    figures = ragexp("calibrate", run_id, "--json").json()
    assert figures["coverage"] == {ANSWER: {"labelled": 8, "needed": 10}}
    assert figures["disagreements"] == [
        {"id": case, "metric": ANSWER, "human": 1 - automatic[case], "automatic": automatic[case]} for case in flipped
    ]
    for case in sorted(by_case)[8:12]:
        review(store_uri, by_case[case], ANSWER, bool(automatic[case]))
    enough = ragexp("calibrate", run_id).stdout
    assert (
        f"  {ANSWER}: 12 labelled, scored cases; calibration needs 10 (calibration.min_labelled): calibrated" in enough
    )


def test_labels_carry_over_only_to_byte_identical_outputs(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    # Two versions of the bundled sample system on the same 35 questions: some answers change.
    first = run_json(ragexp)["run_id"]
    second = run_json(ragexp, "provider.system.sample.chunking=sentence")["run_id"]
    queue = ragexp("label", first, "--json").json()
    cases = trace_cases(store_uri, queue_traces(store_uri, queue["queue_id"]))
    for tid in cases:
        review(store_uri, tid, ANSWER, True)

    def outputs(run_id: str) -> dict[str, tuple[Any, ...]]:
        text = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
        rows = [json.loads(line) for line in Path(text).read_text(encoding="utf-8").splitlines()]
        return {r["id"]: (r["question"], r["output"]["answer"], r["output"]["contexts"]) for r in rows}

    a, b = outputs(first), outputs(second)
    same = {case for case in a if a[case] == b[case]}
    assert 0 < len(same) < 35  # the test means something only if some outputs changed and some did not
    found = ragexp("calibrate", second, "--json")
    assert found.code == 0, found.stderr
    figures = found.json()
    assert figures["own"] == 0 and figures["carried_over"] == len(same)
    assert figures["labels"] == {ANSWER: len(same)}
    assert figures["ignored"]["other_run"] == 35 - len(same)
    assert found.stderr.strip() == f"labels ignored: {35 - len(same)} on another run's trace whose output differs"
    # The labelled run itself: its own 35.
    own = ragexp("calibrate", first, "--json").json()
    assert own["own"] == 35 and own["carried_over"] == 0 and own["labels"] == {ANSWER: 35}


def labelled_replay(ragexp: Any, store_uri: str, tmp_path: Path) -> tuple[list[dict[str, Any]], str, dict[str, float]]:
    """A replay run of 30 cases, 20 of them labelled in a queue, people disagreeing on three."""
    rows = replay_rows(specs(30))
    run_id = replay_run(ragexp, write_jsonl(tmp_path / "cases.jsonl", rows))["run_id"]
    queue = ragexp("label", run_id, "--sample", "20", "--seed", "3", "--json").json()
    cases = trace_cases(store_uri, queue_traces(store_uri, queue["queue_id"]))
    automatic = {row["id"]: 1.0 if row["response"] == row["reference"] else 0.0 for row in rows}
    flipped = sorted(cases.values())[:3]
    human = {case: (1.0 - automatic[case] if case in flipped else automatic[case]) for case in cases.values()}
    for tid, case in cases.items():
        review(store_uri, tid, ANSWER, bool(human[case]))
    review(store_uri, next(iter(cases)), "tone", 4.0)  # no schema: counted, left out
    return rows, run_id, human


def test_run_replaying_a_labelled_run_calibrates_with_its_labels(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    rows, labelled, human = labelled_replay(ragexp, store_uri, tmp_path)
    # The same outputs again: every label carries over, as `ragexp calibrate` carries it.
    result = ragexp(
        "run",
        f"dataset.path={tmp_path / 'cases.jsonl'}",
        "dataset.name=labels",
        "provider=replay",
        "k=3",
        "run_name=replay",
        "--json",
    )
    assert result.code == 0, result.stderr
    again = result.json()
    assert "labels ignored: 1 not a label schema of this run's metrics" in result.stderr
    calibrated = ragexp("calibrate", labelled, "--json").json()
    assert again["calibration"] == calibrated["calibration"] and again["ppi"] == calibrated["ppi"]
    assert again["calibration"][ANSWER]["n"] == 20
    # ... equal to the same labels typed into the dataset.
    typed = [{**row, "human": {ANSWER: human[row["id"]]}} if row["id"] in human else row for row in rows]
    from_file = replay_run(ragexp, write_jsonl(tmp_path / "typed.jsonl", typed), "run_name=typed")
    assert again["calibration"] == from_file["calibration"] and again["ppi"] == from_file["ppi"]
    logged = MlflowClient(store_uri).get_run(again["run_id"]).data.metrics
    assert logged[f"calibration.{ANSWER}.n"] == 20
    assert logged[f"ppi.{ANSWER}.n_labelled"] == 20

    # Two labelled cases answered differently: their labels describe answers this run did not
    # give, and they count as unlabelled.
    changed_ids = sorted(human)[-2:]
    changed = [{**row, "response": row["response"] + " (revised)"} if row["id"] in changed_ids else row for row in rows]
    other = replay_run(ragexp, write_jsonl(tmp_path / "changed.jsonl", changed), "run_name=changed")
    assert other["calibration"][ANSWER]["n"] == 18
    assert other["calibration"] == ragexp("calibrate", other["run_id"], "--json").json()["calibration"]


def test_resumed_run_calibrates_with_the_labels_on_its_traces(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    _, run_id, _ = labelled_replay(ragexp, store_uri, tmp_path)
    calibrated = ragexp("calibrate", run_id, "--json").json()
    # The run stopped after its traces were written (say, an artifact upload failed): resumable.
    MlflowClient(store_uri).set_terminated(run_id, "FAILED")
    result = ragexp(
        "run",
        f"dataset.path={tmp_path / 'cases.jsonl'}",
        "dataset.name=labels",
        "provider=replay",
        "k=3",
        "--resume",
        run_id,
        "--json",
    )
    assert result.code == 0, result.stderr
    resumed = result.json()
    assert resumed["run_id"] == run_id
    assert resumed["calibration"] == calibrated["calibration"] and resumed["ppi"] == calibrated["ppi"]
    assert resumed["calibration"][ANSWER]["n"] == 20
    logged = MlflowClient(store_uri).get_run(run_id).data.metrics
    assert logged[f"calibration.{ANSWER}.kappa"] == pytest.approx(calibrated["calibration"][ANSWER]["kappa"])


def test_label_refuses_what_it_cannot_queue(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    untraced = run_json(ragexp, "tracking.traces=false")["run_id"]
    result = ragexp("label", untraced)
    assert result.code == 1
    assert result.stderr.startswith(f"ragexp: error: run {untraced} has no traces (it ran with tracking.traces=false)")
    assert len(result.stderr.strip().splitlines()) == 1

    capped = run_json(ragexp, "tracking.traces_max_cases=3")["run_id"]
    result = ragexp("label", capped)
    assert result.code == 1 and "tracking.traces_max_cases" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    traced = run_json(ragexp)["run_id"]
    for args, why in [
        (("--metrics", "faithfulness"), f"--metrics: run {traced} has no metric 'faithfulness'"),
        (("--metrics", "mrr"), "--metrics: 'mrr' takes no human label (labellable here: answer_accuracy)"),
        (("--queue", "Default"), "--queue: 'Default' is reserved by MLflow"),
        (("--queue", "x" * 251), "--queue: at most 250 characters"),
        (("--sample", "0"), "--sample: expected at least 1 case, got 0"),
        (("--out", "x.jsonl"), "label: --out belongs to 'ragexp label export RUN_ID --out FILE'"),
    ]:
        result = ragexp("label", traced, *args)
        assert result.code == 1 and result.stderr.startswith(f"ragexp: error: {why}"), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert ragexp("label", "export", traced).stderr.strip() == "ragexp: error: label export: --out FILE is required"
    # Nothing was created by the refusals.
    mlflow.set_tracking_uri(store_uri)
    experiment = MlflowClient(store_uri).get_run(traced).info.experiment_id
    assert list(review_queues.list_review_queues(experiment_id=experiment)) == []


@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_label_and_calibrate_on_the_tracking_server(
    ragexp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    experiment = f"ragexp-test-labels-{os.getpid()}-{tmp_path.name}"
    run_id = run_json(ragexp, f"experiment={experiment}")["run_id"]
    made = ragexp("label", run_id, "--sample", "20", "--seed", "2", "--json")
    assert made.code == 0, made.stderr
    queue = made.json()
    assert queue["url"] == (
        f"{server.rstrip('/')}/#/experiments/{queue['experiment_id']}/review-queue?selectedQueueId={queue['queue_id']}"
    )
    cases = trace_cases(server, queue_traces(server, queue["queue_id"]))
    assert len(cases) == 20
    dataset = [json.loads(line) for line in (ROOT / "ragexp/data/kb_zh/cases.jsonl").read_text("utf-8").splitlines()]
    assert {row["id"] for row in dataset} >= set(cases.values())
    for i, tid in enumerate(sorted(cases)):
        review(server, tid, ANSWER, i % 4 != 0)
    figures = ragexp("calibrate", run_id, "--json")
    assert figures.code == 0, figures.stderr
    assert figures.json()["labels"] == {ANSWER: 20} and figures.json()["calibration"][ANSWER]["n"] == 20
    logged = MlflowClient(server).get_run(run_id).data.metrics
    assert logged[f"ppi.{ANSWER}.n_labelled"] == 20
    # The same system again replays every case: `ragexp run` itself calibrates with the 20 queue
    # labels alone, not mixed with the bundled dataset's own human scores of other cases.
    assert run_json(ragexp, f"experiment={experiment}-file")["calibration"][ANSWER]["n"] > 0
    again = run_json(ragexp, f"experiment={experiment}", "run_name=again")
    assert again["calibration"] == figures.json()["calibration"] and again["ppi"] == figures.json()["ppi"]
    assert MlflowClient(server).get_run(again["run_id"]).data.metrics[f"calibration.{ANSWER}.n"] == 20


def test_review_page_shows_the_sampled_traces_and_the_questions(
    ragexp: Any,
    store_uri: str,
    ui_server: str,  # noqa: F811  (the fixture of tests/test_ui.py)
    tmp_path: Path,
) -> None:
    """The queue ``ragexp label`` made, on the MLflow UI's Review page in headless Chromium; the
    answers reviewers give there come back through ``ragexp calibrate``."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed (make browser installs it)"
    run_id = run_json(ragexp)["run_id"]
    made = ragexp("label", run_id, "--sample", "10", "--seed", "4", "--ui-url", ui_server, "--json")
    assert made.code == 0, made.stderr
    queue = made.json()
    cases = trace_cases(store_uri, queue_traces(store_uri, queue["queue_id"]))
    dataset = [json.loads(line) for line in (ROOT / "ragexp/data/kb_zh/cases.jsonl").read_text("utf-8").splitlines()]
    questions = {row["id"]: row["question"] for row in dataset}

    text = ""
    for attempt in range(3):  # a loaded machine can leave the first render half-done
        done = render(chromium, queue["url"], tmp_path / f"profile{attempt}", "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        text = text_of(done.stdout)
        if "Needs review" in text:
            break
    assert f"| {queue['queue']} | 1 question |" in text, text[:3000]
    assert "All (10) | Needs review (10) | Completed (0)" in text
    listed = dict(re.findall(r'\{"case_id": "([^"]+)", "question": "([^"]*)"\}', text))
    assert listed == {case: questions[case] for case in cases.values()}

    # Reviewing: the question is the metric, asked with its definition, answered pass/fail.
    review_url = queue["url"] + "&startReview=true"
    shot = tmp_path / "review.png"
    for attempt in range(3):
        done = render(chromium, review_url, tmp_path / f"review{attempt}", "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        text = text_of(done.stdout)
        if "of 10 reviewed" in text:
            break
    definition = "期望事实全部出现在回答中记 1；不可回答样本要求回答拒答。"
    assert f"| {ANSWER} | {definition} | 通过 | 不通过 |" in text, text[:3000]
    # The item a reviewer reads: the answer, what the case expected and the retrieved contexts,
    # as text (the instruction speaks of expected facts: they are on screen), not raw JSON.
    shown = re.search(r'"case_id": "([^"]+)"', text)
    assert shown is not None, text[:3000]
    case = next(row for row in dataset if row["id"] == shown.group(1))
    output = next(
        json.loads(line)["output"]
        for line in Path(MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / "cases")))
        .read_text("utf-8")
        .splitlines()
        if json.loads(line)["id"] == case["id"]
    )
    assert '"answer":' not in text and output["answer"].strip() in text
    if case.get("unanswerable"):
        assert "拒答（不可回答的问题）" in text
    else:
        assert "期望事实" in text and all(fact in text for fact in case["expected_facts"])
    if output["ranked_ids"]:
        assert f"召回的上下文（{len(output['ranked_ids'])} 条）" in text
        assert all(doc_id in text for doc_id in output["ranked_ids"][:3])
    done = render(chromium, review_url, tmp_path / "profile-shot", f"--screenshot={shot}", "--hide-scrollbars")
    assert done.returncode == 0 and shot.stat().st_size > 20_000
    if os.environ.get("RAGEXP_UPDATE_SCREENSHOT"):
        shutil.copy(shot, ROOT / "docs/review-queue.png")

    # Answers as the page writes them (HUMAN feedback named after the question) come back.
    for i, tid in enumerate(sorted(cases)):
        review(ui_server, tid, ANSWER, i % 3 != 0)
    figures = ragexp("calibrate", run_id, "--json")
    assert figures.code == 0, figures.stderr
    assert figures.json()["labels"] == {ANSWER: 10} and figures.json()["calibration"][ANSWER]["n"] == 10


class OlderServer(BaseHTTPRequestHandler):
    """A tracking server from before review queues: every call is passed to a real one, except
    the review-queue and label-schema endpoints, which it answers as Flask answers an unknown
    route (404, an HTML page)."""

    upstream = ""
    NEW = ("/review-queues", "/label-schemas")

    def _any(self) -> None:
        if any(part in self.path for part in self.NEW):
            body = b"<!doctype html><title>404 Not Found</title><h1>Not Found</h1>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        reply = httpx.request(self.command, self.upstream + self.path, content=data, headers=headers, timeout=60)
        self.send_response(reply.status_code)
        for key, value in reply.headers.items():
            if key.lower() not in ("content-length", "transfer-encoding", "content-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(reply.content)))
        self.end_headers()
        self.wfile.write(reply.content)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_a_server_without_review_queues_is_one_line(
    ragexp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    OlderServer.upstream = os.environ["RAGEXP_TEST_MLFLOW_SERVER"].rstrip("/")
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), OlderServer)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        run_id = run_json(ragexp, f"experiment=ragexp-test-old-{os.getpid()}-{tmp_path.name}")["run_id"]
        for command in (("label", run_id), ("calibrate", run_id)):
            result = ragexp(*command)
            assert result.code == 1, result.stdout + result.stderr
            assert result.stderr == (
                f"ragexp: error: tracking server {url} has no review queues: ragexp label and calibrate need "
                "MLflow >= 3.14 (mlflow.genai.review_queues and label schemas)\n"
            )
        assert "ragexp.labels.queue" not in MlflowClient(url).get_run(run_id).data.tags
    finally:
        proxy.shutdown()
