"""The per-case comparison in the real MLflow UI: `mlflow server` on 127.0.0.1 (ephemeral port)
over a store with two comparable runs, opened in Debian's headless Chromium."""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_traces import case_id, traces_of

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
MLFLOW = [sys.executable, "-m", "mlflow"]
SERVE = ["--host", "127.0.0.1", "--workers", "1"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def ui_server(store_uri: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [*MLFLOW, "server", "--backend-store-uri", store_uri, *SERVE, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def render(chromium: str, url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=60000",
            "--window-size=1600,1100",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def text_of(dom: str) -> str:
    text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " | ", text))
    return re.sub(r"(\s*\|\s*)+", " | ", text)


@pytest.mark.parametrize("logged_via", ["store", "server"])
def test_evaluation_runs_comparison_shows_cases_paired_with_assessments(
    ragexp: Any, store_uri: str, ui_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged_via: str
) -> None:
    """``store``: the runs are written straight into the SQL store (one transaction per batch);
    ``server``: through the tracking server (StartTraceV3 requests and OTLP span batches)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed (make browser installs it)"
    if logged_via == "server":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", ui_server)
    base = ragexp("run", "provider=fake", "dataset=scifacts_zh", "run_name=baseline", "+tags.role=baseline", "--json")
    cand = ragexp("run", "dataset=scifacts_zh", "provider=replay", "run_name=candidate", "--json")
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    experiment = httpx.get(
        ui_server + "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "ragexp"}, timeout=30
    ).json()["experiment"]["experiment_id"]
    url = f"{ui_server}/#/experiments/{experiment}/evaluation-runs?selectedRunUuid={cand_id}&compareToRunUuid={base_id}"

    text = ""
    for attempt in range(3):  # a loaded machine can leave the first render half-done
        done = render(chromium, url, tmp_path / f"profile{attempt}", "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        text = text_of(done.stdout)
        if "AVG" in text and "case_id" in text:
            break
    assert re.search(r"Comparing \| #\w+ \| candidate \| to \| #\w+ \| baseline", text), text[:3000]

    # Rows are paired by case: each row holds the case's request, then the candidate's and the
    # baseline's trace of that very case.
    cand_traces = {case_id(t): t.info.trace_id for t in traces_of(store_uri, cand_id)}
    base_traces = {case_id(t): t.info.trace_id for t in traces_of(store_uri, base_id)}
    rows = re.findall(
        r'"case_id": "([^"]+)",\s*"question": "[^"]*"\s*\} \| [^|]+ \| [^|]+ \| (tr-\w+) \| (tr-\w+)', text
    )
    assert len(rows) >= 5, text[:3000]  # the table is virtualised: the rows on screen
    for case, first, second in rows:
        assert (first, second) == (cand_traces[case], base_traces[case]), case

    # The assessment column with the run's average and the delta against the baseline.
    cand_accuracy = cand.json()["summary"]["answer_accuracy"]
    delta = cand_accuracy - base.json()["summary"]["answer_accuracy"]
    header = re.search(r"\| answer_accuracy \| AVG \| ([-\d.]+) \| ([-+\d.]+) \|", text)
    assert header is not None, text[:3000]
    assert float(header.group(1)) == pytest.approx(cand_accuracy, abs=0.005)
    assert float(header.group(2)) == pytest.approx(delta, abs=0.005)
    # Per-case assessment values are in the rows (an unanswerable case both runs refused: 1 and 1).
    refused = re.search(r'"case_id": "sf-u1"(?:(?!"case_id").)*?\| true \| true \| 1 \| 1 \|', text, re.S)
    assert refused is not None

    shot = tmp_path / "compare.png"
    done = render(chromium, url, tmp_path / "profile-shot", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 50_000
    if os.environ.get("RAGEXP_UPDATE_SCREENSHOT") and logged_via == "store":
        shutil.copy(shot, Path(__file__).resolve().parents[1] / "docs/ui-compare-runs.png")
