"""Shared fixtures: a real SQLite MLflow store in a temporary folder and an in-process CLI."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "differential: compares what ragexp writes or reads directly with MLflow's own rows, span JSON or "
        "answers; `make test-mlflow-next` runs these under the newest MLflow on the registry",
    )


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def invoke(*args: str) -> Result:
    """Run ``ragexp ARGS`` in this process through the real entry point (exit codes included)."""
    from ragexp.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["ragexp", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
        gc.enable()
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def store_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite store; MLFLOW_TRACKING_URI points at it for in-process commands."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def ragexp(store_uri: str) -> Iterator[Any]:
    yield invoke


IMPORT_PROBE = (
    "import atexit, sys\n"
    "def said():\n"
    "    print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow', file=sys.stderr)\n"
    "atexit.register(said)\n"
    "from ragexp.cli.app import main\n"
    "sys.argv = ['ragexp', *sys.argv[1:]]\n"
    "main()\n"
)
"""``python -c IMPORT_PROBE ARGS``: ``ragexp ARGS`` in a fresh process, whose last line on stderr
says whether it imported mlflow."""


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path
