"""What users meet after a command: the cases a run missed, its progress bar, runs found by hash."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, write_jsonl
from tests.test_compare import replay_rows, run_replay

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def test_run_lists_the_worst_cases_it_missed_with_what_was_expected_and_what_came_back(
    ragexp: Any, tmp_path: Path
) -> None:
    # K=3. case-0001: relevant id at rank 2 (MRR .5, nDCG 1/log2(3)); case-0003: wrong answer;
    # case-0005: relevant id not retrieved, nothing cited; cases 6-9: wrong answers (case-0006's
    # answer carries a terminal escape sequence); every other case is right.
    specs: list[dict[str, Any]] = [{"rank": 1}] * 10
    specs = [*specs]
    specs[1] = {"rank": 2}
    specs[3] = {"rank": 1, "correct": False}
    specs[5] = {"rank": None}
    for i in range(6, 10):
        specs[i] = {"rank": 1, "correct": False}
    rows = replay_rows(specs)
    rows[6]["response"] = "wrong \x1b[31mred\x1b[0m"
    path = write_jsonl(tmp_path / "cases.jsonl", rows)
    result = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=3")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("cases it missed: 7 of 10 (a score below full marks), worst first")
    block = lines[start : lines.index("", start)]
    # Worst first: case-0005 missed four metrics outright, then the wrong answers (a whole mark
    # each, in file order), before case-0001's half-missed ranking, which is among the rest.
    assert [line.split(":")[0].strip() for line in block if line.startswith("  case-")] == [
        "case-0005",
        "case-0003",
        "case-0006",
        "case-0007",
        "case-0008",
    ]
    case5 = block[1 : block.index("  case-0003: answer_accuracy 0.0000")]
    assert case5[0] == "  case-0005: recall_at_k 0.0000, mrr 0.0000, ndcg_at_k 0.0000, citation_precision 0.0000"
    assert '    expected  relevant ids: ["rel-5"]' in case5
    assert "    came back cited: []" in case5
    at = block.index("  case-0003: answer_accuracy 0.0000")
    assert block[at : at + 3] == [
        "  case-0003: answer_accuracy 0.0000",
        '    expected  facts: ["fact 3"]',
        "    came back answer: something else",
    ]
    case6 = block[block.index("  case-0006: answer_accuracy 0.0000") :]
    assert case6[2] == "    came back answer: wrong \\x1b[31mred\\x1b[0m"  # shown, not obeyed
    assert "\x1b" not in result.stdout
    assert block[-1].startswith("  ... and 2 more; every case's scores: ") and block[-1].endswith("/cases.jsonl")
    assert Path(block[-1].split(": ", 1)[1]).is_file()

    # A run that misses nothing says nothing of it.
    clean = write_jsonl(tmp_path / "clean.jsonl", replay_rows([{"rank": 1}] * 4))
    assert "cases it missed" not in run_replay_text(ragexp, clean)


def run_replay_text(ragexp: Any, path: Path) -> str:
    result = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=3")
    assert result.code == 0, result.stderr
    text: str = result.stdout
    return text


def plain(drawn: str) -> str:
    """What a terminal shows of ``drawn``, a line per redraw: colours and cursor moves left out."""
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", drawn).replace("\r", "\n")


def _slow_cases(tmp_path: Path, n: int) -> Path:
    rows = [{"id": f"c{i}", "question": f"q{i}", "relevant_ids": ["doc-1"], "expected_facts": ["q"]} for i in range(n)]
    return write_jsonl(tmp_path / "slow.jsonl", rows)


def _run_on_a_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """``ragexp ARGS`` with stderr on a pseudo-terminal; what it drew there."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [*RAGEXP, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal, env=env, cwd=cwd
    )
    os.close(terminal)
    drawn = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end closed: the process is done with it
            break
        if not chunk:
            break
        drawn += chunk
    os.close(controller)
    return proc.wait(timeout=120), drawn.decode("utf-8", "replace")


