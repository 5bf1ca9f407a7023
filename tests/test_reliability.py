"""Off the happy path, against real processes: secrets, deadlines, resume, interrupts, a dead
tracking server, a full disk, a read-only store, bounds, and malformed replies."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import FAULTY, free_port, mlflow_server, serve, stats
from tests.test_http import labelled

FAST = ["provider.system.backoff_s=0.01", "provider.system.timeout_s=1", "provider.system.max_retries=1"]
JUDGE = ROOT / "tests/servers/judge.py"
SECRET = "s3cr3t-tok/en+4f9a"
"""A token with characters that URL-encoding changes, so every spelling of it can be looked for."""


def spellings(secret: str) -> list[str]:
    return [
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        urllib.parse.quote(secret),  # "/" kept: how most clients put a token in a URL
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret),
    ]


def run_cmd(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return [sys.executable, "-m", "ragexp.cli.app", *args]


def spawn(args: list[str], store_uri: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ragexp.cli.app", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": store_uri, **env},
    )


def everything_recorded(store_uri: str, run_id: str, tmp_path: Path) -> list[str]:
    """Params, tags, metrics, every artifact and every local state file of a run, as text."""
    client = MlflowClient(store_uri)
    run = client.get_run(run_id)
    texts = [json.dumps(run.data.params), json.dumps(run.data.tags), json.dumps(run.data.metrics)]
    folder = Path(client.download_artifacts(run_id, "", str(tmp_path / f"artifacts-{run_id}")))
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in folder.rglob("*") if p.is_file()]
    state = Path(store_uri.removeprefix("sqlite:///")).parent / "checkpoints"
    if state.exists():
        texts += [p.read_text(encoding="utf-8", errors="replace") for p in state.rglob("*.jsonl")]
    return texts


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / f"rows-{run_id}"))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def only_run(store_uri: str, experiment: str = "ragexp") -> Any:
    client = MlflowClient(store_uri)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(found) == 1
    return found[0]


# --- secrets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["\r\n", "\n", " \t"])
def test_a_secret_with_a_line_ending_is_stripped_and_never_recorded(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}{ending}")
    # echo-2 quotes the token back in its answer; dropall cases make the run abort, so the stop
    # reason, the checkpoint and its uploaded copy are written too.
    ids = ["ok-1", "echo-2", "leak-3", "echoq-4", *[f"dropall-{i}" for i in range(6)]]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    auth = "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH"
    with serve(FAULTY, env={**os.environ, "FAULTY_TOKEN": SECRET}) as url:
        common = ["provider=http", f"provider.system.url={url}", f"dataset.path={data}", auth, *FAST]
        common += ["concurrency=1", "provider.system.abort_after=3"]
        aborted = ragexp("run", *common)
        run_id = only_run(store_uri).info.run_id
        resumed = ragexp("run", *common, "--resume", run_id, "--retry-errors")
    assert aborted.code == 1 and "failed 3 calls in a row" in aborted.stderr
    assert resumed.code == 1  # aborts again on the dropped connections, after the others answered
    rows_seen = everything_recorded(store_uri, run_id, tmp_path)
    texts = [aborted.stdout, aborted.stderr, resumed.stdout, resumed.stderr, *rows_seen]
    for spelling in spellings(SECRET):
        assert not any(spelling in text for text in texts), spelling
    checkpoint = Path(store_uri.removeprefix("sqlite:///")).parent / "checkpoints" / f"{run_id}.jsonl"
    kept = {json.loads(line)["id"]: json.loads(line) for line in checkpoint.read_bytes().splitlines()}
    assert kept["ok-1"]["error"] is None  # the stripped header was accepted by the service
    assert "invalid token ***" in kept["echo-2"]["output"]["answer"]
    assert "cb?t=*** fact 4" in kept["echoq-4"]["output"]["answer"]
    assert kept["leak-3"]["error"] == "contract: response is not JSON (oops ***)"


@pytest.mark.parametrize(
    ("value", "what"),
    [("Bearer ab\x01cd", "a control character"), ("Bearer tök€n", "a non-ASCII character")],
)
def test_a_secret_that_cannot_be_a_header_is_refused_naming_the_variable(
    ragexp: Any, store_uri: str, monkeypatch: pytest.MonkeyPatch, value: str, what: str
) -> None:
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", value)
    with serve(FAULTY) as url:
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url={url}",
            "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH",
        )
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "RAGEXP_SYSTEM_AUTH" in result.stderr and what in result.stderr
    assert value.split()[1] not in result.stderr
    assert MlflowClient(store_uri).get_experiment_by_name("ragexp") is None  # no run was created


def test_url_credentials_are_masked_everywhere_and_the_header_wins(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password, query_key = "pw-hunter2-x", "qk-0xdeadbeef"
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}")
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(["ok-1", "ok-2", "notimpl-3"]))
    with serve(FAULTY, env={**os.environ, "FAULTY_TOKEN": SECRET}) as url:
        port = urllib.parse.urlsplit(url).port
        secret_url = f"http://alice:{password}@127.0.0.1:{port}/query?api_key={query_key}&v=2"
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url='{secret_url}'",
            f"dataset.path={data}",
            "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH",
            "--json",
            *FAST,
        )
        wrong = ragexp(  # no header: user:password goes as basic auth, which the service refuses
            "run", "provider=http", f"provider.system.url='{secret_url}'", f"dataset.path={data}", *FAST
        )
    assert result.code == 0, result.stderr
    assert result.json()["error_count"] == 1  # ok-1 and ok-2 authorised: the Bearer header was sent
    assert "carries credentials (user:password@)" in result.stderr and "Authorization header is sent" in result.stderr
    assert wrong.code == 1 and "every case errored" in wrong.stderr and "HTTP 401" in wrong.stderr
    params = MlflowClient(store_uri).get_run(result.json()["run_id"]).data.params
    assert params["provider.system.url"] == f"http://***@127.0.0.1:{port}/query?api_key=***&v=2"
    texts = [
        result.stdout,
        result.stderr,
        wrong.stderr,
        *everything_recorded(store_uri, result.json()["run_id"], tmp_path),
    ]
    for secret in (password, query_key, SECRET):
        assert not any(secret in text for text in texts), secret


def test_the_judge_key_is_stripped_scrubbed_and_never_recorded(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", f"{SECRET}\r\n")
    args = [
        "dataset=scifacts_zh",
        "metrics.names=[faithfulness]",
        "provider=replay_judge",
        "provider.judge.api_key_env=RAGEXP_TEST_JUDGE_KEY",
        "provider.judge.max_retries=0",
    ]
    with serve(JUDGE, "--api-key", SECRET) as url:
        good = ragexp("run", *args, f"provider.judge.base_url={url}", f"provider.judge.embeddings.url={url}", "--json")
    with serve(JUDGE, "--leak-key") as url:
        leaky = ragexp(
            "run",
            *args,
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.cache=false",
        )
    assert good.code == 0, good.stderr
    reasons = [row.get("metric_errors", {}) for row in rows_of(store_uri, good.json()["run_id"], tmp_path).values()]
    assert good.json()["summary"]["faithfulness"] is not None
    assert not any("401" in text for errors in reasons for text in errors.values())  # the stripped key passed
    assert leaky.code == 1  # the judge answered nothing usable: the run stopped, in one line
    # The token is masked; whether "Bearer " before it is too depends on what an earlier command in
    # this process registered (the registry is per process), so either spelling is right here.
    assert leaky.stderr.count("\n") == 1 and re.search(r"\(invalid key (Bearer )?\*\*\*\)", leaky.stderr)
    texts = [good.stdout, good.stderr, leaky.stdout, leaky.stderr]
    for run in MlflowClient(store_uri).search_runs(
        [MlflowClient(store_uri).get_experiment_by_name("ragexp").experiment_id]
    ):
        texts += everything_recorded(store_uri, run.info.run_id, tmp_path)
    for spelling in spellings(SECRET):
        assert not any(spelling in text for text in texts), spelling


# --- no hangs ----------------------------------------------------------------------------------


def test_the_timeout_is_a_deadline_for_the_whole_attempt(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(["ok-1", "trickle-2", "ok-3"]))
    with serve(FAULTY) as url:
        started = time.perf_counter()
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            "provider.system.timeout_s=1",
            "provider.system.max_retries=1",
            "provider.system.backoff_s=0.01",
            "--json",
        )
        elapsed = time.perf_counter() - started
    assert result.code == 0, result.stderr
    assert result.json()["error_count"] == 1
    # Headers came at once and a byte a second after: only a deadline on the whole attempt ends it.
    assert elapsed < 20
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["trickle-2"]["error"] == "timed out after 1 s after 2 attempts"


def test_a_service_that_never_answers_aborts_the_run(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"hang-{i}" for i in range(35)]))
    with serve(FAULTY) as url:
        started = time.perf_counter()
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            "provider.system.timeout_s=0.5",
            "provider.system.max_retries=0",
            "provider.system.abort_after=3",
            "concurrency=1",
        )
        elapsed = time.perf_counter() - started
        attempts = stats(url)
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "the service failed 3 calls in a row from the start: timed out after 0.5 s" in result.stderr
    assert len(attempts) == 3 and elapsed < 20
    run = only_run(store_uri)
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"


def test_a_failing_judge_aborts_after_its_configured_number_of_calls(
    ragexp: Any, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve(JUDGE, "--fail-all") as url:
        result = ragexp(
            "run",
            "dataset=scifacts_zh",
            "metrics=core",
            "provider=replay_judge",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=null",
            "provider.judge.max_retries=0",
            "provider.judge.abort_after=3",
            "provider.judge.concurrency=1",
        )
        calls = stats(url)
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "the judge failed 3 calls in a row from the start: HTTP 503" in result.stderr
    assert calls["chat"] + calls["embeddings"] <= 4  # one call may be in flight when it stops


@pytest.mark.system
def test_a_tracking_server_killed_mid_run_fails_in_bounded_time_and_resume_completes(tmp_path: Path) -> None:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    ids = [f"ok-{i}" for i in range(300)]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # where checkpoints live for a server store
    args = ["run", "provider=http", f"dataset.path={data}", "concurrency=2", "tracking.timeout_s=30"]
    with serve(FAULTY, "--delay-ms", "20") as url:
        args.append(f"provider.system.url={url}")
        with mlflow_server(tmp_path / "server", port):
            proc = spawn(args, uri, **env)
            checkpoints = tmp_path / "cache" / "ragexp" / "checkpoints"
            deadline = time.time() + 180
            while time.time() < deadline and not any(p.stat().st_size for p in checkpoints.glob("*.jsonl")):
                time.sleep(0.05)
            assert list(checkpoints.glob("*.jsonl")), "the run did not start"
        # The server is gone (killed) while the run still evaluates.
        killed_at = time.perf_counter()
        _out, err = proc.communicate(timeout=300)
        waited = time.perf_counter() - killed_at
        assert proc.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ragexp: error: ")
        run_id = next(checkpoints.glob("*.jsonl")).stem
        assert "results so far are kept in" in lines[0]
        assert lines[0].endswith(
            f"when the store answers again; continue with: ragexp run {' '.join(args[1:])} --resume {run_id}"
        )
        # 300 cases x 20 ms over 2 workers is about 3 s of evaluation; then at most the 30 s bound.
        assert waited < 90
        saved = len(next(checkpoints.glob("*.jsonl")).read_bytes().splitlines())
        assert saved == 300
        before = stats(url)
        with mlflow_server(tmp_path / "server", port):
            resumed = subprocess.run(
                [sys.executable, "-m", "ragexp.cli.app", *args, "--resume", run_id, "--json"],
                capture_output=True,
                text=True,
                env={**os.environ, "MLFLOW_TRACKING_URI": uri, **env},
                timeout=300,
            )
            assert resumed.returncode == 0, resumed.stderr
            run = MlflowClient(uri).get_run(run_id)
        after = stats(url)
    assert resumed.stdout and json.loads(resumed.stdout)["case_count"] == 300
    assert json.loads(resumed.stdout)["error_count"] == 0
    assert run.info.status == "FINISHED" and run.data.tags["ragexp.status"] == "finished"
    assert after == before  # every answer was kept: nothing was asked again
    assert "ragexp.stopped_because" not in run.data.tags


def test_an_unreachable_tracking_server_is_one_line_at_once(ragexp: Any) -> None:
    started = time.perf_counter()
    result = ragexp("runs", "--tracking-uri", "http://127.0.0.1:1/")
    assert time.perf_counter() - started < 10
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "tracking server http://127.0.0.1:1/ is not reachable" in result.stderr


# --- resume ------------------------------------------------------------------------------------


def checkpoint_dir(store_uri: str) -> Path:
    return Path(store_uri.removeprefix("sqlite:///")).parent / "checkpoints"


def wait_for_lines(folder: Path, at_least: int) -> Path:
    deadline = time.time() + 60
    while time.time() < deadline:
        files = list(folder.glob("*.jsonl")) if folder.exists() else []
        if files and len(files[0].read_bytes().splitlines()) >= at_least:
            return files[0]
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


@pytest.mark.system
def test_kill9_then_resume_asks_no_answered_case_again(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    ids = [f"ok-{i}" for i in range(400)]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(FAULTY, "--delay-ms", "10") as url:
        args = ["run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=4"]
        proc = spawn([*args, "--json"], store_uri)
        checkpoint = wait_for_lines(checkpoint_dir(store_uri), 150)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        resumed = ragexp(*args, "--resume", checkpoint.stem, "--json")
        asked = stats(url)
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["case_count"] == 400 and resumed.json()["error_count"] == 0
    requests = sum(len(times) for times in asked.values())
    # Only what was in flight at the kill (at most one a worker) is asked twice.
    assert 400 <= requests <= 404


def test_resume_retries_transport_failures_and_brings_the_tags_up_to_date(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    gate = tmp_path / "maintenance"
    gate.touch()
    ids = [*[f"ok-{i}" for i in range(4)], "contract-4", *[f"gated-{i}" for i in range(6)]]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(FAULTY, "--gate-file", str(gate)) as url:
        args = ["run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=1", *FAST]
        first = ragexp(*args, "provider.system.abort_after=4")
        run_id = only_run(store_uri).info.run_id
        tags = MlflowClient(store_uri).get_run(run_id).data.tags
        assert first.code == 1 and tags["ragexp.status"] == "aborted" and "503" in tags["ragexp.stopped_because"]
        gate.unlink()  # the service is back
        before = stats(url)
        resumed = ragexp(*args, "--resume", run_id, "--json")
        middle = stats(url)
        again = ragexp(*args, "experiment=other", "--json")  # a second, uninterrupted run for comparison
        assert again.code == 0
    assert resumed.code == 0, resumed.stderr
    asked = {case for case in middle if len(middle[case]) > len(before.get(case, []))}
    assert asked == {f"gated-{i}" for i in range(6)}  # transport failures only; the contract error stays
    assert resumed.json()["error_count"] == 1
    run = MlflowClient(store_uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ragexp.status"] == "finished"
    assert "ragexp.stopped_because" not in run.data.tags
    assert resumed.json()["summary"] == {
        key: value for key, value in again.json()["summary"].items() if key != "p95_seconds"
    } | {"p95_seconds": resumed.json()["summary"]["p95_seconds"]}


def test_retry_errors_asks_the_other_failures_again(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    ids = ["ok-1", "contract-2", "bad400-3", "dropall-4", "dropall-5"]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(FAULTY) as url:
        args = ["run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=1", *FAST]
        args.append("provider.system.abort_after=2")
        assert ragexp(*args).code == 1  # aborted on the dropped connections
        run_id = only_run(store_uri).info.run_id
        first = stats(url)
        assert ragexp(*args, "--resume", run_id).code == 1
        second = stats(url)
        assert ragexp(*args, "--resume", run_id, "--retry-errors").code == 1
        third = stats(url)

    def asked(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
        return {case for case in after if len(after[case]) > len(before.get(case, []))}

    assert asked(first, second) == {"dropall-4", "dropall-5"}
    assert asked(second, third) == {"contract-2", "bad400-3", "dropall-4", "dropall-5"}


@pytest.mark.system
def test_a_second_resume_of_the_same_run_is_refused(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    ids = [f"ok-{i}" for i in range(200)]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(FAULTY, "--delay-ms", "30") as url:
        args = ["run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=2"]
        first = spawn(args, store_uri)
        checkpoint = wait_for_lines(checkpoint_dir(store_uri), 10)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        run_id = checkpoint.stem
        resuming = spawn([*args, "--resume", run_id], store_uri)
        time.sleep(0.5)
        deadline = time.time() + 60
        while time.time() < deadline and len(checkpoint.read_bytes().splitlines()) < 40:
            time.sleep(0.05)
        second = ragexp(*args, "--resume", run_id)
        _out, err = resuming.communicate(timeout=120)
        asked = stats(url)
    assert second.code == 1 and second.stderr.count("\n") == 1
    assert f"run {run_id} is being evaluated by another process" in second.stderr
    assert resuming.returncode == 0, err
    assert sum(len(times) for times in asked.values()) <= 200 + 2  # no case sent by both


# --- interrupts and exit codes ------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("as_json", [False, True])
def test_an_interrupted_run_says_how_to_resume_it(store_uri: str, tmp_path: Path, as_json: bool) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"ok-{i}" for i in range(200)]))
    with serve(FAULTY, "--delay-ms", "30") as url:
        args = ["run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=2"]
        proc = spawn([*args, *(["--json"] if as_json else [])], store_uri)
        wait_for_lines(checkpoint_dir(store_uri), 5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    run_id = only_run(store_uri).info.run_id
    assert proc.returncode == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ragexp: interrupted: run {run_id} interrupted after "), err
    assert lines[0].endswith(f"continue with: ragexp run {' '.join(args[1:])} --resume {run_id}")
    if as_json:
        assert json.loads(out) == {"status": "interrupted", "run_id": run_id}
    else:
        assert out == ""


def test_a_run_where_every_case_errored_exits_1_and_stays_marked(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"notimpl-{i}" for i in range(5)]))
    with serve(FAULTY) as url:
        result = ragexp("run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", *FAST)
    assert result.code == 1 and result.stderr.count("\n") == 1
    assert "every case errored (5 of 5; the first: HTTP 501 (not retried): not implemented)" in result.stderr
    run = only_run(store_uri)
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "failed"
    assert run.data.metrics["error_count"] == 5  # everything was logged all the same


def test_replies_the_code_cannot_hold_are_contract_errors(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    ids = ["ok-1", "inf-2", "bigint-3", "deep-4", "huge-5"]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(FAULTY) as url:
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            "provider.system.max_response_bytes=1000000",
            "--json",
            *FAST,
        )
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["ok-1"]["error"] is None
    assert rows["inf-2"]["error"].startswith("contract: response is not JSON")
    assert rows["bigint-3"]["error"] == "contract: 'citations' must be a list of 1-based integers"
    assert rows["deep-4"]["error"].startswith("contract: response is too deeply nested")
    assert rows["huge-5"]["error"].startswith("contract: response of 3,000,0")
    assert rows["huge-5"]["error"].endswith(" bytes is larger than max_response_bytes (1,000,000)")
    metrics = MlflowClient(store_uri).get_run(result.json()["run_id"]).data.metrics
    assert metrics["timing.model.p95_seconds"] == 0.02  # from ok-1 alone, never an Infinity made 0


# --- faults of the machine ----------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``folder``; the test skips where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip() or 'not root'})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_disk_full_while_evaluating_is_one_line_and_the_run_is_marked(ragexp: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"big-{i}" for i in range(40)]))
    with small_disk(tmp_path / "disk", "3m") as disk, serve(FAULTY) as url:
        uri = f"sqlite:///{disk}/mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        result = ragexp("run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "concurrency=1")
        run = only_run(uri)
        checkpoint = disk / "checkpoints" / f"{run.info.run_id}.jsonl"
        kept = len(checkpoint.read_bytes().splitlines()) if checkpoint.exists() else 0
    assert result.code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "disk full: cannot write the checkpoint" in result.stderr and str(disk) in result.stderr
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"
    assert "disk full" in run.data.tags["ragexp.stopped_because"]
    assert kept >= 1  # what was written before the disk filled up stays for --resume


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_disk_full_while_logging_is_one_line_and_the_run_is_marked(ragexp: Any, tmp_path: Path) -> None:
    rows = labelled([f"ok-{i}" for i in range(200)])
    for row in rows:
        row["question"] += " 很长的问题" * 2000  # cases.jsonl alone needs about 4 MB
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    with small_disk(tmp_path / "disk", "3m") as disk:
        uri = f"sqlite:///{disk}/mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        result = ragexp("run", "provider=fake", f"dataset.path={data}")
        run = only_run(uri)
    assert result.code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ragexp: error: disk full: ")
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    handle = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while True:
            os.write(handle, b"x" * 4096)
    os.close(handle)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_disk_full_inside_a_direct_sqlite_write_is_disk_full_and_the_run_can_be_marked(tmp_path: Path) -> None:
    from ragexp.checkpoint import SpaceReserve
    from ragexp.errors import StorageError
    from ragexp.tracking.store import Store

    with small_disk(tmp_path / "disk", "2m") as disk:
        uri = f"sqlite:///{disk}/mlflow.db"
        store = Store(uri)
        run_id = store.create_run("full", "r", {}, {})
        assert store.sql_writer() is not None  # the direct writer, not MLflow's
        with SpaceReserve(store.sqlite_folder()) as reserve:
            fill(disk)
            # SQLite rolls this transaction back itself; its error is the one reported.
            with pytest.raises(StorageError, match=r"^disk full: logging metrics of run "):
                store.log_metrics(run_id, {f"metric.{i}.{'m' * 100}": float(i) for i in range(5000)})
            reserve.release()
            store.end_run(run_id, "FAILED")
        status = MlflowClient(uri).get_run(run_id).info.status
    assert status == "FAILED"


@pytest.mark.system
def test_each_run_keeps_its_own_space_reserve_and_leaves_no_lock_file(store_uri: str, tmp_path: Path) -> None:
    import socket

    from ragexp.checkpoint import SpaceReserve
    from ragexp.tracking.store import Store

    folder = Path(store_uri.removeprefix("sqlite:///")).parent
    finished = subprocess.Popen(["true"])
    finished.wait()
    stale = folder / f".ragexp-reserve.{socket.gethostname()}.{finished.pid}"  # a run killed with -9
    folder.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"x" * 1024)
    data = write_jsonl(tmp_path / "cases.jsonl", labelled([f"ok-{i}" for i in range(5)]))
    store = Store(store_uri)
    with SpaceReserve(store.sqlite_folder()):
        mine = sorted(folder.glob(".ragexp-reserve.*"))
        reserved = mine[0].stat().st_size if mine else 0
        other = subprocess.run(
            [*run_cmd("run", "provider=fake", f"dataset.path={data}")],
            capture_output=True,
            text=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": store_uri},
            timeout=300,
        )
        assert other.returncode == 0, other.stderr
        # The other run's end gave back its own reserve, not this one's.
        left = sorted(folder.glob(".ragexp-reserve.*"))
    assert mine == [folder / f".ragexp-reserve.{socket.gethostname()}.{os.getpid()}"]
    assert reserved == 1 << 20 and left == mine  # and the stale one is gone
    assert not list(folder.glob(".ragexp-reserve.*"))
    assert not list((folder / "checkpoints").glob("*.lock"))


@contextlib.contextmanager
def read_only_view(source: Path, view: Path) -> Iterator[Path]:
    view.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(view)], capture_output=True)
    if mounted.returncode == 0:  # a bind mount takes "ro" only when mounted again
        mounted = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here ({mounted.stderr.decode().strip() or 'not root'})")
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


@pytest.mark.system
def test_a_read_only_store_can_be_read_but_not_run_into(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    first = ragexp("run", "provider=replay", "dataset=scifacts_zh", "--json").json()
    second = ragexp("run", "provider=replay", "dataset=scifacts_zh", "--json").json()
    third = ragexp("run", "provider=fake", "experiment=other", "--json").json()
    assert first and second and third
    source = Path(store_uri.removeprefix("sqlite:///")).parent
    with read_only_view(source, tmp_path / "ro") as view:
        uri = f"sqlite:///{view}/mlflow.db"
        listed = ragexp("runs", "--tracking-uri", uri, "--json")
        diffed = ragexp("diff", first["run_id"], second["run_id"], "--tracking-uri", uri, "--json")
        gated = ragexp("gate", "--baseline", first["run_id"], "--tracking-uri", uri)
        refused = ragexp("run", f"tracking.uri={uri}")
    assert listed.code == 0, listed.stderr
    assert {run["run_id"] for run in listed.json()["runs"]} == {first["run_id"], second["run_id"]}
    assert diffed.code == 0, diffed.stderr
    assert gated.code in (0, 2) and f"candidate {second['run_id']}" in gated.stdout  # decided, though unrecorded
    assert "warning: the verdict is not recorded" in gated.stderr
    assert refused.code == 1 and refused.stderr.count("\n") == 1
    assert f"tracking store {view}/mlflow.db is read-only" in refused.stderr


@pytest.mark.system
def test_report_on_a_read_only_store_says_in_one_line_where_it_is_and_that_it_is_not_logged(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    run = ragexp("run", "provider=fake", "--json").json()["run_id"]
    folder = Path(store_uri.removeprefix("sqlite:///")).parent
    # The store's folder, its artifacts too, made read-only where it is.
    with read_only_view(folder, folder):
        made = ragexp("report", run, "--out", str(tmp_path / "report"))
    assert made.code == 0, made.stderr
    assert made.stderr == ""
    assert made.stdout.splitlines() == [
        f"report (zh) written to {tmp_path}/report/report.html and {tmp_path}/report/report.md; not logged to run "
        f"{run} (logging artifacts of run {run}: tracking store {store_uri} is on a read-only file system)"
    ]
    assert (tmp_path / "report" / "report.md").is_file()


def test_reading_a_store_that_does_not_exist_creates_nothing(ragexp: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "mlflow.db"
    for command in (["runs"], ["diff", "a", "b"], ["gate", "--baseline", "a"], ["report", "a"]):
        result = ragexp(*command, "--tracking-uri", f"sqlite:///{missing}")
        assert result.code == 1 and result.stderr.count("\n") == 1, (command, result.stderr)
        assert f"no tracking store at {missing}" in result.stderr
    assert not missing.parent.exists()


# --- bounds and small ones ----------------------------------------------------------------------


def test_memory_follows_the_retrieved_lists_not_k() -> None:
    from ragexp.metrics.offline import build_inputs, score_ndcg, score_recall
    from ragexp.records import Case, CaseResult, SystemOutput

    cases = [Case(f"c{i}", "q", [f"d{i}", "x"], [], None, False, i + 1) for i in range(2000)]
    results = [CaseResult(c.id, SystemOutput([f"n{j}" for j in range(9)] + [f"d{i}"])) for i, c in enumerate(cases)]
    small, large = build_inputs(cases, results, 10, []), build_inputs(cases, results, 10_000, [])
    assert small.hits.shape == large.hits.shape == (2000, 10)  # not (2000, 10000)
    assert (score_recall(large) == score_recall(small)).all()
    # The ideal ranking at K=10,000 still has room for both relevant ids, as at K=10.
    assert score_ndcg(large) == pytest.approx(score_ndcg(small))
    assert score_ndcg(large)[0] == pytest.approx((1 / math.log2(11)) / (1 + 1 / math.log2(3)))


def test_a_dataset_with_a_byte_order_mark_is_accepted(ragexp: Any, tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "plain.jsonl", labelled(["ok-1", "ok-2"]))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    first = ragexp("validate", "--path", str(plain), "--json")
    second = ragexp("validate", "--path", str(bom), "--json")
    assert second.code == 0, second.stderr
    assert second.json()["dataset_hash"] == first.json()["dataset_hash"]


def test_k_must_be_an_integer_and_unicode_values_need_no_quotes(ragexp: Any, store_uri: str) -> None:
    boolean = ragexp("run", "k=true")
    assert boolean.code == 1 and "config: k: Input should be a valid integer (got True)" in boolean.stderr
    named = ragexp("run", "provider=fake", "experiment=实验", "--json")
    assert named.code == 0, named.stderr
    assert named.json()["experiment"] == "实验"
    listed = ragexp("runs", "--experiment", "实验", "--json")
    assert [run["run_id"] for run in listed.json()["runs"]] == [named.json()["run_id"]]


def test_all_zero_judge_embeddings_are_a_case_error_not_a_warning(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    with serve(JUDGE, "--zero-embeddings") as url:
        result = ragexp(
            "run",
            "dataset=scifacts_zh",
            "metrics.names=[answer_similarity]",
            "provider=replay_judge",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=null",
            "provider.judge.abort_after=1000",
            "--json",
        )
    assert result.code == 1  # every case errored: exit 1, in one line, no RuntimeWarning
    assert result.stderr.count("\n") == 1 and "RuntimeWarning" not in result.stderr
    run = only_run(store_uri)
    rows = rows_of(store_uri, run.info.run_id, tmp_path)
    reasons = {row["metric_errors"]["semantic_similarity"] for row in rows.values() if row.get("metric_errors")}
    assert any("all-zero or non-finite vector" in reason for reason in reasons)
    assert all(row["metrics"]["semantic_similarity"] is None for row in rows.values())
