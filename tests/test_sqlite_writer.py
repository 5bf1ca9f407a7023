"""The mlflow-free writer behind ``ragexp run`` on a SQLite store: the same calls write the same
rows MLflow's own store writes, MLflow reads them back, every call it cannot make exactly as
MLflow would is left to MLflow (so are MLflow's errors), and a run on an existing store never
imports mlflow."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow.store.tracking.utils.trace_analytics import assessment_aggregate
from mlflow.tracking import MlflowClient
from mlflow.utils.uri import append_to_uri_path
from mlflow.utils.validation import _validate_tag

from ragexp.case_traces import CaseTrace, FeedbackRecord, plan_trace
from ragexp.errors import TrackingError
from ragexp.tracking.mlflow_sql.trace_rows import aggregate, trace_rows
from ragexp.tracking.mlflow_sql.writer import TABLES, SqliteWriter, append_path, valid_key
from ragexp.tracking.store import DIRECT_ENV, Store
from ragexp.tracking.traces import TraceWriter, span_entities
from tests.conftest import IMPORT_PROBE, ROOT
from tests.test_traces import trace_counts

pytestmark = pytest.mark.differential  # compared with MLflow: `make test-mlflow-next` reruns it

RUN_TABLES = ("runs", "tags", "params", "metrics", "latest_metrics", "datasets", "inputs", "input_tags")
VOLATILE = {"start_time", "end_time", "timestamp", "created_timestamp", "last_updated_timestamp"}
"""Columns holding the clock: their type is compared, their value is not."""
HEX_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
"""A run, dataset or input id (uuid4().hex), alone or inside a path."""


def new_store(folder: Path) -> str:
    """An empty SQLite store, created (migrated) by MLflow itself."""
    uri = f"sqlite:///{folder}/mlflow.db"
    MlflowClient(uri).search_experiments()
    return uri


def dump(uri: str, tables: tuple[str, ...]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tables`` with each value's SQLite type, ids replaced by their order of
    first appearance and the store's folder by ROOT: two stores that were written alike dump
    alike."""
    folder = uri.removeprefix("sqlite:///").rsplit("/", 1)[0]
    db = sqlite3.connect(uri.removeprefix("sqlite:///"))
    names: dict[str, str] = {}

    def plain(column: str, value: Any) -> Any:
        if column in VOLATILE:
            return "clock" if value is not None else None
        if isinstance(value, str):
            value = value.replace(Path(folder).as_uri(), "ROOT").replace(folder, "ROOT")
            return HEX_ID.sub(lambda found: names.setdefault(found.group(), f"id{len(names)}"), value)
        return value

    out = {}
    for table in tables:
        columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        select = ", ".join(f'"{c}", typeof("{c}")' for c in columns)
        rows = db.execute(f"SELECT {select} FROM {table} ORDER BY rowid").fetchall()
        out[table] = [
            tuple((column, plain(column, row[2 * i]), row[2 * i + 1]) for i, column in enumerate(columns))
            for row in rows
        ]
    db.close()
    return out


