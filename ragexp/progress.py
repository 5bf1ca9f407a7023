"""A progress bar on stderr with rate and time left (Rich), for work that takes more than a second.

Shown on a terminal only (or when ``progress=true`` asks for it): a CI log or a pipe gets no bar.
A run that ends within :data:`DELAY_S` prints nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import Task

DELAY_S = 1.0
"""How long work runs before its bar appears."""
REDRAW_S = 0.1
"""Shortest time between two redraws."""
MAX_STRIDE = 64
CHECK_S = (0.001, 0.01)
"""The clock is read about once in this many seconds, whatever the pace of the cases."""


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.label = label
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self.errors = 0
        self._started = time.monotonic()
        self._drawn = self._checked = self._started
        self._stride = 1
        self._bar: RichProgress | None = None
        self._task: Any = None

    def advance(self, error: bool = False) -> None:
        self.done += 1
        self.errors += error
        # Reading the clock for every case would cost more than a fake case itself: it is read
        # every `_stride` cases, a stride that follows the pace of the cases (see CHECK_S).
        if not self.enabled or (self.done % self._stride and self.done != self.total):
            return
        now = time.monotonic()
        since, self._checked = now - self._checked, now
        if since < CHECK_S[0]:
            self._stride = min(self._stride * 2, MAX_STRIDE)
        elif since > CHECK_S[1] and self._stride > 1:
            self._stride //= 2
        if now - self._drawn >= REDRAW_S and now - self._started >= DELAY_S:
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        if self._bar is None:
            self._bar = _rich_bar(self.stream)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, errors="")
            # What was done before the bar appeared counts towards its rate.
            self._bar.tasks[0].start_time = self._started
        errors = f"{self.errors} error{'s' if self.errors > 1 else ''}" if self.errors else ""
        self._bar.update(self._task, completed=self.done, errors=errors, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._draw()
            self._bar.stop()
            self._bar = None


def _rich_bar(stream: TextIO) -> RichProgress:
    # Imported here: most runs end before a bar would appear, or have no terminal to draw it on.
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        """Cases a second, over the whole run so far (a judge run's pace changes little)."""

        def render(self, task: Task) -> Text:
            elapsed = task.elapsed or 0.0
            rate = task.completed / elapsed if elapsed > 0 else 0.0
            return Text(f"{rate:,.1f}/s" if rate < 100 else f"{rate:,.0f}/s")

    console = Console(file=stream, force_terminal=True, highlight=False)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        Rate(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[errors]}"),
        console=console,
        auto_refresh=False,
        transient=False,
    )
