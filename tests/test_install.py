"""The wheel built from this repository, installed into a fresh virtualenv outside it: it runs in
an empty folder, composes what the checkout composes (its config tree is the checkout's top-level
conf/, shipped as ragexp/conf), and a user's `ragexp init` folder runs and gates against a real
HTTP service."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.servers.procs import SAMPLE, serve
from tests.test_config_tree import JUDGE, PINNED

pytestmark = pytest.mark.system


def _uv() -> str:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed (make setup installs it into .venv)")
    return uv


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv, work = _uv(), tmp_path_factory.mktemp("wheel")
    subprocess.run([uv, "build", "--wheel", "--quiet", "--out-dir", str(work / "dist"), str(ROOT)], check=True)
    (wheel,) = (work / "dist").glob("ragexp-*.whl")
    venv = work / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    install = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin/python")]
    # The locked dependencies from uv's cache when it is warm, else from PyPI.
    if subprocess.run([*install, "--offline", "-r", str(ROOT / "requirements.lock")]).returncode != 0:
        subprocess.run([*install, "-r", str(ROOT / "requirements.lock")], check=True)
    subprocess.run([*install, "--no-deps", str(wheel)], check=True)
    return venv / "bin"


def ragexp(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGEXP_", "MLFLOW_", "PYTHON"))}
    env["RAGAS_DO_NOT_TRACK"] = "true"
    return subprocess.run(
        [str(bin_dir / "ragexp"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_installed_wheel_runs_in_an_empty_folder(bin_dir: Path, tmp_path: Path) -> None:
    assert not str(tmp_path).startswith(str(ROOT))
    default = ragexp(bin_dir, tmp_path, "run", "--json")
    assert default.returncode == 0, default.stderr
    payload = json.loads(default.stdout)
    assert (payload["case_count"], payload["error_count"]) == (35, 0)
    assert payload["config_hash"][:12] == PINNED[("sample", "kb_zh")]  # same hash as from the source tree
    assert (tmp_path / "mlruns/mlflow.db").is_file()
    replay = ragexp(bin_dir, tmp_path, "run", "dataset=scifacts_zh", "provider=replay", "--json")
    assert replay.returncode == 0, replay.stderr
    payload = json.loads(replay.stdout)
    assert (payload["case_count"], payload["error_count"]) == (25, 0)
    assert payload["config_hash"][:12] == PINNED[("replay", "scifacts_zh")]
    # The installed package answers from site-packages, not from this checkout.
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import ragexp.paths as p; print(p.package_conf())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "site-packages" in where.stdout and not where.stdout.startswith(str(ROOT / "ragexp"))


COMPOSE = """
import json, sys
from pathlib import Path
from ragexp.config.compose import compose
from ragexp.config.identity import resolved_config
from ragexp.paths import package_conf, packaged_trees
from ragexp.workflows.run_plan import plan_run
files = {str(p.relative_to(t)): p.read_text(encoding="utf-8") for t in packaged_trees() for p in t.rglob("*.yaml")}
out = {"conf": str(package_conf()), "files": files, "points": []}
for number, overrides in enumerate(json.loads(sys.argv[1])):
    config = compose(overrides)
    plan = plan_run(config, Path(f"state{number}"))
    out["points"].append({"hash": plan.config_hash, "judge": plan.judge, "config": resolved_config(config)})
