"""Sweeps on a Ray cluster (``hydra/launcher=ray``): a real ``ray start --head`` on 127.0.0.1 with two
CPUs, points logged to the shared tracking server (PostgreSQL-backed in CI), points' workers killed
(SIGKILL, as an OOM killer does) before and after their run exists; a Ray started by the sweep."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.servers.ray_head import QUIET_RAY, Cluster, descendants, ray_head

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two CPUs (two points at a time, each in a worker process), a 100 MB object store."""
    with ray_head(num_cpus=2, object_store_bytes=100_000_000) as head:
        yield head


def holders(path: Path) -> list[int]:
    """Processes (other than this one) with ``path`` open."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                found.append(int(proc.name))
    return found


def kill_the_reader(fifo: Path, cluster: Cluster, killed: list[int]) -> None:
    """Wait for a worker to open ``fifo`` (it then blocks reading it), SIGKILL that worker."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once a reader waits
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            time.sleep(0.1)
            continue
        try:
            while time.monotonic() < deadline and not (readers := holders(fifo)):
                time.sleep(0.05)
            for pid in readers:
                assert pid in descendants(cluster.head)  # a worker of this test's cluster, nothing else
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        finally:
            os.close(writer)
        return


def test_ray_sweep_on_a_cluster_with_a_worker_killed(cluster: Cluster, server: str, tmp_path: Path) -> None:
    experiment = f"ray-sweep-{time.time_ns()}"
    bundled = (ROOT / "ragexp/data/kb_zh/docs.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    # Five snapshots of the knowledge base (each lacks one document) and one on a share that hangs:
    # the point reading it blocks in its worker, which is then killed as an OOM killer would.
    snapshots = []
    for number in range(5):
        path = tmp_path / f"kb-{number}.jsonl"
        path.write_text("".join(line for i, line in enumerate(bundled) if i != number), encoding="utf-8")
        snapshots.append(path)
    hanging = tmp_path / "kb-share.jsonl"
    os.mkfifo(hanging)
    killed: list[int] = []
    killer = threading.Thread(target=kill_the_reader, args=(hanging, cluster, killed), daemon=True)
    killer.start()
    sweep = subprocess.Popen(
        [
            *RAGEXP,
            "run",
            "-m",
            "provider.system.sample.docs=" + ",".join(str(p) for p in [*snapshots, hanging]),
            "hydra/launcher=ray",
            f"hydra.launcher.ray.init.address={cluster.address}",  # attach; object_store_memory stays null
            "hydra.launcher.ray.remote.num_cpus=1",  # two points at a time on the two CPUs
            f"experiment={experiment}",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": server, **QUIET_RAY},
    )
    stdout, stderr = sweep.communicate(timeout=600)
    killer.join(timeout=30)
    assert len(killed) == 1, stderr

    assert sweep.returncode == 1, stderr  # one point failed: the sweep says so (as with joblib)
    outcome = json.loads(stdout)  # Ray's worker logs went to stderr, not into the JSON
    assert set(outcome["failed"]) == {"5"}
    reason = outcome["failed"]["5"]
    assert reason.startswith(f"[provider.system.sample.docs={hanging} experiment={experiment}] Ray task lost (")
    assert "died" in reason or "SIGKILL" in reason or "exit" in reason.lower(), reason
    assert "sweep point 5 [" in stderr and "failed: Ray task lost" in stderr

    runs = outcome["runs"]
    assert [r["point"] for r in runs] == [f"provider.system.sample.docs={p} experiment={experiment}" for p in snapshots]
    assert {r["status"] for r in runs} == {"FINISHED"}
    client = MlflowClient(server)
    parent = client.get_run(outcome["sweep"])
    assert parent.info.status == "FAILED"
    assert parent.data.tags["ragexp.sweep.failed.5"] == reason
    workers = set()
    for number, run in enumerate(runs):
        record = client.get_run(run["run_id"])
        tags = record.data.tags
        assert tags["mlflow.parentRunId"] == outcome["sweep"]
        assert tags["ragexp.sweep"] == outcome["sweep"] and tags["ragexp.sweep.num"] == str(number)
        assert record.data.metrics["case_count"] == 35 and record.data.metrics["error_rate"] == 0.0
        host, pid = tags["ragexp.sweep.worker"].rsplit(":", 1)
        assert host == socket.gethostname() and int(pid) != sweep.pid  # a worker of the cluster ran it
        workers.add(int(pid))
    assert len(workers) >= 2  # the points ran in the cluster's worker processes, two at a time
    # Every snapshot lacks one document: the points are different systems, and their runs say so.
    assert len({r["config_hash"] for r in runs}) == 5
    # The lost point left no run behind: its process died before it had one.
    listed = client.search_runs([parent.info.experiment_id], filter_string="tags.`ragexp.sweep.num` = '5'")
    assert listed == []


class KillingService(ThreadingHTTPServer):
    """The sample system over ragexp's HTTP contract; the first question of the sweep point
    ``number`` of ``experiment`` kills the worker process that asks it (its pid is on the point's
    run, ``ragexp.sweep.worker``), as if the process had run out of memory mid-run."""

    def __init__(self, tracking: str, experiment: str, number: str, cluster: Cluster) -> None:
        from ragexp.paths import package_data
        from ragexp.sample import SampleSystem, Settings, load_docs

        super().__init__(("127.0.0.1", 0), KillingHandler)
        self.system = SampleSystem(load_docs(package_data() / "kb_zh/docs.jsonl"), Settings())
        self.tracking, self.experiment, self.number, self.cluster = tracking, experiment, number, cluster
        self.killed: list[int] = []
        self.lock = threading.Lock()

    def kill_the_asker(self) -> None:
        with self.lock:
            if self.killed:
                return
            client = MlflowClient(self.tracking)
            experiment = client.get_experiment_by_name(self.experiment)
            runs = client.search_runs(
                [experiment.experiment_id], filter_string=f"tags.`ragexp.sweep.num` = '{self.number}'"
            )
            (run,) = runs  # the point asks only once its run exists
            pid = int(run.data.tags["ragexp.sweep.worker"].rsplit(":", 1)[1])
            assert pid in descendants(self.cluster.head)  # a worker of this test's cluster, nothing else
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


class KillingHandler(BaseHTTPRequestHandler):
    server: KillingService

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self.server.killed:
            self.server.kill_the_asker()
            return  # the asker is gone
        payload = json.dumps(self.server.system.answer(body["question"], body["k"])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_point_killed_mid_run_is_failed_and_resumes(cluster: Cluster, server: str, tmp_path: Path) -> None:
    experiment = f"ray-resume-{time.time_ns()}"
    service = KillingService(server, experiment, "1", cluster)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{service.server_address[1]}/query"
    # Two named setups in the user's ./conf (the sweep's working directory, not the workers'):
    # the sample system in-process, and the same system over HTTP, whose worker gets killed.
    (tmp_path / "conf/setup").mkdir(parents=True)
    (tmp_path / "conf/setup/inprocess.yaml").write_text("# @package _global_\nk: 3\n", encoding="utf-8")
    (tmp_path / "conf/setup/served.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - override /provider: http\nk: 3\nprovider:\n  system:\n    url: {url}\n",
        encoding="utf-8",
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": server, **QUIET_RAY}
    try:
        done = subprocess.run(
            [
                *RAGEXP,
                "run",
                "-m",
                "setup=inprocess,served",
                "hydra/launcher=ray",
                f"hydra.launcher.ray.init.address={cluster.address}",
                f"experiment={experiment}",
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert len(service.killed) == 1, done.stderr
        assert done.returncode == 1, done.stderr
        outcome = json.loads(done.stdout)
        assert set(outcome["failed"]) == {"1"} and "Ray task lost" in outcome["failed"]["1"]
        (finished,) = [r for r in outcome["runs"] if r["status"] == "FINISHED"]
        (lost,) = [r for r in outcome["runs"] if r["status"] == "FAILED"]
        assert finished["point"] == f"setup=inprocess experiment={experiment}"
        assert lost["point"] == f"setup=served experiment={experiment}"
        client = MlflowClient(server)
        tags = client.get_run(lost["run_id"]).data.tags
        assert tags["ragexp.status"] == "failed"
        assert tags["ragexp.stopped_because"].startswith("Ray task lost (")
        # The dead worker's run continues like any other: same run, every case, finished.
        resumed = subprocess.run(
            [*RAGEXP, "run", "setup=served", f"experiment={experiment}", "--resume", lost["run_id"], "--json"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["run_id"] == lost["run_id"]
        run = client.get_run(lost["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["ragexp.status"] == "finished"
        assert run.data.metrics["case_count"] == 35 and run.data.metrics["error_rate"] == 0.0
        assert "ragexp.stopped_because" not in run.data.tags
    finally:
        service.shutdown()
        service.server_close()


def test_ray_settings_that_would_break_attaching_are_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *RAGEXP,
            "run",
            "-m",
            "k=3,5",
            "hydra/launcher=ray",
            "hydra.launcher.ray.init.address=auto",
            "hydra.launcher.ray.init.object_store_memory=100000000",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", **QUIET_RAY},
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ragexp: error: config: hydra.launcher.ray.init.object_store_memory only applies to a Ray started by "
        "the sweep; with address=auto the cluster's own settings apply: leave it null"
    )
    assert "Traceback" not in done.stderr


def test_ray_sweep_without_an_address_starts_and_stops_a_ray_of_its_own(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = subprocess.Popen(
        [
            *RAGEXP,
            "run",
            "-m",
            "k=3,5",
            "hydra/launcher=ray",
            "hydra.launcher.ray.init.num_cpus=2",
            "hydra.launcher.ray.init.object_store_memory=100000000",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "MLFLOW_TRACKING_URI": uri, **QUIET_RAY},
    )
    stdout, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, stderr
    outcome = json.loads(stdout)
    assert [r["point"] for r in outcome["runs"]] == ["k=3", "k=5"] and outcome["failed"] == {}
    assert "Started a local Ray instance" in stderr
    client = MlflowClient(uri)
    assert client.get_run(outcome["sweep"]).info.status == "FINISHED"
    for run in outcome["runs"]:
        tags = client.get_run(run["run_id"]).data.tags
        assert tags["mlflow.parentRunId"] == outcome["sweep"]
        assert int(tags["ragexp.sweep.worker"].rsplit(":", 1)[1]) != sweep.pid  # a Ray worker ran it


def test_ray_launcher_without_the_extra_is_named_before_the_sweep(tmp_path: Path) -> None:
    # As in an install without ragexp[ray]: `import ray` finds nothing.
    hide_ray = (
        "import sys\nsys.modules['ray'] = None\n"
        "from ragexp.cli.app import main\nsys.argv = ['ragexp', *sys.argv[1:]]\nmain()\n"
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = subprocess.run(
        [sys.executable, "-c", hide_ray, "run", "-m", "k=3,5", "hydra/launcher=ray", "experiment=no-ray"],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "ragexp: error: config: hydra/launcher=ray needs Ray and hydra-ray-launcher: pip install 'ragexp[ray]'"
    ]
    assert MlflowClient(uri).get_experiment_by_name("no-ray") is None  # no parent run was made
