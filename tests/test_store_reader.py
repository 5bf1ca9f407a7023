"""The mlflow-free SQLite reader behind ``diff``, ``gate``, ``runs`` and ``report``: it answers
exactly as MLflow's own store does, records what a comparison records where MLflow sees it, and
steps aside (MLflow reads) wherever it could not be sure of that."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp import artifacts
from ragexp.tracking.mlflow_sql.reader import SqliteReader, parse_filter
from ragexp.tracking.mlflow_sql.schema import KNOWN_REVISIONS, Declined
from ragexp.tracking.store import TAG_PREFIX, RunRecord, Store, tag_filter
from tests.conftest import IMPORT_PROBE, ROOT

pytestmark = pytest.mark.differential  # compared with MLflow: `make test-mlflow-next` reruns it


def mlflow_head_revision() -> str:
    """The newest schema migration of the installed mlflow (the one revision nothing follows)."""
    import mlflow

    folder = Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions"
    revisions, parents = set(), set()
    for path in folder.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = re.search(r'^revision = "(\w+)"', text, re.MULTILINE)
        if found:
            revisions.add(found.group(1))
            parents.update(
                re.findall(r'"(\w+)"', (re.search(r"^down_revision = (.+)$", text, re.MULTILINE) or [""])[0])
            )
    heads = revisions - parents
    assert len(heads) == 1, heads
    return heads.pop()


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_the_reader_knows_the_installed_mlflow_schema(ragexp: Any, store_uri: str) -> None:
    # An mlflow upgrade with a new migration fails here: check the reader's queries against the
    # new schema, then add the revision to KNOWN_REVISIONS (until then MLflow reads, slowly).
    head = mlflow_head_revision()
    assert head in KNOWN_REVISIONS
    assert ragexp("run", "provider=fake", "--json").code == 0
    db = store_uri.removeprefix("sqlite:///")
    assert sqlite3.connect(db).execute("SELECT version_num FROM alembic_version").fetchone()[0] == head


@pytest.fixture
def history(ragexp: Any, store_uri: str) -> dict[str, Any]:
    """Runs in two experiments, one failed, one deleted, one tagged, all in one store."""
    runs = {
        name: ragexp("run", *args, "--json").json()["run_id"]
        for name, args in {
            "fake": ["provider=fake"],
            "replay": ["provider=replay", "dataset=scifacts_zh"],
            "again": ["provider=fake"],
            "other": ["provider=fake", "experiment=other"],
            "gone": ["provider=fake"],
            "twin": ["provider=fake"],
        }.items()
    }
    client = MlflowClient(store_uri)
    client.set_tag(runs["fake"], "role", "production")
    client.set_tag(runs["again"], "role", "production")
    client.set_terminated(runs["again"], status="FAILED")
    client.delete_run(runs["gone"])
    client.log_metric(runs["fake"], "odd", float("nan"))
    return runs


def as_text(record: RunRecord) -> str:
    """A record for comparison: NaN equals NaN here, and order within the mappings is free."""
    return json.dumps(asdict(record), sort_keys=True)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_reads_match_mlflow(history: dict[str, Any], store_uri: str) -> None:
    direct, mlflow = Store(store_uri, must_exist=True), Store(store_uri, direct=False)
    assert direct._direct() is not None and mlflow._direct() is None
    for run_id in history.values():
        assert as_text(direct.get_run(run_id)) == as_text(mlflow.get_run(run_id))
        assert direct.read_artifact(run_id, artifacts.SCORES) == mlflow.read_artifact(run_id, artifacts.SCORES)
    assert direct.get_run(history["fake"]).metrics["odd"] != direct.get_run(history["fake"]).metrics["odd"]  # NaN
    assert direct.experiment_ids() == mlflow.experiment_ids()
    for name in ("ragexp", "other", "missing"):
        assert direct.experiment_id(name, create=False) == mlflow.experiment_id(name, create=False)
    ragexp_id = mlflow.experiment_id("ragexp", create=False)
    assert ragexp_id is not None
    assert direct.experiment_name(ragexp_id) == "ragexp"
    first = mlflow.get_run(history["fake"])
    newest = max(r.start_time for r in mlflow.iter_runs(mlflow.experiment_ids()))
    filters = [
        "",
        "attributes.status = 'FINISHED'",
        tag_filter("role", "production"),
        f"{tag_filter('role', 'production')} and attributes.status = 'FINISHED'",
        f"attributes.status = 'FINISHED' and attributes.start_time > {first.start_time}",
        f"attributes.status = 'FINISHED' and attributes.start_time < {newest}",  # compare/select.py
        f"tags.`{TAG_PREFIX}config_hash` LIKE '{first.tag('config_hash')[:6]}%'",
        f"tags.`{TAG_PREFIX}config_hash` LIKE '{first.tag('config_hash')[:6].upper()}%'",  # case-sensitive
    ]
    every = mlflow.experiment_ids()
    for text in filters:
        assert parse_filter(text) is not None, text
        want = [r.run_id for r in mlflow.iter_runs(every, text)]
        assert [r.run_id for r in direct.iter_runs(every, text, page_size=2)] == want, text
        assert [r.run_id for r in direct.search("ragexp", limit=2, filter_string=text)] == [
            r.run_id for r in mlflow.search("ragexp", limit=2, filter_string=text)
        ], text
    assert history["gone"] not in [r.run_id for r in direct.iter_runs(every)]
    assert history["gone"] == direct.get_run(history["gone"]).run_id  # by id, as MLflow: deleted or not


def test_filters_it_does_not_know_go_to_mlflow() -> None:
    for text in ("metrics.mrr > 0.5", "tags.`a` = 'b' or tags.`c` = 'd'", "params.k = '5'", "attributes.status != 'X'"):
        assert parse_filter(text) is None, text
    assert parse_filter("tags.`a and b` = 'x and y' and attributes.status = 'FINISHED'") is not None


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_an_unknown_schema_or_workspaces_leave_reading_to_mlflow(
    history: dict[str, Any], store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Path(store_uri.removeprefix("sqlite:///"))
    SqliteReader.open(db, store_uri).close()
    monkeypatch.setenv("MLFLOW_ENABLE_WORKSPACES", "true")
    with pytest.raises(Declined) as declined:
        SqliteReader.open(db, store_uri)
    assert declined.value.reason is None  # this store's calls only: nothing to say
    monkeypatch.delenv("MLFLOW_ENABLE_WORKSPACES")
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'a1b2c3d4e5f6'")
    with pytest.raises(Declined) as declined:
        SqliteReader.open(copy, f"sqlite:///{copy}")
    assert declined.value.reason is not None and "schema revision a1b2c3d4e5f6" in declined.value.reason
    # Checked again at every read: a reader opened before a migration reads no more.
    reader = SqliteReader.open(db, store_uri)
    assert reader.get_run(history["fake"]).run_id == history["fake"]
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'a1b2c3d4e5f6'")
    with pytest.raises(Declined, match="a1b2c3d4e5f6"):
        reader.get_run(history["fake"])


@pytest.mark.system
def test_diff_and_gate_read_without_mlflow_and_record_where_mlflow_sees_it(
    history: dict[str, Any], store_uri: str
) -> None:
    base, cand = history["fake"], history["twin"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri}
    outputs = {}
    for command in (["diff", base, cand, "--json"], ["gate", "--baseline", base, "--candidate", cand], ["runs"]):
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE, *command], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert done.returncode in (0, 2), done.stderr
        assert done.stderr.strip().endswith("no mlflow"), (command, done.stderr)
        outputs[command[0]] = done.stdout
    run = MlflowClient(store_uri).get_run(cand)
    assert run.data.tags[TAG_PREFIX + "gate.baseline"] == base
    assert run.data.tags[TAG_PREFIX + "gate.verdict"] in ("passed", "failed")
    listed = {a.path for a in MlflowClient(store_uri).list_artifacts(cand, f"comparisons/{base}")}
    assert listed == {f"comparisons/{base}/diff.json", f"comparisons/{base}/gate.json"}
    recorded = Store(store_uri).read_artifact(cand, f"comparisons/{base}/diff.json")
    assert json.loads(recorded) == json.loads(outputs["diff"])
    assert base in outputs["runs"] and cand in outputs["runs"]
