"""Sweeps (Hydra multirun, joblib launcher), parallel runs into one store, and a shared MLflow
tracking server (PostgreSQL-backed in CI via scripts/team-server.sh, else started here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def cli(*args: str, uri: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAGEXP, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        timeout=600,
    )


def test_run_diff_gate_and_report_over_http(server: str, tmp_path: Path) -> None:
    experiment = f"team-{time.time_ns()}"
    base = cli("run", "dataset=scifacts_zh", "provider=fake", f"experiment={experiment}", "--json", uri=server)
    cand = cli("run", "dataset=scifacts_zh", "provider=replay", f"experiment={experiment}", "--json", uri=server)
    assert base.returncode == 0 and cand.returncode == 0, base.stderr + cand.stderr
    base_id, cand_id = json.loads(base.stdout)["run_id"], json.loads(cand.stdout)["run_id"]
    diff = cli("diff", base_id, cand_id, "--json", uri=server)
    assert diff.returncode == 0, diff.stderr
    # Recall drops (p 0.06, not significant: still a drop) with MRR: the table's first row.
    assert json.loads(diff.stdout)["diagnosis"][0].startswith("recall and MRR down: look at parsing")
    gate = cli("gate", "--baseline", base_id, "--json", uri=server)  # candidate: newest finished run
    assert gate.returncode == 2 and json.loads(gate.stdout)["candidate"] == cand_id
    listing = json.loads(cli("runs", "--experiment", experiment, "--json", uri=server).stdout)["runs"]
    assert [r["run_id"] for r in listing] == [cand_id, base_id]
    report = cli("report", cand_id, "--baseline", base_id, "--out", str(tmp_path / "r"), uri=server)
    assert report.returncode == 0, report.stderr
    artifacts = {a.path for a in MlflowClient(server).list_artifacts(cand_id)}
    assert {"cases.jsonl", "scores.json", "report"} <= artifacts


@pytest.mark.parametrize("where", ["sqlite", "server"])
def test_parallel_runs_into_one_store_lose_nothing(where: str, server: str, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db" if where == "sqlite" else server
    experiment = f"parallel-{where}-{time.time_ns()}"
    points = [
        ("kb_zh", "fake", 3),
        ("kb_zh", "fake", 5),
        ("scifacts_zh", "replay", 3),
        ("scifacts_zh", "replay", 5),
        ("scifacts_zh", "fake", 1),
        ("kb_zh", "fake", 10),
    ]
    procs = [
        subprocess.Popen(
            [*RAGEXP, "run", f"dataset={d}", f"provider={p}", f"k={k}", f"experiment={experiment}", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        )
        for d, p, k in points
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(points), [err for _, err in outputs]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == len(points) and {r.info.status for r in runs} == {"FINISHED"}
    expected = {"kb_zh": 35, "scifacts_zh": 25}
    for run in runs:
        path = client.download_artifacts(run.info.run_id, "cases.jsonl", str(tmp_path / run.info.run_id))
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        assert len(lines) == expected[run.data.tags["ragexp.dataset"]] == run.data.metrics["case_count"]


def test_sweep_points_under_a_parent_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = cli("run", "-m", "provider=fake,replay", "k=3,5", "dataset=scifacts_zh", "--json", uri=uri)
    assert done.returncode == 0, done.stderr
    sweep = json.loads(done.stdout)
    assert len(sweep["runs"]) == 4 and sweep["failed"] == {}
    assert {r["point"] for r in sweep["runs"]} == {
        f"provider={p} k={k} dataset=scifacts_zh" for p in ("fake", "replay") for k in (3, 5)
    }
    client = MlflowClient(uri)
    parent = client.get_run(sweep["sweep"])
    assert parent.data.tags["ragexp.sweep.overrides"] == "provider=fake,replay k=3,5 dataset=scifacts_zh"
    assert parent.info.status == "FINISHED"
    for run in sweep["runs"]:
        assert client.get_run(run["run_id"]).data.tags["mlflow.parentRunId"] == sweep["sweep"]
    listing = json.loads(cli("runs", "--sweep", sweep["sweep"], "--json", uri=uri).stdout)["runs"]
    assert {r["run_id"] for r in listing} == {r["run_id"] for r in sweep["runs"]}
    by_point = {r["point"]: r["run_id"] for r in sweep["runs"]}
    diff = cli(
        "diff",
        by_point["provider=fake k=5 dataset=scifacts_zh"],
        by_point["provider=replay k=5 dataset=scifacts_zh"],
        "--json",
        uri=uri,
    )
    assert diff.returncode == 0
    incomparable = cli(
        "gate",
        "--baseline",
        by_point["provider=fake k=3 dataset=scifacts_zh"],
        "--candidate",
        by_point["provider=fake k=5 dataset=scifacts_zh"],
        uri=uri,
    )
    assert incomparable.returncode == 3 and "K differs" in incomparable.stderr


def test_joblib_sweep_with_a_failing_point(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = cli(
        "run",
        "-m",
        "provider=replay",
        "dataset=kb_zh,scifacts_zh",
        "k=3,5",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "--json",
        uri=uri,
    )
    assert done.returncode == 1  # a point failed...
    sweep = json.loads(done.stdout)
    assert len(sweep["runs"]) == 2 and set(sweep["failed"]) == {"0", "1"}  # ...and the others still ran
    assert all("needs output field 'retrieved_ids'" in reason for reason in sweep["failed"].values())
    assert "sweep point 0 failed" in done.stderr
    assert MlflowClient(uri).get_run(sweep["sweep"]).info.status == "FAILED"
    assert (ROOT / "conf/hydra/launcher/slurm.yaml").exists()
