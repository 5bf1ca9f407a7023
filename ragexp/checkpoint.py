"""Per-case results appended to a local file as they complete, so a crashed run can resume.

Each result is handed to the operating system as it arrives (an answer may have cost an LLM
call): ``kill -9`` loses nothing the service answered. Only the ``fsync`` to the disk is
periodic, which matters for a power cut, not a killed process. A torn last line (the process
died mid-write) is ignored on reading.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import BinaryIO

import orjson

from ragexp.errors import StorageError
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
