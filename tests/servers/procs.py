"""Start the test servers as real processes on 127.0.0.1 and stop them afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "experiments/kb_zh/service.py"
FAULTY = ROOT / "tests/servers/faulty.py"
DROPPROXY = ROOT / "tests/servers/dropproxy.py"


@contextmanager
def serve(script: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run ``script --port 0 ARGS``; yields the URL it prints."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else None,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"{script.name} did not start: {line!r}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


PRESET_STANDINS = {
    "dify": ("dify.py", "/v1/chat-messages", "RAGEXP_DIFY_AUTH", "Bearer app-standin"),
    "ragflow": ("ragflow.py", "/api/v1/chats/standin/completions", "RAGEXP_RAGFLOW_AUTH", "Bearer ragflow-standin"),
    "openai_chat": ("openai_chat.py", "/v1/chat/completions", "RAGEXP_OPENAI_AUTH", "Bearer sk-standin"),
}
"""Packaged system preset -> its stand-in, the path the preset posts to, the preset's auth
variable and the key the stand-in takes."""


@contextmanager
def preset_standin(system: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> Iterator[tuple[str, list[str]]]:
    """Serve the stand-in of the ``system`` preset (``args`` to its script), the preset's auth
    variable set to its key; yields its URL and the overrides that point the preset at it."""
    script, path, variable, key = PRESET_STANDINS[system]
    monkeypatch.setenv(variable, key)
    with serve(ROOT / "tests/servers" / script, *args) as url:
        yield url, [f"system={system}", f"provider.system.url={url}{path}"]


def stats(url: str) -> dict[str, Any]:
    """GET /stats of a test server (its own self-signed TLS is not what is under test here)."""
    parts = urlsplit(url)
    context = ssl._create_unverified_context() if parts.scheme == "https" else None
    with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/stats", timeout=5, context=context) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def proxy_seen(url: str) -> list[list[str]]:
    """What a drop proxy (tests/servers/dropproxy.py) was asked: [METHOD, PATH, ACTION] each."""
    with urllib.request.urlopen(f"{url}/__proxy__/stats", timeout=5) as response:
        seen: list[list[str]] = json.loads(response.read())["seen"]
    return seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def mlflow_server(folder: Path, port: int | None = None, workers: int = 1, prefix: Sequence[str] = ()) -> Iterator[str]:
    """A real ``mlflow server`` over a SQLite store in ``folder``; yields its URL. Killed (with its
    workers) on exit, as a crashed server would be; the same folder and port can be served again.
    ``prefix`` goes before the command (``taskset -c 1`` pins it to a core)."""
    port = port or free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            *prefix,
            str(mlflow),
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder}/server.db",
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180  # a loaded two-core machine can take a minute to import it
        while time.time() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2):
                break
            if proc.poll() is not None:
                raise RuntimeError("mlflow server exited at start")
            time.sleep(0.5)
        else:
            raise RuntimeError("mlflow server did not start")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
