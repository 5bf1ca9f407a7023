"""A Ray cluster of one node on 127.0.0.1 (``ray start --head --block``), for the Ray sweep test and
the sweep benchmark; stopped, every process of it, when the context ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
QUIET_RAY = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
"""No usage report leaves the machine; no token shared through ~/.ray between this cluster and
whatever else uses Ray here (the cluster listens on 127.0.0.1 alone)."""


@dataclass
class Cluster:
    address: str
    head: int
    """The pid of ``ray start --block``: every process of the cluster descends from it."""


def descendants(root: int) -> set[int]:
    """Every living process below ``root`` (Ray puts its workers in process groups of their own)."""
    parents = {}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit():
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def ray_head(num_cpus: int = 2, object_store_bytes: int = 100_000_000) -> Iterator[Cluster]:
    """Start the head in a session of its own, yield its address, stop it (SIGTERM, then SIGKILL to
    whatever of it is left, found by ancestry: only this cluster's processes).

    Its environment has none of ragexp's or MLflow's variables and its working directory is its
    own, as on a cluster someone else started: what the points need must reach them through the
    launcher. A short temp dir of its own keeps it apart from any other Ray on the machine (and
    within the length limit of Unix socket paths)."""
    temp = tempfile.mkdtemp(prefix="rgx-ray-", dir="/tmp")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGEXP_", "MLFLOW_"))} | QUIET_RAY
    log_path = Path(temp, "head.log")
    with log_path.open("w") as log:
        head = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={object_store_bytes}",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=temp,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "will now block" not in log_path.read_text(errors="replace"):
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ray start failed:\n" + log_path.read_text(errors="replace"))
            time.sleep(0.5)
        yield Cluster(f"127.0.0.1:{port}", head.pid)
    finally:
        processes = descendants(head.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # whatever of the head's group did not stop on SIGTERM
        for pid in processes:  # workers, in groups of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)
