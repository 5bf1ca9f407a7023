"""One concept, one place: the continue-with line, the retry loop, the run's artifact names and
the SQLite cache each live in one module (checked over the package's source), and each works."""

from __future__ import annotations

import ast
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ragexp import artifacts
from ragexp.cli.options import continue_with
from ragexp.sqlite_cache import SqliteCache
from ragexp.transport import retry_within

PACKAGE = Path(__file__).resolve().parents[1] / "ragexp"


def _sources() -> list[tuple[str, ast.AST]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_the_continue_with_line_is_spelled_in_one_function() -> None:
    found = [f"{name}:{line}" for name, tree in _sources() for line, text in _strings(tree) if "continue with:" in text]
    assert len(found) == 1 and found[0].startswith("cli/options.py:"), found


def test_continue_with_names_the_rerun_quoted() -> None:
    stopped = RuntimeError("run abc interrupted")
    continue_with(stopped, "run", ["dataset.path=my file.jsonl", "--resume", "abc"])
    assert str(stopped) == "run abc interrupted; continue with: ragexp run 'dataset.path=my file.jsonl' --resume abc"


def _waits(tree: ast.AST) -> list[int]:
    """Lines that pause between tries: a call of ``sleep`` (bar ``asyncio.sleep(0)``, a yield to
    the event loop) or of ``backoff``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        yields = [ast.dump(arg) for arg in node.args] == [ast.dump(ast.Constant(0))]
        if name == "backoff" or (name == "sleep" and not yields):
            lines.append(node.lineno)
    return lines


def test_no_retry_loop_outside_transport() -> None:
    found = [f"{name}:{line}" for name, tree in _sources() if name != "transport.py" for line in _waits(tree)]
    assert found == []


def test_the_wait_finder_finds_a_retry_loop() -> None:
    loop = (
        "import time\nwhile True:\n    try:\n        call()\n    except OSError:\n        time.sleep(backoff(0.5, n))\n"
    )
    assert _waits(ast.parse(loop)) == [6, 6]
    assert _waits(ast.parse("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n")) == []


def test_retry_within_asks_again_until_an_answer() -> None:
    failures = [OSError("busy"), OSError("busy")]

    def call() -> str:
        if failures:
            raise failures.pop()
        return "answer"

    assert retry_within(call, timeout_s=10, base=0.001, again=lambda exc: True) == "answer"
    assert failures == []


def test_retry_within_stops_on_a_final_failure_at_the_attempts_and_at_the_deadline() -> None:
    calls: list[float] = []

    def failing() -> None:
        calls.append(time.monotonic())
        raise OSError(f"failure {len(calls)}")

    with pytest.raises(OSError, match="failure 1"):
        retry_within(failing, timeout_s=10, base=0.001, again=lambda exc: False)
    calls.clear()
    with pytest.raises(OSError, match="failure 3"):
        retry_within(failing, timeout_s=10, base=0.001, again=lambda exc: True, attempts=3)
    calls.clear()
    with pytest.raises(OSError):  # pauses of 0.25-0.5, 0.5-1, 1-2 s: the deadline comes first
        retry_within(failing, timeout_s=1.2, base=0.5, again=lambda exc: True)
    assert 2 <= len(calls) <= 3
    calls.clear()
    # cap: with pauses of at most 0.02 s, eight tries fit well within the same deadline.
    with pytest.raises(OSError):
        retry_within(failing, timeout_s=1.2, base=0.5, cap=0.02, again=lambda exc: True, attempts=8)
    assert len(calls) == 8


def _artifact_names() -> set[str]:
    return {
        value
        for name, value in vars(artifacts).items()
        if name.isupper() and isinstance(value, str) and "." in value.rsplit("/", 1)[-1]
    }


CONFIG_TREE = {"config/compose.py", "config/tracking.py", "paths.py"}
"""Modules that name the config tree's own ``config.yaml`` (conf/config.yaml), not the artifact."""


def test_artifact_names_are_spelled_only_in_artifacts() -> None:
    names = _artifact_names()
    assert {"cases.jsonl", "canaries.json", "traffic.json", "shadow.json", "gate.json", "draft.jsonl"} <= names
    found = [
        f"{name}:{line}: {text}"
        for name, tree in _sources()
        if name != "artifacts.py"
        for line, text in _strings(tree)
        if text in names or any(text.endswith("/" + known) for known in names)
        if not (text == artifacts.CONFIG and name in CONFIG_TREE)
    ]
    assert found == []


def test_only_the_shared_cache_and_the_mlflow_door_open_sqlite() -> None:
    users = sorted(
        name
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Import) and any(alias.name == "sqlite3" for alias in node.names)
    )
    assert [name for name in users if not name.startswith("tracking/mlflow_sql/")] == ["sqlite_cache.py"]


TABLE = "create table if not exists kept (key text primary key, value text)"


def _count(path: Path) -> int:
    """Rows another process sees (a connection of its own)."""
    with sqlite3.connect(path) as other:
        rows: Any = other.execute("select count(*) from kept").fetchone()
    return int(rows[0])


def test_the_shared_cache_commits_as_told_and_keeps_across_opens(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "cache.sqlite"
    each = SqliteCache(path, [TABLE], commit_every=0)
    each.write("insert into kept values (?, ?)", ("a", "1"))
    assert _count(path) == 1  # committed as it came
    each.close()
    batched = SqliteCache(path, [TABLE], commit_every=3600)
    batched.write("insert into kept values (?, ?)", ("b", "2"))
    assert _count(path) == 1  # waiting for its commit
    assert batched.row("select value from kept where key = ?", ("b",)) == ("2",)
    batched.close()
    assert _count(path) == 2
    reopened = SqliteCache(path, [TABLE], commit_every=0)
    assert reopened.rows("select key from kept order by key", ()) == [("a",), ("b",)]
    reopened.close()


def test_a_cache_without_a_file_keeps_nothing() -> None:
    cache = SqliteCache(None, [TABLE], commit_every=0)
    cache.write("insert into kept values (?, ?)", ("a", "1"))
    assert cache.row("select value from kept", ()) is None and cache.rows("select value from kept", ()) == []
    assert not cache.enabled


def test_draft_help_lists_its_commands(ragexp: Any) -> None:
    shown = ragexp("draft", "--help")
    assert shown.code == 0
    assert "ragexp draft review: Put a draft file's unscreened cases" in shown.stdout
    assert "ragexp draft accept: Write the cases of a review queue" in shown.stdout
    assert "Commands" in shown.stdout
    # a command without modes lists none
    assert "Commands" not in ragexp("gate", "--help").stdout
