"""Remote calls behind a proxy that loses replies or dies (tests/servers/dropproxy.py), against a
real tracking server: every call of ``run`` (trace writing included) and of ``gate --promote``
survives one lost reply, and a server that dies at any point of a run's tail ends the run within
``tracking.timeout_s``, with the checkpoint and the command that resumes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import write_jsonl
from tests.servers.procs import DROPPROXY, FAULTY, proxy_seen, serve, stats
from tests.test_compare import replay_rows
from tests.test_http import labelled

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts/"
LOCKS = "ragexp.promotion-lock."


def cli(*args: str, uri: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAGEXP, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri, **env},
        timeout=600,
    )


def route(path: str) -> str:
    """A request's path without its query; an artifact's path without the run it belongs to."""
    path = urlsplit(path).path
    return ARTIFACTS if path.startswith(ARTIFACTS) else path


def writes(seen: list[list[str]], *, first_only: bool = False) -> list[str]:
    """Every request but GETs as a proxy rule ("METHOD ROUTE#N": the Nth request to that route);
    ``first_only``: the first request to each route."""
    counted: Counter[tuple[str, str]] = Counter()
    rules = []
    for method, path, _action in seen:
        if method == "GET":
            continue
        counted[method, route(path)] += 1
        if not first_only or counted[method, route(path)] == 1:
            rules.append(f"{method} {route(path)}#{counted[method, route(path)]}")
    return rules


def dropped(url: str) -> list[str]:
    return [f"{method} {path}" for method, path, action in proxy_seen(url) if action == "dropped"]


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def promotion_locks(uri: str) -> list[str]:
    return [m.name for m in MlflowClient(uri).search_registered_models() if m.name.startswith(LOCKS)]


# --- ragexp run, trace writing included ------------------------------------------------------------


def test_every_call_of_a_run_survives_a_lost_reply(server: str, tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}, {"rank": 2}, {"rank": None}] * 2))
    client = MlflowClient(server)

    def run(*proxy_args: str) -> tuple[subprocess.CompletedProcess[str], str, list[list[str]]]:
        experiment = f"lost-run-{time.time_ns()}"
        with serve(DROPPROXY, "--upstream", server, *proxy_args) as url:
            done = cli(
                "run", f"dataset.path={rows}", "provider=replay", "k=3", f"experiment={experiment}", "--json", uri=url
            )
            return done, experiment, proxy_seen(url)

    reference, _, seen = run()
    assert reference.returncode == 0, reference.stderr
    base_metrics = client.get_run(json.loads(reference.stdout)["run_id"]).data.metrics
    # Each kind of request once (a run repeats log-batch and artifact uploads with other content).
    rules = writes(seen, first_only=True)
    # What a run writes, each of them once at least: the class holds whatever calls are added.
    assert {"POST /api/2.0/mlflow/runs/create#1", "POST /api/3.0/mlflow/traces#1", "POST /v1/traces#1"} <= set(rules)
    assert f"PUT {ARTIFACTS}#1" in rules and "POST /api/2.0/mlflow/runs/update#1" in rules
    for rule in rules:
        done, experiment, seen = run("--drop", rule)
        assert done.returncode == 0, f"{rule}: {done.stderr}"
        assert [action for *_, action in seen].count("dropped") == 1, rule
        outcome = json.loads(done.stdout)
        experiment_id = client.get_experiment_by_name(experiment).experiment_id
        runs = client.search_runs([experiment_id])
        assert [r.info.run_id for r in runs] == [outcome["run_id"]], f"{rule}: a duplicate run"
        record = runs[0]
        assert record.info.status == "FINISHED" and record.data.tags["ragexp.status"] == "finished", rule
        assert record.data.tags["ragexp.traces.count"] == "6", rule
        traces = client.search_traces(locations=[experiment_id])
        assert len(traces) == 6 and len({t.info.request_id for t in traces}) == 6, rule
        for name, value in base_metrics.items():
            if "seconds" in name:
                continue
            assert record.data.metrics[name] == value, f"{rule}: {name}"
            assert len(client.get_metric_history(record.info.run_id, name)) == 1, f"{rule}: {name} logged twice"
        artifacts = {a.path for a in client.list_artifacts(record.info.run_id)}
        assert {"cases.jsonl", "scores.json", "summary.json", "config.yaml"} <= artifacts, rule


# --- ragexp gate --promote -------------------------------------------------------------------------


def chain_of_runs(uri: str, tmp_path: Path, count: int) -> tuple[str, list[str]]:
    """``count`` comparable runs in a new experiment, the first one tagged role=production."""
    experiment = f"lost-gate-{time.time_ns()}"
    rows = write_jsonl(tmp_path / "gate-cases.jsonl", replay_rows([{"rank": 1}] * 6))
    ids = []
    for _ in range(count):
        done = cli(
            "run", f"dataset.path={rows}", "provider=replay", "k=3", f"experiment={experiment}", "--json", uri=uri
        )
        assert done.returncode == 0, done.stderr
        ids.append(json.loads(done.stdout)["run_id"])
    MlflowClient(uri).set_tag(ids[0], "role", "production")
    return MlflowClient(uri).get_experiment_by_name(experiment).experiment_id, ids


def holders(uri: str, experiment_id: str) -> list[str]:
    runs = MlflowClient(uri).search_runs([experiment_id], filter_string="tags.`role` = 'production'")
    return sorted(run.info.run_id for run in runs)


def gate(url: str, candidate: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    done = cli("gate", "--baseline", "tag:role=production", "--candidate", candidate, "--promote", "--json", uri=url)
    return done, time.perf_counter() - started


def test_every_call_of_a_promotion_survives_a_lost_reply(server: str, tmp_path: Path) -> None:
    experiment_id, (base, cand) = chain_of_runs(server, tmp_path, 2)
    client = MlflowClient(server)

    def reset() -> None:
        """The baseline holds the tag again and the candidate carries no record of a promotion."""
        client.set_tag(base, "role", "production")
        tags = client.get_run(cand).data.tags
        for name in ["role", *(t for t in tags if t.startswith("ragexp.promoted") or t.startswith("ragexp.gate."))]:
            if name in tags:
                client.delete_tag(cand, name)

    with serve(DROPPROXY, "--upstream", server) as url:
        done, _ = gate(url, cand)
        seen = proxy_seen(url)
    assert done.returncode == 0, done.stderr
    rules = writes(seen)
    assert {
        "POST /api/2.0/mlflow/registered-models/create#1",
        "DELETE /api/2.0/mlflow/registered-models/delete#1",
        "POST /api/2.0/mlflow/runs/delete-tag#1",
        "POST /api/2.0/mlflow/runs/log-batch#2",  # the tag onto the candidate
        "POST /api/2.0/mlflow/runs/log-batch#3",  # the ragexp.promoted* tags
    } <= set(rules)
    for rule in rules:
        reset()
        with serve(DROPPROXY, "--upstream", server, "--drop", rule) as url:
            done, seconds = gate(url, cand)
            lost = dropped(url)
        assert done.returncode == 0, f"{rule}: {done.stderr}"
        assert len(lost) == 1, rule
        promotion = json.loads(done.stdout)["promotion"]
        assert promotion["promoted"] is True and promotion["previous"] == [base], rule
        assert "warnings" not in promotion and not warnings(done.stderr), f"{rule}: {done.stderr}"
        assert holders(server, experiment_id) == [cand], rule
        tags = client.get_run(cand).data.tags
        assert tags["ragexp.promoted.from"] == base and tags["ragexp.gate.verdict"] == "passed", rule
        assert not promotion_locks(server), rule
        # Waiting on its own lock would take the 60 s a lock is waited for.
        assert seconds < 45, f"{rule}: {seconds:.0f} s"


@contextmanager
def held_proxy(upstream: str, tmp_path: Path, *args: str) -> Iterator[tuple[str, Path]]:
    """A proxy holding one reply until the yielded file is removed."""
    hold = tmp_path / f"hold-{time.time_ns()}"
    hold.touch()
    try:
        with serve(DROPPROXY, "--upstream", upstream, "--hold-file", str(hold), *args) as url:
            yield url, hold
    finally:
        hold.unlink(missing_ok=True)


def wait_held(url: str) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if any(action == "held" for *_, action in proxy_seen(url)):
            return
        time.sleep(0.05)
    raise AssertionError("nothing was held")


def test_a_lost_race_keeps_its_json_when_the_unlock_reply_is_lost(server: str, tmp_path: Path) -> None:
    experiment_id, (base, cand, rival) = chain_of_runs(server, tmp_path, 3)
    proxy_args = ("--hold", "POST /registered-models/create", "--drop", "DELETE /registered-models/delete")
    with held_proxy(server, tmp_path, *proxy_args) as (url, hold):
        result: list[tuple[subprocess.CompletedProcess[str], float]] = []
        worker = threading.Thread(target=lambda: result.append(gate(url, cand)))
        worker.start()
        wait_held(url)  # the gate holds the lock and waits for the answer to its creation
        client = MlflowClient(server)
        client.set_tag(rival, "role", "production")  # another pipeline (without a lock: a race)
        client.delete_tag(base, "role")
        hold.unlink()
        worker.join(timeout=300)
        lost = dropped(url)
    done, _seconds = result[0]
    assert lost and done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["passed"] is True and out["promotion"]["promoted"] is False
    assert out["promotion"]["previous"] == [rival]
    errors = [line for line in done.stderr.splitlines() if line.startswith("ragexp: error:")]
    assert errors == [errors[0]] and errors[0].startswith(
        f"ragexp: error: not promoted: tag role=production moved to {rival}"
    )
    assert holders(server, experiment_id) == [rival]
    assert not promotion_locks(server)


def test_a_tag_moved_between_the_reads_of_a_gate_is_read_again(server: str, tmp_path: Path) -> None:
    experiment_id, (base, cand, rival) = chain_of_runs(server, tmp_path, 3)
    with held_proxy(server, tmp_path, "--hold", "POST /runs/search#1") as (url, hold):
        result: list[tuple[subprocess.CompletedProcess[str], float]] = []
        worker = threading.Thread(target=lambda: result.append(gate(url, cand)))
        worker.start()
        wait_held(url)  # the gate has asked who holds the tag, and not heard yet
        client = MlflowClient(server)
        client.set_tag(rival, "role", "production")
        client.delete_tag(base, "role")
        hold.unlink()
        worker.join(timeout=300)
    done, _seconds = result[0]
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["baseline"] == rival and out["promotion"]["previous"] == [rival]
    assert holders(server, experiment_id) == [cand]


# --- a tracking server that dies during a run's tail ---------------------------------------------


@pytest.mark.parametrize(
    "dies_on",
    [
        "POST /api/2.0/mlflow/runs/log-batch#2",  # the run's metrics
        f"PUT {ARTIFACTS}#2",  # its artifacts
        "POST /api/3.0/mlflow/traces#3",  # its traces' infos
        "POST /v1/traces#1",  # their spans
    ],
)
def test_a_server_dead_during_the_tail_ends_the_run_within_its_timeout(
    server: str,
    tmp_path: Path,
    dies_on: str,
) -> None:
    timeout_s = 20
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"ok-{i}" for i in range(40)]))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # where checkpoints live for a server store
    experiment = f"dead-tail-{time.time_ns()}"
    with serve(FAULTY) as service:
        args = ["run", "provider=http", f"provider.system.url={service}", f"dataset.path={data}"]
        args += [f"experiment={experiment}", f"tracking.timeout_s={timeout_s}"]
        proxy = subprocess.Popen(
            [sys.executable, str(DROPPROXY), "--port", "0", "--upstream", server, "--die-on", dies_on],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proxy.stdout is not None
        url = proxy.stdout.readline().split()[-1]
        died: list[float] = []
        watcher = threading.Thread(target=lambda: (proxy.wait(), died.append(time.perf_counter())))
        watcher.start()
        try:
            stopped = cli(*args, uri=url, **env)
        finally:
            proxy.kill()
            watcher.join()
        ended = time.perf_counter()
        assert died, "the proxy never saw the request it dies on"
        waited = ended - died[0]
        asked = stats(service)
        assert stopped.returncode == 1, stopped.stderr
        lines = stopped.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ragexp: error: "), stopped.stderr
        checkpoints = list((tmp_path / "cache" / "ragexp" / "checkpoints").glob("*.jsonl"))
        assert len(checkpoints) == 1 and f"results so far are kept in {checkpoints[0]}" in lines[0]
        run_id = checkpoints[0].stem
        assert lines[0].endswith(f"continue with: ragexp run {' '.join(args[1:])} --resume {run_id}")
        assert len(checkpoints[0].read_bytes().splitlines()) == 40
        # A bound on a hang, not a speed test: MLflow's retries alone would take minutes.
        assert waited < timeout_s + 15, f"{waited:.0f} s after the server died"
        resumed = cli(*args, "--resume", run_id, "--json", uri=server, **env)
        assert resumed.returncode == 0, resumed.stderr
        assert stats(service) == asked  # every answer was kept: nothing was asked again
    client = MlflowClient(server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and json.loads(resumed.stdout)["error_count"] == 0
    assert len(client.search_traces(locations=[run.info.experiment_id])) == 40


# --- a run whose end the store refuses --------------------------------------------------------------

END_RUN = "POST /api/2.0/mlflow/runs/update"
"""MLflow's call that marks a run finished (``set_terminated``)."""


