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

from ragexp.escape import markdown
from ragexp.phrases import t
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


def trace_counts(uri: str, run_id: str) -> tuple[int, int]:
    """(traces, assessments) the store holds for the run, each trace read back whole."""
    client = MlflowClient(uri)
    found = traces_of(uri, run_id)
    return len(found), sum(len(client.get_trace(t.info.trace_id).info.assessments) for t in found)


def case_id(trace: Any) -> str:
    return str(json.loads(trace.info.request_preview)["case_id"])


def rows_of(uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


def feedback(trace: Any) -> dict[str, Any]:
    return {a.name: a for a in trace.info.assessments if a.feedback is not None}


def expected_marks(rows: dict[str, dict[str, Any]]) -> int:
    """The feedback assessments a run's traces hold: each case's scored metrics, less the
    retrieval ones of an unanswerable case (averaged over the answerable cases only)."""
    marks = 0
    for row in rows.values():
        scored = {name for name, value in row["metrics"].items() if value is not None and value == value}
        marks += len(scored - RETRIEVAL if row["unanswerable"] else scored)
    return marks


def assert_outside_mean(traces: list[Any], rows: dict[str, dict[str, Any]]) -> None:
    """An unanswerable case's trace: no retrieval assessment, its row's scores and the rule in
    its ``ragexp.outside_mean`` metadata; an answerable case's trace has no such metadata."""
    assert any(row["unanswerable"] for row in rows.values())  # the check below runs
    for trace in traces:
        row = rows[case_id(trace)]
        said = trace.info.trace_metadata.get("ragexp.outside_mean")
        if not row["unanswerable"]:
            assert said is None, case_id(trace)
            continue
        assert not set(feedback(trace)) & RETRIEVAL, case_id(trace)
        scores = row["metrics"]
        assert said is not None and said.startswith(
            ", ".join(f"{name} {scores[name]:g}" for name in sorted(RETRIEVAL, key=list(scores).index))
        ), (case_id(trace), said)
        assert said.endswith((t("unanswerable_row", "en"), t("unanswerable_row", "zh"))), said


@pytest.mark.system  # a whole run: `make test`, not the edit loop
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
        # The response preview a reviewer reads: the answer first, as Markdown text (not JSON).
        assert trace.info.response_preview.startswith(markdown(row["output"]["answer"]))
        marks = feedback(trace)
        for name, mark in marks.items():
            assert mark.source.source_type == "CODE" and mark.error is None
            assert mark.value == row["metrics"][name]
            per_metric.setdefault(name, []).append(mark.value)
        # The summary averages retrieval over the answerable cases: an unanswerable case has no
        # retrieval assessment; its own row's scores and their rule are the trace's metadata.
        if row["unanswerable"]:
            assert not set(marks) & RETRIEVAL
            said = trace.info.trace_metadata["ragexp.outside_mean"]
            assert said.startswith(
                ", ".join(
                    f"{name} {row['metrics'][name]:g}" for name in sorted(RETRIEVAL, key=list(row["metrics"]).index)
                )
            )
            assert said.endswith((t("unanswerable_row", "en"), t("unanswerable_row", "zh")))
        else:
            assert (
                set(marks) >= RETRIEVAL | {"answer_accuracy"} and "ragexp.outside_mean" not in trace.info.trace_metadata
            )
        expectations = {a.name: a.value for a in trace.info.assessments if a.expectation is not None}
        assert expectations["unanswerable"] == row["unanswerable"]
        # The retriever span lists the documents in rank order.
        full = MlflowClient(store_uri).get_trace(trace.info.trace_id)
        (retriever,) = [s for s in full.data.spans if s.span_type == "RETRIEVER"]
        assert [d["id"] for d in retriever.outputs] == row["output"]["ranked_ids"]
        assert [d["page_content"] for d in retriever.outputs] == row["output"]["contexts"]
    # The MLflow UI's AVG of every assessment of a name is ragexp's summary.
    for name, values in per_metric.items():
        assert sum(values) / len(values) == pytest.approx(payload["summary"][name], abs=1e-12), name
    assert set(per_metric) == {"recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
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


@pytest.mark.system  # a whole run: `make test`, not the edit loop
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


@pytest.mark.system
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


@pytest.mark.system
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


@pytest.mark.system
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
    for n, (out, _) in enumerate(outputs):
        run_id = json.loads(out)["run_id"]
        traces = traces_of(store_uri, run_id)
        assert len({case_id(t) for t in traces}) == len(traces) == 25
        (tmp_path / f"rows-{n}").mkdir()
        rows = rows_of(store_uri, run_id, tmp_path / f"rows-{n}")
        # Every scored metric of every case, but an unanswerable case's retrieval scores: those
        # are its trace's ``ragexp.outside_mean`` metadata, not assessments.
        assert sum(len(feedback(t)) for t in traces) == expected_marks(rows) < 25 * 5
        assert_outside_mean(traces, rows)


@pytest.mark.system
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


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_traces_on_the_tracking_server(ragexp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    experiment = f"ragexp-test-traces-{os.getpid()}-{tmp_path.name}"
    result = ragexp("run", "provider=replay", "dataset=scifacts_zh", f"experiment={experiment}", "--json")
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    traces = traces_of(server, run_id)
    assert len({case_id(t) for t in traces}) == len(traces) == 25
    marks = [a for t in traces for a in t.info.assessments if a.feedback is not None]
    # Every case its scored metrics; an unanswerable one's retrieval scores are its metadata instead.
    rows = rows_of(server, run_id, tmp_path)
    assert len(marks) == expected_marks(rows) < 25 * 5
    assert_outside_mean(traces, rows)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
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
    assert run2.info.run_name == f"{other.json()['config_hash'][:12]}-fake-support_v2-k5"
    assert run2.inputs.dataset_inputs[0].dataset.name == "support_v2"
    assert other.json()["config_hash"] == named.json()["config_hash"]  # same content, same hash

    # The 12 characters the CLI prints find the runs.
    found = ragexp("runs", "--config-hash", short, "--json")
    assert found.code == 0
    assert {r["run_id"] for r in found.json()["runs"]} == {named.json()["run_id"], other.json()["run_id"]}
    assert ragexp("runs", "--config-hash", "zz", "--json").code == 1


@pytest.mark.system
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


@pytest.mark.system
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


class TrackingServer:
    """A real HTTP server on 127.0.0.1 standing in for what the trace writer calls of an MLflow
    tracking server's REST API: ``StartTraceV3`` (``POST /api/3.0/mlflow/traces``, the trace
    answered back as MLflow's handler does), ``GET /version`` and the OTLP spans endpoint
    (``POST /v1/traces``, an empty ``ExportTraceServiceResponse``).

    ``answers`` are the (status, message) of the next ``StartTraceV3`` requests (an MLflow error
    body), then 200; every request body is kept in ``bodies``, and ``in_flight`` holds how many
    ``StartTraceV3`` requests the server was handling when each one arrived (itself included).
    Each is held ``delay_s`` before it is answered; the first ``/version`` is answered after
    ``version_delay_s``."""

    def __init__(self, delay_s: float = 0.0, version_delay_s: float = 0.0) -> None:
        import threading

        self.answers: list[tuple[int, str]] = []
        self.bodies: list[bytes] = []
        self.in_flight: list[int] = []
        self.spans = 0
        self.versions = 0
        self.delay_s, self.version_delay_s = delay_s, version_delay_s
        self.lock = threading.Lock()
        self.current = 0

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, status: int, payload: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path != "/version":
                    return self.answer(404, b'{"error_code": "ENDPOINT_NOT_FOUND", "message": "no such path"}')
                with stand_in.lock:
                    stand_in.versions += 1
                    first = stand_in.versions == 1
                time.sleep(stand_in.version_delay_s if first else 0)
                self.answer(200, b"3.17.2", "text/plain")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    with stand_in.lock:
                        stand_in.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                    return self.answer(200, b"", "application/x-protobuf")
                if self.path != "/api/3.0/mlflow/traces":
                    return self.answer(404, b'{"error_code": "ENDPOINT_NOT_FOUND", "message": "no such path"}')
                with stand_in.lock:
                    stand_in.bodies.append(body)
                    stand_in.current += 1
                    stand_in.in_flight.append(stand_in.current)
                    status, message = stand_in.answers.pop(0) if stand_in.answers else (200, "")
                time.sleep(stand_in.delay_s)
                with stand_in.lock:
                    stand_in.current -= 1
                if status != 200:
                    return self.answer(status, json.dumps({"error_code": "BAD_REQUEST", "message": message}).encode())
                self.answer(200, body)  # StartTraceV3.Response: {"trace": {"trace_info": ...}}

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def server_cases(n: int) -> list[Any]:
    from ragexp.case_traces import CaseTrace, FeedbackRecord

    return [CaseTrace(f"c{i}", "q", "a", None, 0.1, feedback=[FeedbackRecord("mrr", 1.0)]) for i in range(n)]


def test_server_path_retries_transient_failures_and_stops_on_a_refusal() -> None:
    """Against a stand-in tracking server that answers StartTraceV3 with a 503 once (a
    restarting server), then 200: the trace is sent again and nothing fails. When it refuses (400)
    the writer stops with one line carrying the server's message and how many were written, and
    asks nothing again."""
    from ragexp.errors import TrackingError
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import TraceWriter

    stand_in = TrackingServer()
    with stand_in.serve() as url:
        stand_in.answers.append((503, "restarting"))
        assert TraceWriter(Store(url), "1", "r" * 32).write(server_cases(3)) == 3
        assert len(stand_in.bodies) == 4 and len(set(stand_in.bodies)) == 3  # one sent again
        assert stand_in.spans == 3 * 2  # each case's root and answer spans, once
        sent = {json.loads(body)["trace"]["trace_info"]["client_request_id"] for body in stand_in.bodies}
        assert len(sent) == 3

        stand_in.bodies.clear()
        stand_in.answers.extend([(400, "no such\nexperiment")] * 40)
        with pytest.raises(TrackingError) as failure:
            TraceWriter(Store(url), "1", "r" * 32).write(server_cases(3))
        message = str(failure.value)
        assert "0 of 3 written" in message and "BAD_REQUEST: no such" in message and "\n" not in message
        assert len(stand_in.bodies) == len(set(stand_in.bodies)) <= 3  # a refusal is not asked again


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_saturated_server_is_asked_again_with_fewer_requests_in_flight() -> None:
    """MLflow answers 400 when its database pool or lock times out (a SQLAlchemy
    OperationalError): that 400 is the server being busy, not the request being bad. Seen from
    the server: the writer opens with a few requests in flight, grows while they are answered,
    sends the refused traces again with fewer in flight, and grows back after answers. Every
    trace is written once."""
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import SERVER_THREADS, TraceWriter

    busy = "(sqlite3.OperationalError) QueuePool limit of size 5 overflow 10 reached, connection timed out"
    stand_in = TrackingServer(delay_s=0.1)
    stand_in.answers = [(200, "")] * 80 + [(400, busy), (400, "database is locked")] * 2
    with stand_in.serve() as url:
        assert TraceWriter(Store(url), "1", "r" * 32).write(server_cases(200)) == 200
    seen = stand_in.in_flight
    assert len(seen) == 204 and len(set(stand_in.bodies)) == 200  # the 4 refused, sent again
    assert max(seen[:8]) <= 4  # a few at first: a server on SQLite chokes on many
    before = max(seen[60:80])
    assert 4 < before <= SERVER_THREADS  # grown while answered
    # The busy answers came after the others in flight then: from the next ones on, every
    # request was sent after they were seen.
    after = max(seen[80 + SERVER_THREADS : 88 + SERVER_THREADS])
    assert after <= before // 2
    assert max(seen[-40:]) > after  # answers in a row: more in flight again


@pytest.mark.system
def test_a_server_that_stops_answering_stops_the_trace_write_within_the_tracking_timeout() -> None:
    """A server that accepts StartTraceV3 and never answers (a hung server) is given
    ``tracking.timeout_s`` per call, MLflow's own retries included, not minutes: one line, then
    the run's store-failure path takes over."""
    import socket

    from ragexp.errors import StoreUnreachable
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import TraceWriter

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # accepts connections, never reads or answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        writer = TraceWriter(Store(url, timeout_s=10), "1", "r" * 32)
        started = time.monotonic()
        with pytest.raises(StoreUnreachable) as failure:
            writer.write(server_cases(40))
        waited = time.monotonic() - started
        assert "0 of 40 written" in str(failure.value) and "\n" not in str(failure.value)
        # One call's deadline for the whole write, not one per trace: MLflow's retries of a call
        # fit in tracking.timeout_s (Store bounds them).
        assert 9 < waited < 10 + 3
    finally:
        listener.close()


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_slow_first_version_answer_does_not_fail_the_spans() -> None:
    """MLflow's client asks a server's version once, within 3 s, and keeps a failure for good
    (every later ``log_spans`` would fail): a server busy for longer at that moment is asked
    again with the tracking timeout, and the spans are written."""
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import TraceWriter

    stand_in = TrackingServer(version_delay_s=3.5)
    with stand_in.serve() as url:
        assert TraceWriter(Store(url), "1", "r" * 32).write(server_cases(3)) == 3
    assert stand_in.spans == 3 * 2 and stand_in.versions >= 2


@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_a_trace_sent_twice_to_the_server_keeps_one_copy_of_each_assessment(tmp_path: Path) -> None:
    """What asking again after a lost answer does: the same trace info through MLflow's
    ``start_trace`` twice."""
    from ragexp.case_traces import CaseTrace, FeedbackRecord, plan_trace
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import TraceWriter

    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    store = Store(server)
    experiment = f"ragexp-test-resend-{os.getpid()}-{tmp_path.name}"
    experiment_id = store.experiment_id(experiment, create=True)
    assert experiment_id is not None
    writer = TraceWriter(store, experiment_id, store.create_run(experiment, "resend", {}, {}))
    case = CaseTrace("c-1", "q", "a", None, 0.2, expectations={"unanswerable": False})
    case.feedback = [FeedbackRecord("recall_at_k", 1.0), FeedbackRecord("mrr", 0.5)]
    trace = plan_trace(case)
    info = writer._trace_info(trace, 1_764_500_000_000)
    writer.backend.start_trace(info)
    writer.backend.start_trace(info)
    (stored,) = writer.backend.batch_get_trace_infos([trace.trace_id])
    assert sorted(a.name for a in stored.assessments) == ["mrr", "recall_at_k", "unanswerable"]
