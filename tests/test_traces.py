"""Every case an MLflow trace with its assessments: content, cap, faults, resume, parallel
writers, the tracking server; plus the run's legibility in the UI (names, tags, dataset input,
params) and the comparison records of diff and gate. Real stores and real processes only."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import FAULTY, SAMPLE, serve

pytestmark = pytest.mark.differential  # compared with MLflow: `make test-mlflow-next` reruns it

RETRIEVAL = {"recall_at_k", "mrr", "ndcg_at_k"}
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def traces_of(uri: str, run_id: str) -> list[Any]:
    """Every trace linked to the run, with its spans (all pages)."""
    client = MlflowClient(uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    found: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id],
            filter_string=f"metadata.`mlflow.sourceRun` = '{run_id}'",
            max_results=500,
            page_token=token,
        )
        found.extend(page)
        token = page.token
        if not token:
            return found


def case_id(trace: Any) -> str:
    return str(json.loads(trace.info.request_preview)["case_id"])


def rows_of(uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


def feedback(trace: Any) -> dict[str, Any]:
    return {a.name: a for a in trace.info.assessments if a.feedback is not None}


def test_every_case_is_a_trace_whose_assessments_average_to_the_summary(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    result = ragexp("run", "provider=replay", "dataset=scifacts_zh", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    run_id = payload["run_id"]
    traces = traces_of(store_uri, run_id)
    rows = rows_of(store_uri, run_id, tmp_path)
    assert sorted(case_id(t) for t in traces) == sorted(rows)  # one trace per case, none missing
    tags = MlflowClient(store_uri).get_run(run_id).data.tags
    assert tags["ragexp.traces"] == "all" and tags["ragexp.traces.count"] == "25"

    per_metric: dict[str, list[float]] = {}
    for trace in traces:
        row = rows[case_id(trace)]
        assert json.loads(trace.info.request_preview)["question"] == row["question"]
        assert json.loads(trace.info.response_preview)["answer"] == row["output"]["answer"]
        marks = feedback(trace)
        for name, mark in marks.items():
            assert mark.source.source_type == "CODE" and mark.error is None
            assert mark.value == row["metrics"][name]
            per_metric.setdefault(name, []).append(mark.value)
        # Unanswerable cases carry no retrieval assessment (the summary averages those over
        # answerable cases), but still their answer's.
        if row["unanswerable"]:
            assert not RETRIEVAL & set(marks) and "answer_accuracy" in marks
        else:
            assert set(marks) >= RETRIEVAL
        expectations = {a.name: a.value for a in trace.info.assessments if a.expectation is not None}
        assert expectations["unanswerable"] == row["unanswerable"]
        # The retriever span lists the documents in rank order.
        full = MlflowClient(store_uri).get_trace(trace.info.trace_id)
        (retriever,) = [s for s in full.data.spans if s.span_type == "RETRIEVER"]
        assert [d["id"] for d in retriever.outputs] == row["output"]["ranked_ids"]
        assert [d["page_content"] for d in retriever.outputs] == row["output"]["contexts"]
    # What the MLflow UI shows as AVG per assessment is ragexp's summary.
    for name, values in per_metric.items():
        assert sum(values) / len(values) == pytest.approx(payload["summary"][name], abs=1e-12), name
    assert set(per_metric) == {"recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"}


def test_stage_spans_and_errors_as_assessment_errors(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    with serve(SAMPLE) as url:
        ok = ragexp("run", "provider=http", f"provider.system.url={url}", "--json")
    assert ok.code == 0, ok.stderr
    trace = traces_of(store_uri, ok.json()["run_id"])[0]
    spans = MlflowClient(store_uri).get_trace(trace.info.trace_id).data.spans
    names = {s.name for s in spans}
    assert {"rag_case", "retrieve", "keyword", "rerank", "model"} <= names
    stage = next(s for s in spans if s.name == "model")
    assert stage.end_time_ns - stage.start_time_ns == pytest.approx(stage.outputs["seconds"] * 1e9, abs=2)

    data = write_jsonl(
        tmp_path / "faults.jsonl",
        [
            {"id": "ok-1", "question": "q 1?", "relevant_ids": ["rel-1"], "expected_facts": ["fact 1"]},
            {"id": "bad400-2", "question": "q 2?", "relevant_ids": ["rel-2"], "expected_facts": ["fact 2"]},
        ],
    )
    with serve(FAULTY) as url:
        bad = ragexp("run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "--json")
    assert bad.code == 0, bad.stderr
    by_case = {case_id(t): t for t in traces_of(store_uri, bad.json()["run_id"])}
    assert set(by_case) == {"ok-1", "bad400-2"}
    failed = by_case["bad400-2"]
    assert failed.info.state.value == "ERROR"
    marks = feedback(failed)
    assert set(marks) == {"recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"}
    for mark in marks.values():  # an error, never a value (never a zero)
        assert mark.value is None and "HTTP 400" in mark.error.error_message
    assert all(m.error is None and m.value == 1.0 for m in feedback(by_case["ok-1"]).values())


def test_cap_traces_only_errored_and_imperfect_cases(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    result = ragexp("run", "provider=replay", "dataset=scifacts_zh", "tracking.traces_max_cases=20", "--json")
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path)
    imperfect = {
        cid
        for cid, row in rows.items()
        if row["error"] or any(v is not None and v < 1 for v in row["metrics"].values())
    }
    assert 0 < len(imperfect) < 20
    assert {case_id(t) for t in traces_of(store_uri, run_id)} == imperfect
    assert f"traces: {len(imperfect)} of 25 cases traced (errored and imperfect only" in result.stderr
    tags = MlflowClient(store_uri).get_run(run_id).data.tags
    assert tags["ragexp.traces"] == "errored_and_imperfect" and tags["ragexp.traces.count"] == str(len(imperfect))

    off = ragexp("run", "tracking.traces=false", "--json")
    assert off.code == 0 and traces_of(store_uri, off.json()["run_id"]) == []


def test_huge_answer_is_cut_in_the_trace_not_in_cases_jsonl(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    answer = "很长的回答。" * 180_000  # over 1 MB of UTF-8
    data = write_jsonl(
        tmp_path / "huge.jsonl",
        [
            {
                "id": "huge",
                "question": "问题" * 5000,
                "relevant_ids": ["d1"],
                "expected_facts": ["回答"],
                "response": answer,
                "retrieved_ids": ["d1"],
                "retrieved_contexts": ["上下文" * 100_000],
                "citations": [1],
            }
        ],
    )
    result = ragexp("run", "provider=replay", f"dataset.path={data}", "--json")
    assert result.code == 0, result.stderr
    (trace,) = traces_of(store_uri, result.json()["run_id"])
    assert len(trace.info.request_preview) <= 1000 and len(trace.info.response_preview) <= 1000
    assert json.loads(trace.info.request_preview)["case_id"] == "huge"
    root = next(s for s in MlflowClient(store_uri).get_trace(trace.info.trace_id).data.spans if s.parent_id is None)
    assert len(root.outputs) < 25_000 and "more characters in cases.jsonl" in root.outputs
    assert rows_of(store_uri, result.json()["run_id"], tmp_path)["huge"]["output"]["answer"] == answer


def break_assessments(db: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TRIGGER ragexp_test_fault BEFORE INSERT ON assessments "
            "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END;"
        )


def test_store_error_while_tracing_marks_the_run_and_resume_gives_one_trace_per_case(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    first = ragexp("run", "--json")  # creates the store
    assert first.code == 0
    db = Path(store_uri.removeprefix("sqlite:///"))
    break_assessments(db)
    broken = ragexp("run", "--json")
    assert broken.code == 1 and broken.stdout == ""
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1 and "logging traces" in lines[0] and "disk I/O error" in lines[0], broken.stderr
    client = MlflowClient(store_uri)
    run = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id], max_results=1)[0]
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"
    assert "logging traces" in run.data.tags["ragexp.stopped_because"]
    assert traces_of(store_uri, run.info.run_id) == []  # one transaction per batch: nothing half-written

    # An earlier attempt's traces are replaced, not added to.
    with sqlite3.connect(db) as con:
        con.execute("DROP TRIGGER ragexp_test_fault")
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import CaseTrace, TraceWriter

    store = Store(store_uri)
    TraceWriter(store, run.info.experiment_id, run.info.run_id).write(
        [CaseTrace(f"stale-{i}", "?", "", None, 0.1) for i in range(7)]
    )
    resumed = ragexp("run", "--resume", run.info.run_id, "--json")
    assert resumed.code == 0, resumed.stderr
    ids = [case_id(t) for t in traces_of(store_uri, run.info.run_id)]
    assert len(ids) == len(set(ids)) == 35 and not any(i.startswith("stale-") for i in ids)


def test_six_parallel_runs_lose_no_trace(store_uri: str, tmp_path: Path) -> None:
    MlflowClient(store_uri).create_experiment("ragexp")  # migrations once, before the crowd
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri}
    procs = [
        subprocess.Popen(
            [*RAGEXP, "run", "provider=replay", "dataset=scifacts_zh", f"+tags.worker={n}", "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(6)
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    for out, _ in outputs:
        traces = traces_of(store_uri, json.loads(out)["run_id"])
        assert len({case_id(t) for t in traces}) == len(traces) == 25
        assert sum(len(feedback(t)) for t in traces) == 22 * 5 + 3 * 2


def test_sweep_points_each_have_their_traces(ragexp: Any, store_uri: str) -> None:
    result = ragexp("run", "-m", "k=3,5", "--json")
    assert result.code == 0, result.stderr
    runs = result.json()["runs"]
    assert len(runs) == 2
    for point in runs:
        assert sorted({case_id(t) for t in traces_of(store_uri, point["run_id"])}) == sorted(
            json.loads(line)["id"] for line in (ROOT / "ragexp/data/kb_zh/cases.jsonl").read_text().splitlines()
        )
    tags = MlflowClient(store_uri).get_run(result.json()["sweep"]).data.tags
    assert tags["ragexp.sweep.role"] == "parent" and "ragexp.sweep_parent" not in tags


@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_traces_on_the_tracking_server(ragexp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    experiment = f"ragexp-test-traces-{os.getpid()}-{tmp_path.name}"
    result = ragexp("run", "provider=replay", "dataset=scifacts_zh", f"experiment={experiment}", "--json")
    assert result.code == 0, result.stderr
    traces = traces_of(server, result.json()["run_id"])
    assert len({case_id(t) for t in traces}) == len(traces) == 25
    marks = [a for t in traces for a in t.info.assessments if a.feedback is not None]
    assert len(marks) == 22 * 5 + 3 * 2  # answerable: 5 metrics; unanswerable: no retrieval metrics


def test_run_is_legible_in_the_ui(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    named = ragexp("run", "provider=fake", "run_name=my baseline", "+tags.role=baseline", "--json")
    assert named.code == 0, named.stderr
    client = MlflowClient(store_uri)
    run = client.get_run(named.json()["run_id"])
    assert run.info.run_name == "my baseline" and run.data.tags["role"] == "baseline"
    short = named.json()["config_hash"][:12]
    assert run.data.tags["ragexp.config_hash_short"] == short
    # Params without noise: no nulls, no runtime-only keys, the gate rules as one param.
    params = run.data.params
    assert "null" not in params.values()
    assert not {"tracking.uri", "concurrency", "dataset.path", "progress", "run_name"} & set(params)
    assert not any(key.startswith("gates.rules.") for key in params)
    assert json.loads(params["gates.rules"])  # the rules, as JSON
    # The dataset input fills the Datasets column.
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "kb_zh" and dataset_input.dataset.digest == named.json()["dataset_hash"][:12]
    assert json.loads(dataset_input.dataset.profile)["dataset_hash"] == named.json()["dataset_hash"]

    # Another file: its own name, never the bundled set's; a default name telling runs apart.
    copy = tmp_path / "support_v2.jsonl"
    copy.write_text((ROOT / "ragexp/data/kb_zh/cases.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    other = ragexp("run", "provider=fake", f"dataset.path={copy}", "--json")
    assert other.code == 0, other.stderr
    run2 = client.get_run(other.json()["run_id"])
    assert run2.data.tags["ragexp.dataset"] == "support_v2" and run2.data.params["dataset.name"] == "support_v2"
    assert run2.info.run_name == f"fake-support_v2-k5-{other.json()['config_hash'][:12]}"
    assert run2.inputs.dataset_inputs[0].dataset.name == "support_v2"
    assert other.json()["config_hash"] == named.json()["config_hash"]  # same content, same hash

    # The 12 characters the CLI prints find the runs.
    found = ragexp("runs", "--config-hash", short, "--json")
    assert found.code == 0
    assert {r["run_id"] for r in found.json()["runs"]} == {named.json()["run_id"], other.json()["run_id"]}
    assert ragexp("runs", "--config-hash", "zz", "--json").code == 1


def test_diff_and_gate_leave_a_record_on_the_candidate(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = ragexp("run", "--json").json()["run_id"]
    cand_id = ragexp("run", "+tags.role=candidate", "--json").json()["run_id"]
    assert ragexp("diff", base, cand_id, "--json").code == 0
    gate = ragexp("gate", "--baseline", base, "--candidate", cand_id, "--json")
    # provider=fake's latencies are microseconds of noise: p95_seconds may fail the gate or not;
    # either way the record must say exactly what the command said.
    assert gate.code in (0, 2), gate.stderr
    client = MlflowClient(store_uri)
    names = {a.path for a in client.list_artifacts(cand_id, f"comparisons/{base}")}
    assert names == {f"comparisons/{base}/diff.json", f"comparisons/{base}/gate.json"}
    recorded = json.loads(
        Path(client.download_artifacts(cand_id, f"comparisons/{base}/gate.json", str(tmp_path))).read_text()
    )
    assert recorded["verdict"] == ("passed" if gate.code == 0 else "failed")
    assert recorded["failures"] == gate.json()["failures"] and recorded["rules"] == gate.json()["rules"]
    assert recorded["config"]["rules"]["recall_at_k"]
    assert recorded["baseline"] == base and recorded["candidate"] == cand_id
    diff = json.loads(
        Path(client.download_artifacts(cand_id, f"comparisons/{base}/diff.json", str(tmp_path))).read_text()
    )
    assert {m["name"] for m in diff["metrics"]} >= {"recall_at_k", "mrr"}


def test_judge_metrics_are_llm_judge_assessments(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_judge import CASES, JUDGE, KEY, judge_args

    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", KEY)
    data = write_jsonl(tmp_path / "cases.jsonl", [CASES[0], CASES[2]])
    with serve(JUDGE, "--api-key", KEY) as url:
        result = ragexp("run", f"dataset.path={data}", "metrics.names=[faithfulness,mrr]", *judge_args(url), "--json")
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    judge = MlflowClient(store_uri).get_run(run_id).data.tags["ragexp.judge"]
    by_case = {case_id(t): feedback(t) for t in traces_of(store_uri, run_id)}
    full, broken = by_case["full"], by_case["broken"]
    assert full["faithfulness"].value == 1.0 and full["faithfulness"].source.source_type == "LLM_JUDGE"
    assert full["faithfulness"].source.source_id == judge and full["mrr"].source.source_type == "CODE"
    assert broken["faithfulness"].value is None
    assert "judge output unusable" in broken["faithfulness"].error.error_message
    assert broken["mrr"].value == 1.0  # the case's other metrics stand


def test_server_request_body_is_mlflows_own_start_trace_message() -> None:
    """The tracking-server path writes StartTraceV3 JSON directly; it must parse to exactly the
    message MLflow's client would send for the same trace (feedback with values, errors, judge
    sources and rationales; expectations of every JSON type; an errored case)."""
    from google.protobuf.json_format import Parse
    from mlflow.entities import Trace, TraceData
    from mlflow.protos.service_pb2 import StartTraceV3

    from ragexp.tracking.traces import CaseTrace, FeedbackRecord, TraceWriter, _plan

    answered = CaseTrace(
        case_id="c-1",
        question="退款多久到账？",
        answer="1-3 个工作日 [1]",
        error=None,
        latency_seconds=0.43,
        ranked_ids=["d1", "d2"],
        contexts=["第一段", "第二段"],
        timings={"embedding": 0.004, "model": 0.4},
        expectations={"expected_facts": ["1-3 个工作日"], "meta": {"k": [1, 2]}, "expected_response": "答", "n": 3},
        feedback=[
            FeedbackRecord("recall_at_k", 0.5),
            FeedbackRecord("answer_accuracy", None, error="judge timed out", judge="qwen@npu"),
            FeedbackRecord("faithfulness", 1.0, judge="qwen@npu", rationale="理由: supported"),
        ],
    )
    failed = CaseTrace("c-2", "q", None, "HTTP 500 from the RAG service", None, expectations={"unanswerable": True})
    writer = TraceWriter.__new__(TraceWriter)
    writer.run_id, writer.experiment_id = "f" * 32, "7"
    for case in (answered, failed):
        trace = _plan(case)
        ours = Parse(writer._start_trace_body(trace, 1_764_500_000_123), StartTraceV3())
        info = writer._trace_info(trace, 1_764_500_000_123)
        assert ours == StartTraceV3(trace=Trace(info=info, data=TraceData(spans=[])).to_proto())
        assert len(ours.trace.trace_info.assessments) == len(case.expectations) + len(case.feedback)


@contextlib.contextmanager
def trace_server(answers: list[tuple[int, str]], bodies: list[bytes]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 standing in for a tracking server's StartTraceV3: it
    answers each POST with the next (status, message) of ``answers`` (an MLflow error body), then
    200, and keeps every request body in ``bodies``. Yields its URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            status, message = answers.pop(0) if answers else (200, "")
            payload = json.dumps({"error_code": "BAD_REQUEST", "message": message}).encode() if message else b"{}"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_server_path_retries_transient_failures_and_stops_on_a_refusal() -> None:
    """Against a real HTTP server on 127.0.0.1 that answers StartTraceV3 with a 503 once (a
    restarting server), then 200: the trace is sent again and nothing fails. When it refuses (400)
    the writer stops with one line carrying the server's message and how many were written."""
    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.utils.rest_utils import MlflowHostCreds

    from ragexp.errors import TrackingError
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import CaseTrace, TraceWriter, _TraceInfoSender

    answers: list[tuple[int, str]] = []
    bodies: list[bytes] = []
    with trace_server(answers, bodies) as url:
        send = _TraceInfoSender.open(RestStore(lambda: MlflowHostCreds(url)), 60.0)
        assert send is not None
        answers.append((503, "restarting"))
        send(b'{"trace": {"trace_info": {"trace_id": "tr-1"}}}')
        assert len(bodies) == 2 and bodies[0] == bodies[1]  # sent again after the 503
        send.close()

        writer = TraceWriter(Store(url), "1", "r" * 32)
        answers.extend([(400, "no such\nexperiment")] * 40)
        cases = [CaseTrace(f"c{i}", "q", "a", None, 0.1) for i in range(3)]
        with pytest.raises(TrackingError) as failure:
            writer.write(cases)
        message = str(failure.value)
        assert "0 of 3 written" in message and "400" in message and "BAD_REQUEST no such" in message
        assert "\n" not in message