def test_a_failed_end_of_run_is_retried_then_said_with_how_to_finish(server: str, tmp_path: Path) -> None:
    # tracking.timeout_s=5 leaves MLflow's client one attempt per call: the retry is ragexp's.
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"ok-{i}" for i in range(12)]))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    experiment = f"end-run-{time.time_ns()}"
    client = MlflowClient(server)
    with serve(FAULTY) as service:
        args = ["run", "provider=http", f"provider.system.url={service}", f"dataset.path={data}"]
        args += [f"experiment={experiment}", "tracking.timeout_s=5", "metrics=retrieval"]
        # Refused once (503, never forwarded): the second attempt marks the run finished, exit 0.
        with serve(DROPPROXY, "--upstream", server, "--fail", f"{END_RUN}#1") as proxy:
            retried = cli(*args, "--json", uri=proxy, **env)
            seen = [action for method, path, action in proxy_seen(proxy) if f"{method} {path}" == END_RUN]
        assert retried.returncode == 0, retried.stderr
        assert seen == ["failed", "forwarded"]
        assert client.get_run(json.loads(retried.stdout)["run_id"]).info.status == "FINISHED"

        # The store never answers the end of the run: exit 1, one line saying the data is complete
        # and how to finish the run, which that command then does without asking any case again.
        with serve(DROPPROXY, "--upstream", server, "--fail", f"{END_RUN}#*") as proxy:
            stopped = cli(*args, uri=proxy, **env)
        assert stopped.returncode == 1
        lines = stopped.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ragexp: error: run "), stopped.stderr
        run_id = lines[0].split()[3].rstrip(":")
        assert "every case was evaluated and logged (its data is complete)" in lines[0]
        assert "it stays RUNNING until a resume finishes it, which asks no case again" in lines[0]
        assert lines[0].endswith(f"continue with: ragexp run {' '.join(args[1:])} --resume {run_id}")
        assert client.get_run(run_id).info.status == "RUNNING"
        asked = stats(service)
        finished = cli(*args, "--resume", run_id, "--json", uri=server, **env)
        assert finished.returncode == 0, finished.stderr
        assert stats(service) == asked
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["case_count"] == 12
    assert len(client.search_traces(locations=[run.info.experiment_id], run_id=run_id)) == 12
