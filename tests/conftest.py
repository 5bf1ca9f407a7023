"""Shared fixtures: a real SQLite MLflow store in a temporary folder, an in-process CLI, and one
MLflow tracking server for the whole session; and the markers (``system``: ``make test-fast``
leaves those tests out, ``make test`` runs them; each test carries its own ``@pytest.mark.system``)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")


MARKERS = {
    "system": "end-to-end test (whole ragexp processes, servers started, proxied or killed, a browser, "
    "a wheel install, Ray clusters); left out by `make test-fast`, run by `make test`",
    "differential": "compares what ragexp writes or reads directly with MLflow's own rows, span JSON or "
    "answers; `make test-mlflow-next` runs these under the newest MLflow on the registry",
}
"""Every marker, each selected by a make target (``tests/test_structure.py`` checks both);
pytest runs with ``--strict-markers``, so a marker not declared here stops the run."""


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


WHOLE_RUNS = {"run", "demo"}
"""The commands that evaluate a whole run: in a process of their own, only in a ``system`` test."""
_RUNNING: list[pytest.Item] = []


def _starts_a_whole_run(argv: list[str]) -> bool:
    """Whether ``argv`` starts ``ragexp run`` or ``ragexp demo`` (the console script, ``-m
    ragexp`` or ``python -c`` code calling the CLI's entry point)."""
    for at, word in enumerate(argv):
        is_cli = (
            Path(word).name == "ragexp"
            or (word == "-m" and argv[at + 1 : at + 2] == ["ragexp"])
            or (word == "-c" and "ragexp.cli" in "".join(argv[at + 1 : at + 2]))
        )
        if is_cli:
            return any(arg in WHOLE_RUNS for arg in argv[at + 1 :])
    return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or not _RUNNING or _RUNNING[-1].get_closest_marker("system"):
        return
    argv = [str(arg) for arg in args[1]] if isinstance(args[1], list | tuple) else [str(args[1])]
    if _starts_a_whole_run(argv):
        raise RuntimeError(
            f"{_RUNNING[-1].nodeid} starts a whole `ragexp run` in a process of its own: mark it "
            "@pytest.mark.system, or call the library in-process (the `ragexp` fixture)"
        )


sys.addaudithook(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _RUNNING.append(item)
    try:
        yield
    finally:
        _RUNNING.pop()


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


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store that MLflow has created and migrated, made once for the session:
    creating one takes seconds, copying its file a fraction of that."""
    from ragexp.tracking.store import Store

    database = tmp_path_factory.mktemp("template") / "mlflow.db"
    Store(f"sqlite:///{database}").experiment_ids()
    return database


@pytest.fixture
def store_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: Path) -> str:
    """A fresh, empty SQLite store (a copy of the session's migrated one); MLFLOW_TRACKING_URI
    points at it for in-process commands."""
    database = tmp_path / "mlruns" / "mlflow.db"
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_store, database)
    uri = f"sqlite:///{database}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def no_store_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where a SQLite store would be, with none there yet (for tests of what creates one, or
    of commands that must not); MLFLOW_TRACKING_URI points at it."""
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
