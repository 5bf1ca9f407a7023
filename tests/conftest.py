"""Shared fixtures: a real SQLite MLflow store in a temporary folder, an in-process CLI, and one
MLflow tracking server for the whole session; and the ``system`` marker (``make test-fast`` leaves
those tests out, ``make test`` runs them)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")


SYSTEM_TESTS: dict[str, Sequence[str]] = {
    # module -> its end-to-end tests (whole processes, servers, a browser, a wheel install); ("*",):
    # the whole module. Listed here rather than marked in each file so that the edit loop's subset
    # is chosen in one place; a name that no longer exists is a usage error, not a silent drop.
    "test_install.py": ("*",),
    "test_ray.py": ("*",),
    "test_ui.py": ("*",),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "system: end-to-end test (real processes, servers, a browser, a wheel install); "
        "left out by `make test-fast`, run by `make test` (tests/conftest.py SYSTEM_TESTS)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    checked: set[str] = set()
    for item in items:
        module = item.module if isinstance(item, pytest.Function) else None
        names = SYSTEM_TESTS.get(item.path.name)
        if module is None or names is None:
            continue
        if item.path.name not in checked:
            checked.add(item.path.name)
            unknown = [n for n in names if n != "*" and not callable(getattr(module, n, None))]
            if unknown:
                raise pytest.UsageError(f"tests/conftest.py SYSTEM_TESTS: {item.path.name} has no {', '.join(unknown)}")
        if "*" in names or item.originalname in names:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's MLflow tracking server: the one CI starts (``RAGEXP_TEST_MLFLOW_SERVER``)
    when it is set, else one ``mlflow server`` over a SQLite store started here once and shared by
    every test that asks for it. A test that kills or restarts a server starts its own
    (``tests.servers.procs.mlflow_server``)."""
    shared = os.environ.get("RAGEXP_TEST_MLFLOW_SERVER")
    if shared:
        yield shared.rstrip("/")
        return
    from tests.servers.procs import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("server"), workers=2) as url:
        yield url


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