print(json.dumps(out))
"""
"""Composes and plans each list of overrides given as JSON: the tree it read, its files, and per
list the config hash, the judge identity and the resolved config."""


def compose_points(python: Path, cwd: Path, combinations: list[list[str]]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGEXP_", "MLFLOW_", "PYTHON"))}
    env |= {"RAGAS_DO_NOT_TRACK": "true", "RAGEXP_JUDGE_API_KEY": "test-key", "RAGEXP_DIFY_AUTH": "Bearer test-key"}
    done = subprocess.run(
        [str(python), "-c", COMPOSE, json.dumps(combinations)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_wheel_and_the_checkout_compose_the_same_configs(bin_dir: Path, tmp_path: Path) -> None:
    with serve(JUDGE) as judge, serve(SAMPLE) as service:
        urls = [f"provider.judge.base_url={judge}", f"provider.judge.embeddings.url={judge}"]
        system = f"provider.system.url={service}"
        combinations = [
            [],
            ["provider=npu", "system=replay", "metrics=core", "dataset=scifacts_zh", *urls],
            ["provider=npu", "system=http", "metrics=core", system, *urls],
            ["provider=replay_judge", "metrics=full", "dataset=scifacts_zh", *urls],
            ["provider=fake", "metrics=retrieval", "gates=release_stat", "k=3"],
            ["provider=replay_judge", "dataset=scifacts_columns", "metrics=core", "k=10", *urls],
            ["system=http", "judge=mindie", "metrics=offline", system, *urls],
            ["system=dify", "metrics=retrieval", system],
            ["system=sample", "provider.system.sample.chunking=sentence", "provider.system.sample.top_k=3"],
            ["setup=scifacts_replay"],
            ["setup=release_check", system],
            ["setup=mindsdk_zh", "k=3", "experiment=mine", *urls],
        ]
        wheel_dir, checkout_dir = tmp_path / "wheel", tmp_path / "checkout"
        wheel_dir.mkdir()
        checkout_dir.mkdir()
        wheel = compose_points(bin_dir / "python", wheel_dir, combinations)
        checkout = compose_points(Path(sys.executable), checkout_dir, combinations)
    assert "site-packages" in wheel["conf"] and wheel["conf"].endswith("ragexp/conf")
    assert checkout["conf"] == str(ROOT / "conf")
    assert wheel["files"] == checkout["files"] and "setup/mindsdk_zh.yaml" in wheel["files"]
    hashes = [point["hash"] for point in checkout["points"]]
    assert len(set(hashes)) == len(combinations)  # each combination is another config
    assert hashes[0][:12] == PINNED[("sample", "kb_zh")]
    for overrides, mine, theirs in zip(combinations, wheel["points"], checkout["points"], strict=True):
        assert mine == theirs, overrides


def test_init_run_and_gate_from_the_installed_wheel(bin_dir: Path, tmp_path: Path) -> None:
    init = ragexp(bin_dir, tmp_path, "init")
    assert init.returncode == 0, init.stderr
    assert "ragexp run dataset=my_set system=my_service" in init.stdout
    system = tmp_path / "conf/system/my_service.yaml"
    run = ["run", "dataset=my_set", "system=my_service", "--json"]
    gate = ["gate", "dataset=my_set", "gates=my_release", "--json"]
    with serve(SAMPLE) as url:
        system.write_text(system.read_text(encoding="utf-8").replace("http://127.0.0.1:8000/query", url))
        baseline = ragexp(bin_dir, tmp_path, *run)
        candidate = ragexp(bin_dir, tmp_path, *run)
    for done in (baseline, candidate):
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["error_count"] == 0
    base_id, cand_id = json.loads(baseline.stdout)["run_id"], json.loads(candidate.stdout)["run_id"]
    # Two latencies of a few milliseconds differ by more than 20% by chance: the ratio is loosened.
    passed = ragexp(
        bin_dir,
        tmp_path,
        *gate,
        "--baseline",
        base_id,
        "--candidate",
        cand_id,
        "gates.rules.p95_seconds.max_increase_ratio=100",
    )
    assert passed.returncode == 0, passed.stdout + passed.stderr
    with serve(SAMPLE, "--citations", "none") as url:  # a worse service: its answers cite nothing
        system.write_text(system.read_text(encoding="utf-8").split("url:")[0] + f"url: {url}\n")
        worse = ragexp(bin_dir, tmp_path, *run)
    assert worse.returncode == 0, worse.stderr
    failed = ragexp(bin_dir, tmp_path, *gate, "--baseline", base_id, "--candidate", json.loads(worse.stdout)["run_id"])
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "citation_precision" in failed.stdout
