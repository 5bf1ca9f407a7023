"""A run's local state beside the tracking store: per-case results appended to a checkpoint file
as they complete, so a crashed run can resume; the lock of a run being evaluated; the disk space
kept to mark a run when the disk fills up.

Each result is handed to the operating system as it arrives (an answer may have cost an LLM
call): ``kill -9`` loses nothing the service answered. Only the ``fsync`` to the disk is
periodic, which matters for a power cut, not a killed process. A torn last line (the process
died mid-write) is ignored on reading.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import orjson

from ragexp.errors import RunLockedError, StorageError
from ragexp.records import CaseResult, SystemOutput

SYNC_EVERY = 1.0


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: BinaryIO | None = path.open("ab")
        except OSError as exc:
            raise storage_error(exc, path, "cannot write the checkpoint") from None
        self._synced = time.monotonic()

    def add(self, result: CaseResult) -> None:
        output = result.output
        line = orjson.dumps(
            {
                "id": result.case_id,
                "output": output.to_json() if output is not None else None,
                "latency_seconds": output.latency_seconds if output is not None else None,
                "error": result.error,
                "retryable": result.retryable,
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )
        if self._file is None:
            return
        try:
            self._file.write(line)
            self._file.flush()
            if time.monotonic() - self._synced >= SYNC_EVERY:
                os.fsync(self._file.fileno())
                self._synced = time.monotonic()
        except OSError as exc:
            raise storage_error(exc, self.path, "cannot write the checkpoint") from None

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                raise storage_error(exc, self.path, "cannot write the checkpoint") from None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # what could not be written was reported already
                self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def read_checkpoint(data: bytes) -> dict[str, CaseResult]:
    """Case id -> result; the last line wins, a torn line is skipped."""
    done: dict[str, CaseResult] = {}
    for line in data.splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        output = row.get("output")
        done[row["id"]] = CaseResult(
            row["id"],
            SystemOutput.from_json(output, row.get("latency_seconds")) if output is not None else None,
            row.get("error"),
            retryable=bool(row.get("retryable")),
        )
    return done


def storage_error(exc: OSError, path: Path, what: str) -> StorageError:
    """One line for a file that cannot be written, saying plainly when the disk is full."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(f"disk full: {what} {path} (no space left on that device)")
    if exc.errno == errno.EROFS:
        return StorageError(f"read-only file system: {what} {path}")
    return StorageError(f"{what} {path} ({exc.strerror or exc})")


def checkpoint_path(state_dir: Path, run_id: str) -> Path:
    return state_dir / "checkpoints" / f"{run_id}.jsonl"


@contextlib.contextmanager
def run_lock(state_dir: Path, run_id: str) -> Iterator[None]:
    """Held while a process evaluates a run, so a second ``--resume`` of it is refused. The lock
    file is removed when the run ends (while still locked; a process that opened it in that moment
    finds it gone and locks the file that replaces it)."""
    path = state_dir / "checkpoints" / f"{run_id}.lock"
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("a")
        except OSError as exc:
            raise storage_error(exc, path, f"locking run {run_id}:") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunLockedError(
                f"run {run_id} is being evaluated by another process on this machine; "
                "wait for it to end (or stop it) before resuming"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()  # removed by the process that held it: lock its successor
    with handle:
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # a read-only folder keeps an empty file, no more
                path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


RESERVE_PREFIX = ".ragexp-reserve."


class SpaceReserve:
    """``size`` bytes kept in ``folder`` (a SQLite store's; None: nothing kept) while a run writes,
    given back if the disk fills up: marking the run FAILED needs a few pages, and a full disk
    would leave it RUNNING.

    Each process keeps its own file (``.ragexp-reserve.HOST.PID``), so parallel runs into one
    store never delete each other's; files of processes of this host that are gone (a
    ``kill -9``) are removed."""

    def __init__(self, folder: Path | None, size: int = 1 << 20) -> None:
        self.folder, self.size = folder, size
        self.path: Path | None = None

    def __enter__(self) -> SpaceReserve:
        if self.folder is None:
            return self
        host = socket.gethostname().replace("/", "_")
        for stale in self.folder.glob(f"{RESERVE_PREFIX}{host}.*"):
            pid = stale.name.rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    stale.unlink()
        path = self.folder / f"{RESERVE_PREFIX}{host}.{os.getpid()}"
        try:
            with path.open("wb") as handle:
                os.posix_fallocate(handle.fileno(), 0, self.size)
        except OSError:
            path.unlink(missing_ok=True)  # no room even for that: nothing to give back later
            return self
        self.path = path
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def release(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