def test_a_saturated_server_is_asked_again_with_fewer_requests_in_flight() -> None:
    """MLflow answers 400 when its database pool or lock times out (a SQLAlchemy
    OperationalError): that 400 is the server being busy, not the request being bad. The trace
    is sent again and the run's requests in flight are halved; answers let them grow back. Any
    other 400 is refused at once."""
    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.utils.rest_utils import MlflowHostCreds

    from ragexp.errors import TrackingError
    from ragexp.tracking.traces import SERVER_THREADS, _TraceInfoSender

    answers: list[tuple[int, str]] = []
    seen: list[bytes] = []
    with trace_server(answers, seen) as url:
        send = _TraceInfoSender.open(RestStore(lambda: MlflowHostCreds(url)), 60.0)
        assert send is not None
        start = send.slots.limit
        assert 1 < start < SERVER_THREADS  # a few first: a server on SQLite chokes on many
        busy = "(sqlite3.OperationalError) QueuePool limit of size 5 overflow 10 reached, connection timed out"
        answers.extend([(400, busy), (400, "database is locked")])
        send(b'{"trace": {"trace_info": {"trace_id": "tr-1"}}}')
        assert len(seen) == 3 and len(set(seen)) == 1  # the same request, twice again
        lowered = send.slots.limit
        assert lowered <= start // 2  # halved twice, then one answer
        for _ in range(20):
            send(b"{}")
        assert send.slots.limit > lowered  # answers in a row: more in flight again
        answers.append((400, "Invalid trace id"))
        with pytest.raises(TrackingError, match="StartTraceV3 answered 400: BAD_REQUEST Invalid trace id"):
            send(b"{}")
        assert len(seen) == 3 + 20 + 1  # refused once, not asked again
        send.close()


