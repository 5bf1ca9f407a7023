"""Progress on stderr (Rich), for work that takes more than a second: a bar with rate and time
left for work counted case by case (:class:`Progress`), and a line with a spinner and the time
spent for a phase that has no count to show (:class:`Phase`: loading, scoring, logging).

Shown on a terminal only (or when ``progress=true`` asks for it): a CI log or a pipe gets no bar.
Work that ends within :data:`DELAY_S` prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
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


class Phase:
    """``with Phase("scoring 150,000 cases"):`` -- once the phase has taken :data:`DELAY_S`, a line
    with a spinner, the label and the time spent, redrawn from a thread of Rich's while the work
    holds the main thread; when the phase ends the line stays, marked done, with its time."""

    def __init__(self, label: str, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._lock = threading.Lock()
        self._ended = False
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Phase:
        if self.enabled:
            self._timer = threading.Timer(DELAY_S, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._bar = _rich_phase(self.stream)
            self._task = self._bar.add_task(self.label)
            self._bar.tasks[0].start_time = time.monotonic() - DELAY_S
            self._bar.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._ended = True
            if self._bar is not None:
                done = "done" if kind is None else "stopped"
                self._bar.update(self._task, description=f"{self.label}: {done}", total=1, completed=1)
                self._bar.stop_task(self._task)
                self._bar.refresh()
                self._bar.stop()
                self._bar = None


def _rich_phase(stream: TextIO) -> RichProgress:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=stream, force_terminal=True, highlight=False)
    return Progress(
        SpinnerColumn(finished_text="✓"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=True,
        refresh_per_second=10,
        transient=False,
    )