def run_calls(store: Store, artifacts: Path) -> list[str]:
    """Every call ``ragexp run`` makes of a store, and the edge cases of each."""
    first = store.create_run(
        "writer-check",
        "run-1",
        {"ragexp.status": "running", "team": "search", "mlflow.user": "alice", "中文": "值"},
        {"k": "5", "long": "x" * 7000, "dataset.path": "/data/知识库.jsonl"},
    )
    for _ in range(2):  # the second time changes nothing
        store.log_dataset(
            first, name="kb", digest="abc12def", source="/data/kb.jsonl", profile={"cases": 3, "名": "值"}
        )
    store.log_metrics(first, {"evaluation_seconds": 1.5})
    store.log_metrics(first, {"mrr": 0.5, "odd": math.nan, "big": math.inf, "small": -math.inf}, step=2)
    store.log_metrics(first, {"mrr": 0.9}, step=1)  # an older step: not the latest
    store.log_metrics(first, {"mrr": 0.1, "odd": 0.3}, step=3)  # a newer one: the latest
    store.set_tags(first, {"ragexp.status": "finished", "mlflow.runName": "renamed", "new": "v" * 8000})
    store.delete_tags(first, ["team", "absent"])
    for _ in range(2):  # a param known only at the end; the same value again changes nothing
        store.log_params(first, {"judge.served": "chat=m@fp|prompts=ab", "judge.served_count": "1"})
    store.log_dir(first, artifacts, tables=["cases_table.json"])
    store.log_files(first, {"checkpoint/cases.jsonl": b'{"id": "a"}\n'})
    store.end_run(first, "FAILED")
    store.set_running(first)
    store.end_run(first, "FINISHED")
    second = store.create_run("writer-check", "run-2", {}, {})
    store.log_dataset(second, name="kb", digest="abc12def", source="/data/kb.jsonl", profile={"cases": 3})
    store.log_dataset(second, name="kb", digest="other", source="/data/kb.jsonl", profile={"cases": 4})
    store.end_run(second, "KILLED")
    return [first, second]