def test_a_server_that_stops_answering_stops_the_trace_write_within_the_tracking_timeout() -> None:
    """A server that accepts StartTraceV3 and never answers (a hung server) is given
    ``tracking.timeout_s`` per trace, retries included, not minutes: one line, then the run's
    store-failure path takes over."""
    import socket

    from ragexp.errors import TrackingError
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import CaseTrace, TraceWriter

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # accepts connections, never reads or answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        writer = TraceWriter(Store(url, timeout_s=2), "1", "r" * 32)
        started = time.monotonic()
        with pytest.raises(TrackingError) as failure:
            writer.write([CaseTrace("c1", "q", "a", None, 0.1)])
        waited = time.monotonic() - started
        assert "0 of 1 written" in str(failure.value) and "\n" not in str(failure.value)
        assert waited < 30  # 2 s a trace, not 5 attempts of 120 s
    finally:
        listener.close()


@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_a_trace_sent_twice_to_the_server_keeps_one_copy_of_each_assessment(tmp_path: Path) -> None:
    """What a retry after a lost answer does: the same StartTraceV3 request twice."""
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import CaseTrace, FeedbackRecord, TraceWriter, _plan, _TraceInfoSender

    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    store = Store(server)
    experiment = f"ragexp-test-resend-{os.getpid()}-{tmp_path.name}"
    experiment_id = store.experiment_id(experiment, create=True)
    assert experiment_id is not None
    writer = TraceWriter(store, experiment_id, store.create_run(experiment, "resend", {}, {}))
    case = CaseTrace("c-1", "q", "a", None, 0.2, expectations={"unanswerable": False})
    case.feedback = [FeedbackRecord("recall_at_k", 1.0), FeedbackRecord("mrr", 0.5)]
    trace = _plan(case)
    send = _TraceInfoSender.open(writer.backend, 60.0)
    assert send is not None
    body = writer._start_trace_body(trace, 1_764_500_000_000)
    send(body)
    send(body)
    send.close()
    (info,) = writer.backend.batch_get_trace_infos([trace.trace_id])
    assert sorted(a.name for a in info.assessments) == ["mrr", "recall_at_k", "unanswerable"]
