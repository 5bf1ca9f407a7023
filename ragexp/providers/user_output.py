"""What user code prints while ragexp runs it: never on ragexp's stdout.

A Python target is imported and called in worker threads, and may ``print`` at import or on
every call (a debugging line, a progress bar, a library's banner). stdout is ragexp's own channel:
``--json`` prints one object there, and tables a person reads. :func:`guard_stdout` puts a
:class:`ThreadStdout` in place of ``sys.stdout``: what the thread that installed it writes goes to
the real stdout as before; what any other thread writes (the target's workers, the threads a
target starts) goes to stderr a line at a time, its control characters shown as escapes, so a
terminal escape cannot rewrite the screen. It stays installed for the rest of the process: a call
that was abandoned past its deadline may still print later.
"""

from __future__ import annotations

import io
import sys
import threading
from typing import Any, TextIO

from ragexp.escape import terminal

PREFIX = "target: "
"""What each forwarded line starts with, so it is told apart from ragexp's own lines."""


class ThreadStdout(io.TextIOBase):
    """``sys.stdout`` routed by thread: the owner's writes to ``real``, every other thread's to
    ``sink`` (stderr), escaped, a whole line at a time."""

    def __init__(self, real: TextIO, sink: TextIO, owner: threading.Thread) -> None:
        super().__init__()
        self.real = real
        self.sink = sink
        self.owner = owner
        self._partial: dict[int, str] = {}
        self._lock = threading.Lock()

    def _mine(self) -> bool:
        return threading.current_thread() is self.owner

    def write(self, text: str) -> int:
        if self._mine():
            return self.real.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        ident = threading.get_ident()
        with self._lock:
            pending = self._partial.pop(ident, "") + text
            *lines, rest = pending.split("\n")
            if rest:
                self._partial[ident] = rest
            for line in lines:
                self._forward(line)
        return len(text)

    def _forward(self, line: str) -> None:
        try:
            self.sink.write(PREFIX + terminal(line) + "\n")
            self.sink.flush()
        except (OSError, ValueError):  # a closed or broken stderr: user output is not worth a crash
            pass

    def flush(self) -> None:
        if self._mine():
            self.real.flush()
            return
        with self._lock:
            rest = self._partial.pop(threading.get_ident(), "")
            if rest:
                self._forward(rest)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.real.isatty() if self._mine() else False

    def fileno(self) -> int:
        return (self.real if self._mine() else self.sink).fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.real, "errors", None)

    @property
    def buffer(self) -> Any:
        """The byte stream under the text stream (``sys.stdout.buffer``): the owner's is the
        real one; other threads get stderr's, unescaped (bytes are not text to escape)."""
        stream = self.real if self._mine() else self.sink
        return getattr(stream, "buffer", stream)


def guard_stdout() -> None:
    """Route every thread's writes to ``sys.stdout`` but the calling thread's to stderr, from
    now on (once: a second call keeps the first guard)."""
    if isinstance(sys.stdout, ThreadStdout):
        return
    sys.stdout = ThreadStdout(sys.stdout, sys.stderr, threading.current_thread())
