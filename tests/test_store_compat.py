"""The compatibility check of every direct path (the store's alembic revision, read again inside
each write, and the installed MLflow): on anything it was not checked against, ragexp writes
nothing itself, MLflow's public API writes instead and one line on stderr says why; and no store
is migrated, or opened against MLflow's own advice, without being asked."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from mlflow.store.db.utils import _get_alembic_config
from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase
from mlflow.tracking import MlflowClient

from ragexp.errors import TrackingError
from ragexp.tracking.mlflow_sql.schema import installed_mlflow
from ragexp.tracking.store import UPGRADE_ENV, Store
from tests.conftest import ROOT, invoke

OLDER = "b7e2c1a4d9f3"
"""MLflow 3.16's newest migration: a real schema the installed MLflow migrates on open."""


def revision(db: Path) -> str:
    return str(sqlite3.connect(db).execute("SELECT version_num FROM alembic_version").fetchone()[0])


def older_store(folder: Path) -> tuple[str, Path]:
    """A store created by MLflow's own migrations up to an older revision than the installed head."""
    folder.mkdir(parents=True)
    db = folder / "mlflow.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)  # what MLflow creates before its migrations
    engine.dispose()
    command.upgrade(_get_alembic_config(f"sqlite:///{db}"), OLDER)
    return f"sqlite:///{db}", db


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_an_older_store_is_not_migrated_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri, db = older_store(tmp_path / "mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(UPGRADE_ENV, "")
    refused = invoke("run", "provider=fake", "--json")
    assert refused.code == 1 and refused.stdout == ""
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1, refused.stderr
    assert f"schema revision {OLDER}" in line and f"MLflow {installed_mlflow()}" in line
    assert "older MLflow clients could no longer open it" in line
    assert "back the store up" in line and "--allow-store-upgrade" in line and "mlflow db upgrade" in line
    assert revision(db) == OLDER  # untouched
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_an_unknown_revision_is_written_by_mlflows_public_api_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, db = older_store(tmp_path / "mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(UPGRADE_ENV, "")  # restored after the test: --allow-store-upgrade sets it
    monkeypatch.delenv("RAGEXP_SQLITE_DIRECT", raising=False)
    done = invoke("run", "provider=fake", "--allow-store-upgrade", "--json")
    assert done.code == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "using MLflow's API instead" in line]
    assert len(said) == 1 and f"schema revision {OLDER}" in said[0], done.stderr
    result = done.json()
    # MLflow migrated the store when asked to, and wrote every row itself: its public tracing API
    # leaves client_request_id empty where ragexp's rows carry the case id.
    assert revision(db) != OLDER
    rows = sqlite3.connect(db).execute("SELECT client_request_id FROM trace_info").fetchall()
    assert len(rows) == result["case_count"] and all(row[0] is None for row in rows)
    client = MlflowClient(uri)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["ragexp.status"] == "finished"
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=result["run_id"])
    assert len(traces) == result["case_count"] == int(run.data.tags["ragexp.traces.count"])
    metrics = set(result["summary"]) - {"p95_seconds", "error_rate"}
    for trace in traces:
        names = {a.name for a in trace.info.assessments}
        assert "unanswerable" in names, names
        assert len(trace.data.spans) >= 2 and trace.data.spans[0].name == "rag_case"
        assert names & metrics
        assert trace.info.trace_metadata["ragexp.case_id"]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_store_migrated_in_the_middle_of_a_process_is_not_written_directly_again(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).search_experiments()
    store = Store(uri)
    run = store.create_run("mid", "run", {}, {})
    store.log_metrics(run, {"before": 1.0})
    assert store.sql_writer() is not None
    db = tmp_path / "mlflow.db"
    # Another process with a newer MLflow migrates the store (its revision is all that shows).
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    with pytest.raises(TrackingError, match="migrated by a newer MLflow") as refused:
        store.log_metrics(run, {"after": 2.0})
    assert "ffffffffffff" in str(refused.value) and "mlflow db upgrade" in str(refused.value)
    keys = {row[0] for row in sqlite3.connect(db).execute("SELECT key FROM metrics")}
    assert keys == {"before"}
    assert store.sql_writer() is None  # no direct path for the rest of the process


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_store_of_a_newer_mlflow_is_named_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    MlflowClient(uri).search_experiments()
    db = tmp_path / "mlruns" / "mlflow.db"
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for args in (("run", "provider=fake"), ("runs",)):
        done = invoke(*args)
        assert done.code == 1
        line = done.stderr.strip()
        assert len(line.splitlines()) == 1, done.stderr
        assert f"migrated by a newer MLflow than the installed {installed_mlflow()}" in line
        assert "ffffffffffff" in line and "out-of-date" not in line


CLI = "import sys\nfrom ragexp.cli.app import main\nsys.argv = ['ragexp', *sys.argv[1:]]\nmain()\n"
NEXT = ROOT / ".venv-next" / "bin" / "python"
"""A second virtualenv with a newer MLflow (see docs/mlflow.md), when one is set up."""


def next_mlflow() -> str | None:
    if not NEXT.exists():
        return None
    done = subprocess.run(
        [str(NEXT), "-c", "import importlib.metadata as m; print(m.version('mlflow'))"], capture_output=True, text=True
    )
    version = done.stdout.strip()
    return version if done.returncode == 0 and version != installed_mlflow() else None


@pytest.mark.system
@pytest.mark.skipif(next_mlflow() is None, reason="no .venv-next with an MLflow newer than the installed one")
def test_stores_across_two_mlflow_releases_are_never_migrated_or_misread(tmp_path: Path) -> None:
    newer = str(next_mlflow())
    env = {**os.environ, "RAGEXP_ALLOW_STORE_UPGRADE": ""}
    # A store the newer MLflow created, opened here: read directly (its tables are the same),
    # and the call MLflow would have to make here is refused naming the MLflow that reads it.
    ahead = tmp_path / "ahead" / "mlflow.db"
    ahead.parent.mkdir()
    made = subprocess.run(
        [
            str(NEXT),
            "-W",
            "ignore",
            "-c",
            f"from mlflow import MlflowClient; MlflowClient('sqlite:///{ahead}').search_experiments()",
        ],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    head = revision(ahead)
    monkeypatched = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{ahead}"}
    listed = subprocess.run(
        [sys.executable, "-c", CLI, "runs"], capture_output=True, text=True, env=monkeypatched, cwd=ROOT
    )
    assert listed.returncode == 0, listed.stderr
    refused = subprocess.run(
        [sys.executable, "-c", CLI, "run", "provider=fake"], capture_output=True, text=True, env=monkeypatched, cwd=ROOT
    )
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    assert f"migrated by a newer MLflow than the installed {installed_mlflow()}" in line and head in line, line
    assert f"MLflow {'.'.join(newer.split('.')[:2])}" in line
    # A store of this MLflow, opened by the newer one: refused before it would migrate it.
    behind = tmp_path / "behind" / "mlflow.db"
    behind.parent.mkdir()
    MlflowClient(f"sqlite:///{behind}").search_experiments()
    before = revision(behind)
    late = subprocess.run(
        [str(NEXT), "-W", "ignore", "-c", CLI, "run", "provider=fake", "experiment=fresh"],
        capture_output=True,
        text=True,
        env={**env, "MLFLOW_TRACKING_URI": f"sqlite:///{behind}"},
        cwd=ROOT,
    )
    assert late.returncode == 1
    line = late.stderr.strip().splitlines()[-1]
    assert f"schema revision {before}" in line and f"installed MLflow {newer} would migrate it" in line, line
    assert revision(behind) == before