@pytest.mark.system
def test_progress_bar_with_rate_and_eta_on_a_terminal_only(store_uri: str, tmp_path: Path) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    slow = _slow_cases(tmp_path, 50)  # 50 cases one at a time, 0.04 s each: two seconds
    args = [
        "run",
        "system=python",
        "provider.system.target=tests.pipelines.slow:answer",
        f"dataset.path={slow}",
        "dataset.name=slow",
        "metrics=retrieval",
        "concurrency=1",
        "tracking.traces=false",
    ]
    started = time.perf_counter()
    code, drawn = _run_on_a_terminal(args, env, tmp_path)
    assert code == 0, drawn
    assert time.perf_counter() - started > 1.0  # long enough to be shown a bar
    bars = [part for part in drawn.replace("\r", "\n").splitlines() if "evaluating" in part]
    assert bars, drawn
    last = bars[-1]
    assert "50/50" in last and "/s" in last and "ETA" in last
    assert any("/50" in bar and "0:00:0" in bar for bar in bars[:-1])  # a time left while it ran

    # In a pipe (a CI log), the same run draws nothing.
    piped = subprocess.run([*RAGEXP, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "evaluating" not in piped.stderr and "\r" not in piped.stderr and "ETA" not in piped.stderr

    # On a terminal, a run shorter than a second draws nothing either.
    quick = _slow_cases(tmp_path, 3)
    code, drawn = _run_on_a_terminal(["run", "provider=fake", f"dataset.path={quick}", "dataset.name=q"], env, tmp_path)
    assert code == 0, drawn
    assert "evaluating" not in drawn


def test_runs_by_config_hash_searches_every_experiment(ragexp: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}] * 4))
    here = run_replay(ragexp, path, "experiment=elsewhere")
    prefix = here["config_hash"][:12]

    found = ragexp("runs", "--config-hash", prefix, "--json")
    assert found.code == 0, found.stderr
    payload = found.json()
    assert payload["experiment"] is None
    assert [(r["run_id"], r["experiment"]) for r in payload["runs"]] == [(here["run_id"], "elsewhere")]
    text = ragexp("runs", "--config-hash", prefix)
    header, _, row = text.stdout.splitlines()
    assert header.split()[:3] == ["run", "experiment", "started"]
    assert row.split()[:2] == [here["run_id"], "elsewhere"]

    # Named, the experiment still narrows the search; without a hash the default stays 'ragexp'.
    none = ragexp("runs", "--config-hash", prefix, "--experiment", "ragexp")
    assert none.code == 0 and none.stdout == ""
    assert none.stderr.strip() == "no runs in experiment 'ragexp'"
    assert ragexp("runs", "--json").json() == {"experiment": "ragexp", "runs": [], "cells_left_out": 0}
    assert [r["run_id"] for r in ragexp("runs", "--experiment", "elsewhere", "--json").json()["runs"]] == [
        here["run_id"]
    ]


def test_diff_and_gate_are_library_functions_the_cli_renders(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from ragexp.errors import ConfigError
    from ragexp.workflows.diff import compare_runs
    from ragexp.workflows.gate import run_gate

    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 6)), "+tags.role=prod")
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", replay_rows([{"rank": 2}] * 6)))
    said: list[str] = []
    compared = compare_runs("tag:role=prod", cand["run_id"], say=said.append, seed=3)
    assert compared.baseline.run_id == base["run_id"] and said[0].startswith("baseline: tag:role=prod -> run ")
    cli = ragexp("diff", base["run_id"], cand["run_id"], "--json", "--seed", "3")
    assert cli.code == 0 and cli.json() == compared.result.to_json()

    gated = run_gate("tag:role=prod", overrides=["gates=release"], candidate=cand["run_id"], say=said.append)
    assert not gated.result.passed and {f.metric for f in gated.result.failures} >= {"mrr"}
    assert (gated.baseline, gated.candidate, gated.promotion) == (base["run_id"], cand["run_id"], None)
    cli = ragexp("gate", "--baseline", "tag:role=prod", "--candidate", cand["run_id"], "gates=release", "--json")
    assert cli.code == 2 and cli.json() == gated.to_json()

    # A candidate that is the baseline is refused the same way, however the two were chosen.
    itself = f"^the candidate {base['run_id']} is the baseline itself: there is nothing to compare$"
    with pytest.raises(ConfigError, match=itself):
        compare_runs(base["run_id"], base["run_id"])
    with pytest.raises(ConfigError, match=itself):
        run_gate(base["run_id"], candidate=base["run_id"])


def test_a_phase_without_a_count_shows_a_spinner_and_its_time_after_a_second() -> None:
    import io

    from ragexp.progress import Phase

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    slow, quick, piped = Terminal(), Terminal(), io.StringIO()
    with Phase("scoring 150,000 cases", stream=slow):
        time.sleep(1.6)
    with Phase("scoring 3 cases", stream=quick):
        time.sleep(0.05)
    with Phase("scoring 150,000 cases", stream=piped):
        time.sleep(1.2)
    lines = [line.strip() for line in plain(slow.getvalue()).splitlines() if line.strip()]
    assert any(line.endswith("scoring 150,000 cases 0:00:01") for line in lines[:-1]), lines  # while it ran
    assert lines[-1] == "✓ scoring 150,000 cases: done 0:00:01"
    assert quick.getvalue() == "" and piped.getvalue() == ""  # too short to show; not a terminal


@pytest.mark.system
def test_every_long_phase_of_a_large_replay_run_shows_progress(store_uri: str, tmp_path: Path) -> None:
    # 60,000 recorded cases: evaluating them is quick, loading, logging and tracing them is not.
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    path = write_jsonl(tmp_path / "big.jsonl", replay_rows([{"rank": 1 + i % 3} for i in range(60_000)]))
    args = ["run", "provider=replay", f"dataset.path={path}", "dataset.name=big", "k=3"]
    code, drawn = _run_on_a_terminal(args, env, tmp_path)
    assert code == 0, drawn
    shown = [line.strip() for line in plain(drawn).splitlines()]
    done = {line[2 : line.index(": done")] for line in shown if ": done" in line}
    assert "logging the cases' traces" in done, shown[-20:]
    assert done <= {
        "loading and checking the dataset, the system and the judge",
        "scoring 60,000 cases",
        "logging the run's metrics and artifacts (60,000 cases)",
        "logging the cases' traces",
    }