@pytest.mark.system
def test_a_run_writes_the_rows_mlflow_writes(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts-in"
    (artifacts / "sub").mkdir(parents=True)
    (artifacts / "cases.jsonl").write_text('{"id": "a", "问题": "是"}\n', encoding="utf-8")
    (artifacts / "cases_table.json").write_text('{"columns": [], "data": []}', encoding="utf-8")
    (artifacts / "sub" / "x.json").write_bytes(b"{}")
    uris = {side: new_store(tmp_path / side) for side in ("mlflow", "direct")}
    stores = {"mlflow": Store(uris["mlflow"], direct=False), "direct": Store(uris["direct"])}
    ids = {side: run_calls(store, artifacts) for side, store in stores.items()}
    assert stores["mlflow"]._direct() is None
    assert isinstance(stores["direct"]._direct(), SqliteWriter)

    mlflow_rows, direct_rows = dump(uris["mlflow"], RUN_TABLES), dump(uris["direct"], RUN_TABLES)
    for table in RUN_TABLES:
        assert sorted(direct_rows[table], key=repr) == sorted(mlflow_rows[table], key=repr), table
    assert len(direct_rows["metrics"]) == 8 and len(direct_rows["datasets"]) == 2 and len(direct_rows["inputs"]) == 3

    # MLflow reads the directly written runs as it reads its own.
    for side in ("mlflow", "direct"):
        client = MlflowClient(uris[side])
        run = client.get_run(ids[side][0])
        assert run.info.run_name == "renamed" and run.info.status == "FINISHED" and run.info.user_id == "alice"
        assert run.data.params["long"] == "x" * 6000
        assert run.data.metrics["mrr"] == 0.1 and run.data.metrics["odd"] == 0.3
        assert math.isnan(client.get_metric_history(ids[side][0], "odd")[0].value)
        assert run.data.metrics["big"] == 1.7976931348623157e308
        assert "team" not in run.data.tags and run.data.tags["中文"] == "值"
        assert [d.dataset.digest for d in run.inputs.dataset_inputs] == ["abc12def"]
        assert run.inputs.dataset_inputs[0].tags[0].value == "eval"
        listed = sorted(a.path for a in client.list_artifacts(ids[side][0]))
        assert listed == ["cases.jsonl", "cases_table.json", "checkpoint", "sub"]
        second = client.get_run(ids[side][1])
        assert sorted(d.dataset.digest for d in second.inputs.dataset_inputs) == ["abc12def", "other"]
        found = client.search_runs([run.info.experiment_id], "tags.`ragexp.status` = 'finished'")
        assert [r.info.run_id for r in found] == [ids[side][0]]

    # A param keeps its first value: both refuse another, and the row stays.
    for side, store in stores.items():
        with pytest.raises(TrackingError, match=r"judge\.served"):
            store.log_params(ids[side][0], {"judge.served": "chat=other@fp|prompts=ab"})
        assert MlflowClient(uris[side]).get_run(ids[side][0]).data.params["judge.served"] == "chat=m@fp|prompts=ab"

    # The same files, byte for byte, where MLflow keeps them.
    trees = {}
    for side in stores:
        root = Path(MlflowClient(uris[side]).get_run(ids[side][0]).info.artifact_uri.removeprefix("file://"))
        trees[side] = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert trees["direct"] == trees["mlflow"] and len(trees["direct"]) == 4


def traces() -> list[CaseTrace]:
    cases = []
    for i, (error, score) in enumerate([(None, 1.0), ("timeout", None), (None, 0.25)]):
        cases.append(
            CaseTrace(
                case_id=f"case-{i}",
                question=f"问题 {i}？",
                answer=None if error else f"答案 {i}",
                error=error,
                latency_seconds=0.01 * (i + 1),
                ranked_ids=[f"doc-{i}", "doc-x"],
                contexts=[f"上下文 {i}"],
                timings={"retrieve": 0.004, "generate": 0.006},
                expectations={"relevant_ids": [f"doc-{i}"], "unanswerable": False},
                feedback=[
                    FeedbackRecord("mrr", score, None if error is None else "system call failed"),
                    FeedbackRecord("answer_correct", 1.0 if error is None else None, judge="judge-a", rationale="事实"),
                ],
            )
        )
    return cases


@pytest.mark.system
def test_traces_are_the_rows_mlflow_writes(tmp_path: Path) -> None:
    uris = {side: new_store(tmp_path / side) for side in ("mlflow", "direct")}
    stores = {"mlflow": Store(uris["mlflow"], direct=False), "direct": Store(uris["direct"])}
    runs = {side: store.create_run("traced", "run", {}, {}) for side, store in stores.items()}
    writers = {
        side: TraceWriter(store, str(store.experiment_id("traced", create=False)), runs[side])
        for side, store in stores.items()
    }
    # One plan (its random trace and span ids) written both ways; run ids mapped alike by dump().
    chunk = [plan_trace(case) for case in traces()]
    writers["mlflow"]._write_sql(chunk)
    direct = stores["direct"].sql_writer()
    assert direct is not None
    location = direct.experiment_location(writers["direct"].experiment_id)
    assert location is not None
    rows = writers["direct"]._rows(chunk, lambda tid: str(append_path(location, "traces", tid, "artifacts")), False)
    direct.insert_traces(rows, "test")
    mlflow_rows, direct_rows = dump(uris["mlflow"], TABLES), dump(uris["direct"], TABLES)
    for table in TABLES:
        assert direct_rows[table] == mlflow_rows[table], table
    assert len(direct_rows["assessments"]) == 3 * 4

    # Written through the run's own path, MLflow finds and reads them.
    assert writers["direct"].write(traces()) == 3
    assert trace_counts(uris["direct"], runs["direct"]) == (6, 24)
    client = MlflowClient(uris["direct"])
    found = client.search_traces(locations=[writers["direct"].experiment_id], run_id=runs["direct"])
    assert len(found) == 6
    names = {a.name for t in found for a in t.info.assessments}
    assert names == {"mrr", "answer_correct", "relevant_ids", "unanswerable"}


def test_its_copies_of_mlflow_rules_agree_with_mlflow(tmp_path: Path) -> None:
    for value in (True, False, 0, 1, 0.5, -2, 1e400, math.nan, math.inf, 10**400, "yes", " No ", "maybe", None, [1]):
        assert aggregate(value) == assessment_aggregate(value), value
    for location in (
        (tmp_path / "artifacts").as_uri(),
        (tmp_path / "artifacts").as_uri() + "/",
        (tmp_path / "folder with space" / "中文").as_uri(),
        "file://localhost/srv/mlruns",
    ):
        assert append_path(location, "run", "artifacts") == append_to_uri_path(location, "run", "artifacts")
    for location in ("s3://bucket/root", "file:relative/path", "mlflow-artifacts:/1", "file:///root?x=1"):
        assert append_path(location, "run") is None, location
    for key in ("mrr", "ragexp.status", "a/b", "with space", "c:d", "中文", "a..b", "x" * 250):
        assert valid_key(key), key
        _validate_tag(key, "v")
    for key in ("", "a//b", "../a", "/abs", "a/./b", "bad!", "tab\tkey", "x" * 251, "."):
        assert not valid_key(key), key


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_calls_mlflow_would_refuse_are_left_to_mlflow(tmp_path: Path) -> None:
    uri = new_store(tmp_path / "store")
    store = Store(uri)
    run = store.create_run("refusals", "run", {}, {})
    with pytest.raises(TrackingError, match="Invalid value"):
        store.set_tags(run, {"bad key!": "1"})
    with pytest.raises(TrackingError, match="Invalid value"):
        store.log_metrics(run, {"../up": 1.0})
    with pytest.raises(TrackingError, match=r"run-name|different values"):
        store.create_run("refusals", "one", {"mlflow.runName": "other"}, {})
    MlflowClient(uri).delete_run(run)
    for call in (
        lambda: store.set_tags(run, {"a": "b"}),
        lambda: store.log_metrics(run, {"mrr": 1.0}),
        lambda: store.end_run(run, "FINISHED"),
    ):
        with pytest.raises(TrackingError, match="must be in the 'active' state"):
            call()
    client = MlflowClient(uri)
    client.delete_experiment(client.get_experiment_by_name("refusals").experiment_id)
    with pytest.raises(TrackingError, match="must be in the 'active' state"):
        store.create_run("refusals", "late", {}, {})
    # Nothing of the refused calls reached the table.
    assert [row[0] for row in sqlite3.connect(uri.removeprefix("sqlite:///")).execute("SELECT name FROM runs")] == [
        "run"
    ]


@pytest.mark.system
def test_a_run_on_an_existing_store_does_not_import_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("RAGEXP_SQLITE_DIRECT", None)

    def run(*args: str, **extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE, "run", "provider=fake", *args],
            capture_output=True,
            text=True,
            env={**env, **extra},
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr.strip().splitlines()[-1]

    assert run() == "mlflow imported"  # a new store: MLflow creates its schema
    assert run() == "no mlflow"
    assert run("dataset=scifacts_zh", "provider=replay") == "no mlflow"
    assert run(**{DIRECT_ENV: "0"}) == "mlflow imported"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("ragexp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    for found in runs:
        traced = client.search_traces(locations=[experiment.experiment_id], run_id=found.info.run_id)
        assert len(traced) == int(found.data.tags["ragexp.traces.count"]) > 0
        assert found.data.tags["mlflow.loggedArtifacts"] == '[{"path": "cases_table.json", "type": "table"}]'
        assert len(found.inputs.dataset_inputs) == 1


def test_each_span_row_is_mlflows_own_encoding_of_the_span() -> None:
    """The one encoding of a span (plan -> ``spans.content``) against MLflow's entity, the oracle:
    the installed MLflow's ``Span.to_dict`` of the same span, key order and ``kind`` included."""
    import json

    from mlflow.entities import Span

    for trace in (plan_trace(case) for case in traces()):
        rows = trace_rows([trace], "1", "run", lambda _: {}, lambda tid: "file:///x")
        entities = span_entities(trace)
        assert len(rows["spans"]) == len(entities) == len(trace.spans)
        for row, entity in zip(rows["spans"], entities, strict=True):
            assert json.loads(row["content"]) == entity.to_dict()
            assert list(json.loads(row["content"])) == list(entity.to_dict())
            assert Span.from_dict(json.loads(row["content"])).name == entity.name
