"""Start the test servers as real processes on 127.0.0.1 and stop them afterwards."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "experiments/kb_zh/service.py"
FAULTY = ROOT / "tests/servers/faulty.py"


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


def stats(url: str) -> dict[str, Any]:
    """GET /stats of a test server (its own self-signed TLS is not what is under test here)."""
    parts = urlsplit(url)
    context = ssl._create_unverified_context() if parts.scheme == "https" else None
    with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/stats", timeout=5, context=context) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data
