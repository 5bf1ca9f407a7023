"""What a team's Python target does never crashes a run nor takes ragexp's stdout (issue 33 §1,
§2, §6): exceptions that cannot be printed or are not Exceptions, imports that hang, print calls,
generators, numpy numbers. The targets are in tests/pipelines/unruly.py; runs are real (the CLI
in this process, or a fresh process where a process-wide effect is tested)."""

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

from tests.conftest import ROOT, write_jsonl
from tests.pipelines.corpus import CASES
from tests.test_python_system import rows_of

RETRIEVAL = "metrics=retrieval"


def cases_with(tmp_path: Path, key: str, values: dict[str, str]) -> Path:
    """One case per value (id -> value), each with ``metadata.<key>`` set, and "refund" without."""
    password = CASES[1]
    rows = [{**CASES[0], "metadata": {}}]
    rows += [{**password, "id": case, "metadata": {key: value}} for case, value in values.items()]
    return write_jsonl(tmp_path / f"{key}.jsonl", rows)


RAISES = {"unprintable": "unprintable", "interrupt": "interrupt", "exit": "exit", "base": "base"}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.parametrize("target", ["raising", "raising_async"])
def test_whatever_a_target_raises_is_its_cases_error(ragexp: Any, store_uri: str, tmp_path: Path, target: str) -> None:
    data = cases_with(tmp_path, "raise", RAISES)
    result = ragexp(
        "run", f"dataset.path={data}", "system=python", f"provider.system.target=tests.pipelines.unruly:{target}",
        "k=2", RETRIEVAL, "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    payload = result.json()
    assert (payload["case_count"], payload["error_count"]) == (5, 4)
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert {case: rows[case]["error"] for case in RAISES} == {
        "unprintable": "Unprintable (its message could not be printed)",
        "interrupt": "KeyboardInterrupt",
        "exit": "SystemExit: 3",
        "base": "NotAnException: unwound",
    }
    assert rows["refund"]["metrics"]["recall_at_k"] == 1.0


def test_the_probe_shows_an_unprintable_exception_safely(ragexp: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "one.jsonl", [{**CASES[1], "metadata": {"raise": "unprintable"}}])
    result = ragexp(
        "validate", f"dataset.path={data}", "system=python", "provider.system.target=tests.pipelines.unruly:raising",
        RETRIEVAL, "--probe",
    )  # fmt: skip
    assert result.code == 1
    assert "  error: Unprintable (its message could not be printed)" in result.stdout


def run_process(*args: str, tmp_path: Path, **popen: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns/mlflow.db", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "ragexp.cli.app", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        **popen,
    )


@pytest.mark.system
def test_an_import_that_hangs_is_bounded_by_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "hangs_at_import.py").write_text(
        "import threading\nthreading.Event().wait()\ndef answer(question):\n    return {}\n", encoding="utf-8"
    )
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    started = time.monotonic()
    done = run_process(
        "run", f"dataset.path={data}", "system=python", "provider.system.target=hangs_at_import:answer",
        "provider.system.timeout_s=2", RETRIEVAL, tmp_path=tmp_path,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ragexp: error: provider.system.target: importing 'hangs_at_import' did not finish within 2 s "
        "(provider.system.timeout_s): raise the timeout, or build what is slow on the first call instead of at import"
    )
    assert elapsed < 60


@pytest.mark.system
def test_a_module_that_raises_keyboardinterrupt_at_import_is_its_error(tmp_path: Path) -> None:
    (tmp_path / "interrupts_at_import.py").write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    done = run_process(
        "run", f"dataset.path={data}", "system=python", "provider.system.target=interrupts_at_import:answer",
        RETRIEVAL, tmp_path=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "ragexp: error: provider.system.target: importing 'interrupts_at_import' failed: KeyboardInterrupt"
    )


@pytest.mark.system
def test_the_users_ctrl_c_during_a_python_run_is_still_exit_130(tmp_path: Path) -> None:
    (tmp_path / "slow_target.py").write_text(
        "import time\ndef answer(question):\n    time.sleep(30)\n    return {}\n", encoding="utf-8"
    )
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns/mlflow.db"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "ragexp.cli.app", "run", f"dataset.path={data}", "system=python",
            "provider.system.target=slow_target:answer", "provider.system.timeout_s=60", RETRIEVAL,
        ],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        checkpoints = tmp_path / "mlruns/checkpoints"
        while time.monotonic() < deadline and not any(checkpoints.glob("*.lock")):
            time.sleep(0.1)  # the run exists and its calls are in flight
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr


@pytest.mark.system
def test_what_a_target_prints_goes_to_stderr_escaped_and_json_still_parses(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    done = run_process(
        "run", f"dataset.path={data}", "system=python", "provider.system.target=tests.pipelines.unruly:noisy",
        "k=2", RETRIEVAL, "--json", tmp_path=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # stdout is ragexp's: one JSON object, nothing else
    assert payload["error_count"] == 0
    assert "\x1b" not in done.stderr  # escapes shown, never sent to the terminal
    lines = done.stderr.splitlines()
    # At import (once) and on every call, each line whole, marked as the target's.
    assert "target: \\x1b[2Jloading unruly pipeline \\x1b[31mred\\x1b[0m" in lines
    assert "target: \\x1b]8;;http://evil.example/\\x1b\\answering refund\\x1b]8;;\\x1b\\" in lines
    assert lines.count("target: no newline yet ... done") == 3


@pytest.mark.system
def test_the_probe_keeps_stdout_for_its_report(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    done = run_process(
        "validate", f"dataset.path={data}", "system=python", "provider.system.target=tests.pipelines.unruly:noisy",
        RETRIEVAL, "--probe", "--json", tmp_path=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["probe"]["output"]["ranked_ids"] == ["d1", "d2"]
    assert "target: no newline yet ... done" in done.stderr


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_target_returning_a_generator_or_an_iterator_is_told_so(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    kinds = {"gen": "generator", "it": "iterator", "agen": "async generator"}
    data = cases_with(tmp_path, "returns", kinds)
    result = ragexp(
        "run", f"dataset.path={data}", "system=python", "provider.system.target=tests.pipelines.unruly:streaming",
        "k=2", RETRIEVAL, "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    told = {"gen": "a generator", "it": "an iterator (list_iterator)", "agen": "an async generator"}
    for case, kind in told.items():
        assert rows[case]["error"] == (
            f"the target returned {kind}, not its answer: ragexp reads one return value per case. Return the "
            "whole result (a dict, an object, a list): for a LangChain Runnable call invoke, not stream; for a "
            "generator, collect what it yields"
        )
    assert rows["refund"]["error"] is None


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_numpy_numbers_in_timings_and_scores_are_accepted(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    result = ragexp(
        "run", f"dataset.path={data}", "system=python", "provider.system.target=tests.pipelines.unruly:with_numpy",
        "k=2", RETRIEVAL, "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0
    output = rows_of(store_uri, payload["run_id"], tmp_path)["refund"]["output"]
    assert output["timings"] == {"retrieve": 0.25, "rerank": 0.125, "model": 1.0}
    assert output["stages"]["retrieve"]["scores"] == [pytest.approx(0.9), pytest.approx(0.4)]
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert metrics["timing.retrieve.p50_seconds"] == 0.25
