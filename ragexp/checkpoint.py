"""Per-case results appended to a local file as they complete, so a crashed run can resume.

Lines are flushed in small batches: a killed process loses at most the last fraction of a
second of results, and the file is written by the operating system even under ``kill -9``.
A torn last line (the process died mid-write) is ignored on reading.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import BinaryIO

import orjson

from ragexp.records import CaseResult, SystemOutput

FLUSH_EVERY = 0.25


class Checkpoint:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: BinaryIO | None = path.open("ab")
        self._buffer: list[bytes] = []
        self._flushed = time.monotonic()

    def add(self, result: CaseResult) -> None:
        output = result.output
        self._buffer.append(
            orjson.dumps(
                {
                    "id": result.case_id,
                    "output": output.to_json() if output is not None else None,
                    "latency_seconds": output.latency_seconds if output is not None else None,
                    "error": result.error,
                },
                option=orjson.OPT_APPEND_NEWLINE,
            )
        )
        if time.monotonic() - self._flushed >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._file is not None and self._buffer:
            self._file.write(b"".join(self._buffer))
            self._file.flush()
            self._buffer.clear()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
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
        )
    return done
