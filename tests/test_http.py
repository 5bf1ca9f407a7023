"""provider=http against real processes on 127.0.0.1: the sample service and a fault injector."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import FAULTY, SAMPLE, serve, stats

FAST = ["provider.system.backoff_s=0.01", "provider.system.timeout_s=0.5", "provider.system.max_retries=2"]


def labelled(ids: list[str]) -> list[dict[str, Any]]:
    """Cases the faulty server answers correctly: relevant rel-<n>, fact 'fact <n>'."""
    rows = []
    for case_id in ids:
        number = case_id.split("-", 1)[-1]
        rows.append(
            {
                "id": case_id,
                "question": f"what about {number}?",
                "relevant_ids": [f"rel-{number}"],
                "expected_facts": [f"fact {number}"],
            }
        )
    return rows


def http_run(ragexp: Any, url: str, *extra: str) -> Any:
    return ragexp("run", "provider=http", f"provider.system.url={url}", *extra)


def cases_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_sample_service_end_to_end(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    with serve(SAMPLE) as url:
        result = http_run(ragexp, url, "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["case_count"] == 35 and payload["error_count"] == 0
    summary = payload["summary"]
    assert 0.7 < summary["recall_at_k"] <= 1.0 and 0.6 < summary["answer_accuracy"] <= 1.0
    assert summary["p95_seconds"] > 0
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    for stage in ("keyword", "rerank", "model"):
        assert metrics[f"timing.{stage}.p95_seconds"] >= metrics[f"timing.{stage}.p50_seconds"] >= 0
    rows = cases_of(store_uri, payload["run_id"], tmp_path)
    refund = rows["refund-arrival-time"]["output"]
    assert refund["ranked_ids"][0] == "refund-arrival" and "1-3 个工作日" in refund["answer"]
    assert rows["un-overseas"]["metrics"]["answer_accuracy"] == 1.0  # the service refuses
    assert refund["timings"]["keyword"] >= 0


@pytest.mark.system
def test_faults_are_retried_or_recorded_per_case(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    ids = [
        "ok-1",
        "flaky500-2",
        "rate-3",
        "drop-4",
        "slow-5",
        "always500-6",
        "bad400-7",
        "badjson-8",
        "contract-9",
        "ok-10",
    ]
    data = write_jsonl(tmp_path / "faults.jsonl", labelled(ids))
    with serve(FAULTY) as url:
        result = http_run(ragexp, url, f"dataset.path={data}", "concurrency=4", "--json", *FAST)
        attempts = stats(url)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 5 and payload["case_count"] == 10
    assert "5 of 10 cases errored" in result.stderr
    # Retried until they worked: the scores are real.
    assert {case: len(attempts[case]) for case in ["ok-1", "flaky500-2", "rate-3", "drop-4"]} == {
        "ok-1": 1,
        "flaky500-2": 3,
        "rate-3": 2,
        "drop-4": 2,
    }
    first, second = attempts["rate-3"]
    assert second - first >= 0.95  # Retry-After: 1 honoured
    # Not retryable: one attempt each. Retryable but failing: 1 + max_retries attempts.
    assert [len(attempts[c]) for c in ["bad400-7", "badjson-8", "contract-9"]] == [1, 1, 1]
    assert len(attempts["always500-6"]) == 3 and len(attempts["slow-5"]) == 3
    rows = cases_of(store_uri, payload["run_id"], tmp_path)
    assert rows["flaky500-2"]["error"] is None and rows["flaky500-2"]["metrics"]["recall_at_k"] == 1.0
    errors = {case: rows[case]["error"] for case in ids if rows[case]["error"]}
    assert errors == {
        "slow-5": "timed out after 0.5 s after 3 attempts",
        # The server's own reason ({"error": ...}) follows its status.
        "always500-6": "HTTP 500 after 3 attempts: boom",
        "bad400-7": "HTTP 400 (not retried): bad request",
        "badjson-8": "contract: response is not JSON (<html>not json</html>)",
        "contract-9": "contract: 'answer' must be a string",
    }
    for case in errors:  # a failed case has no score at all, never a zero
        assert set(rows[case]["metrics"].values()) == {None}
    # Means leave the failed cases out: the five good cases are perfect.
    assert payload["summary"]["recall_at_k"] == 1.0 and payload["summary"]["error_rate"] == 0.5
    assert MlflowClient(store_uri).get_run(payload["run_id"]).info.status == "FINISHED"


def count_runs(store_uri: str) -> int:
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp")
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


def test_unreachable_service_is_one_line_and_no_run(ragexp: Any, store_uri: str) -> None:
    with serve(FAULTY) as url:
        pass  # started and stopped: nothing listens on its port any more
    result = http_run(ragexp, url)
    assert result.code == 1
    assert result.stderr.strip().splitlines() == [
        f"ragexp: error: provider.system.url: cannot connect to 127.0.0.1:{url.split(':')[2].split('/')[0]} "
        f"(Connection refused) at {url}; is the service running?"
    ]
    assert count_runs(store_uri) == 0


@pytest.mark.system
def test_service_that_answers_nothing_stops_the_run_early(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "drop.jsonl", labelled([f"dropall-{i}" for i in range(40)]))
    with serve(FAULTY) as url:
        started = time.perf_counter()
        result = http_run(ragexp, url, f"dataset.path={data}", "concurrency=2", "provider.system.abort_after=4", *FAST)
        elapsed = time.perf_counter() - started
        attempts = stats(url)
    assert result.code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the service failed 4 calls in a row from the start: connection failed" in lines[0]
    assert len(attempts) < 10 and elapsed < 30  # stopped early, not after 40 cases x 3 attempts
    run = MlflowClient(store_uri).search_runs([MlflowClient(store_uri).get_experiment_by_name("ragexp").experiment_id])[
        0
    ]
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"


def spawn_run(url: str, data: Path, store_uri: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "ragexp.cli.app",
        "run",
        "provider=http",
        f"provider.system.url={url}",
        f"dataset.path={data}",
        "concurrency=2",
        "--json",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": store_uri},
    )


def wait_for_checkpoint(store_uri: str, at_least: int) -> tuple[str, Path]:
    folder = Path(store_uri.removeprefix("sqlite:///")).parent / "checkpoints"
    deadline = time.time() + 60
    while time.time() < deadline:
        files = list(folder.glob("*.jsonl")) if folder.exists() else []
        if files and len(files[0].read_bytes().splitlines()) >= at_least:
            return files[0].stem, files[0]
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


@pytest.mark.system
@pytest.mark.parametrize("how", ["kill9", "sigterm"])
def test_resume_after_a_crash_evaluates_only_missing_cases(
    ragexp: Any, store_uri: str, tmp_path: Path, how: str
) -> None:
    ids = [f"ok-{i}" for i in range(60)]
    data = write_jsonl(tmp_path / "ok.jsonl", labelled(ids))
    with serve(FAULTY, "--delay-ms", "40") as url:
        proc = spawn_run(url, data, store_uri)
        run_id, checkpoint = wait_for_checkpoint(store_uri, at_least=10)
        proc.send_signal(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
        proc.wait(timeout=30)
        status = MlflowClient(store_uri).get_run(run_id).info.status
        if how == "kill9":
            assert status == "RUNNING"  # nobody could mark it; it is certainly not FINISHED
        else:
            assert proc.returncode == 130 and status == "KILLED"
            tags = MlflowClient(store_uri).get_run(run_id).data.tags
            assert tags["ragexp.status"] == "interrupted"
        saved = {json.loads(line)["id"] for line in checkpoint.read_bytes().splitlines() if line.strip()}
        before = stats(url)
        assert 10 <= len(saved) < 60
        # A different config cannot resume it.
        wrong = http_run(ragexp, url, f"dataset.path={data}", "k=9", "--resume", run_id)
        assert wrong.code == 1 and "config hash" in wrong.stderr
        resumed = http_run(ragexp, url, f"dataset.path={data}", "concurrency=2", "--resume", run_id, "--json")
        assert resumed.code == 0, resumed.stderr
        after = stats(url)
        uninterrupted = http_run(ragexp, url, f"dataset.path={data}", "--json").json()
    assert resumed.json()["run_id"] == run_id
    newly = {case for case in after if len(after[case]) > len(before.get(case, []))}
    assert newly == set(ids) - saved  # only the cases the checkpoint lacked were asked again
    assert MlflowClient(store_uri).get_run(run_id).info.status == "FINISHED"
    got, expected = resumed.json()["summary"], uninterrupted["summary"]
    assert {k: v for k, v in got.items() if k != "p95_seconds"} == {
        k: v for k, v in expected.items() if k != "p95_seconds"
    }
    assert resumed.json()["case_count"] == 60 and resumed.json()["error_count"] == 0
    assert got["p95_seconds"] == pytest.approx(expected["p95_seconds"], abs=0.2)
    assert not checkpoint.exists()  # a finished run needs no checkpoint


@pytest.mark.system
def test_secrets_never_reach_the_store_or_the_terminal(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-token-4f9a"
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {secret}")
    data = write_jsonl(tmp_path / "leak.jsonl", labelled(["ok-1", "leak-2", "ok-3"]))
    with serve(FAULTY, env={**os.environ, "FAULTY_TOKEN": secret}) as url:
        result = http_run(
            ragexp,
            url,
            f"dataset.path={data}",
            "--json",
            "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH",
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1  # ok-1 and ok-3 were authorised: the header was sent
    client = MlflowClient(store_uri)
    run = client.get_run(payload["run_id"])
    everything = [
        result.stdout,
        result.stderr,
        json.dumps(run.data.params),
        json.dumps(run.data.tags),
        json.dumps(run.data.metrics),
    ]
    folder = Path(client.download_artifacts(payload["run_id"], "", str(tmp_path / "artifacts")))
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"cases.jsonl", "config.yaml", "summary.json", "scores.json"}
    everything += [p.read_text(encoding="utf-8") for p in files]
    assert not any(secret in text for text in everything)
    rows = cases_of(store_uri, payload["run_id"], tmp_path)
    assert rows["leak-2"]["error"] == "contract: response is not JSON (oops ***)"
    assert run.data.params["provider.system.headers_env.Authorization"] == "RAGEXP_SYSTEM_AUTH"


def test_missing_secret_variable_is_an_error_before_any_work(
    ragexp: Any, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAGEXP_SYSTEM_AUTH", raising=False)
    result = http_run(
        ragexp, "http://127.0.0.1:9/query", "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH"
    )
    assert result.code == 1
    assert (
        "provider.system.headers_env.Authorization: environment variable RAGEXP_SYSTEM_AUTH is not set" in result.stderr
    )
    assert count_runs(store_uri) == 0


def test_tls_with_a_private_ca(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from tests.tls import make_ca_and_server_cert

    ca, cert, key = make_ca_and_server_cert(tmp_path)
    with serve(SAMPLE, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
        assert url.startswith("https://")
        trusted = http_run(ragexp, url, f"provider.system.ca_file={ca}", "--json")
        untrusted = http_run(ragexp, url, "experiment=untrusted", *FAST)
        plain = http_run(ragexp, url.replace("https://", "http://"), "experiment=plain", *FAST)
    assert trusted.code == 0, trusted.stderr
    assert trusted.json()["error_count"] == 0
    # Refused before any run exists, in one line, with what to do; nothing was retried.
    assert untrusted.code == 1 and untrusted.stderr.count("\n") == 1
    assert "TLS certificate of 127.0.0.1" in untrusted.stderr and "set ca_file" in untrusted.stderr
    assert plain.code == 1 and "is an HTTPS port: use https://" in plain.stderr and plain.stderr.count("\n") == 1
    client = MlflowClient(store_uri)
    assert client.get_experiment_by_name("untrusted") is None and client.get_experiment_by_name("plain") is None


@pytest.mark.system
def test_walkthrough_two_service_versions_diff_and_gate(ragexp: Any, tmp_path: Path) -> None:
    with serve(SAMPLE) as base_url, serve(SAMPLE, "--no-rerank", "--chunking", "sentence") as cand_url:
        base = http_run(ragexp, base_url, "--json").json()
        cand = http_run(ragexp, cand_url, "--json").json()
    assert base["config_hash"] != cand["config_hash"]  # another URL is another system
    diff = ragexp("diff", base["run_id"], cand["run_id"], "--json")
    assert diff.code == 0 and {m["name"] for m in diff.json()["metrics"]} >= {"recall_at_k", "mrr"}
    gate = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"])
    assert gate.code in (0, 2) and ("PASSED" in gate.stdout or "FAILED" in gate.stdout)


def test_sample_service_cli_runs_standalone() -> None:
    done = subprocess.run([sys.executable, str(SAMPLE), "--help"], capture_output=True, text=True, check=True)
    assert "--chunking" in done.stdout and ROOT.exists()
