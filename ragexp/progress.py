"""A small progress bar on stderr, redrawn at most ten times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.label = label
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self.errors = 0
        self._started = time.monotonic()
        self._drawn = 0.0

    def advance(self, error: bool = False) -> None:
        self.done += 1
        self.errors += error
        # Reading the clock for every case would cost more than a fake case itself.
        if not self.enabled or (self.done & 63 and self.done != self.total):
            return
        now = time.monotonic()
        if now - self._drawn >= 0.1 or self.done == self.total:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        elapsed = now - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        errors = f" {self.errors} errors" if self.errors else ""
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {rate:,.0f}/s{errors}  "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()
