"""Many cheap calls of a team's function (a custom metric's), each under a deadline: :func:`call_each`;
and the event loop's executor of daemon threads that a call which never returns cannot keep alive."""

from __future__ import annotations

import concurrent.futures
import contextlib
import operator
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Any

from ragexp import secrets
from ragexp.usercode.imports import describe


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """The event loop's default executor, with daemon threads: ``ThreadPoolExecutor`` joins its
    own threads at exit, so one call that never returns would keep the process alive after the
    run. (asyncio accepts only a ``ThreadPoolExecutor`` here, hence the subclass.)"""

    def __init__(self, workers: int) -> None:
        super().__init__(max_workers=workers)
        self.workers = workers
        self.work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.work.put((future, lambda: fn(*args, **kwargs)))
        with self.lock:
            if len(self.threads) < self.workers:
                thread = threading.Thread(target=self._serve, name="ragexp-python-executor", daemon=True)
                thread.start()
                self.threads.append(thread)
        return future

    def _serve(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            future, work = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:  # handed to the awaiting coroutine, as ThreadPoolExecutor does
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self.threads:
            self.work.put(None)


def failure_text(exc: BaseException) -> str:
    """How a target's exception is said: its type and message, secrets masked."""
    return secrets.scrub(describe(exc))


@dataclass(frozen=True)
class Raised:
    """What :func:`call_each` holds for a call that raised."""

    error: BaseException


class TimedOut:
    """What :func:`call_each` holds for a call still running past its deadline (it is abandoned)."""


TIMED_OUT = TimedOut()


MAX_CHUNK = 8192
"""Most calls a worker takes at a time. It starts with one and doubles while a chunk takes less
than :data:`CHUNK_S`, halving when one takes longer: slow calls spread over the workers, and
cheap ones cost one lock and one slice per thousands of calls."""


CHUNK_S = 0.02


SLOW_RATE = 1000.0
"""Calls a second per worker under which more workers are started (up to ``workers``): calls of a
millisecond or more wait on something (a service) or cost so much that a thread switch is
nothing beside them; cheaper calls run on one thread, which the GIL would serialise anyway."""


_PENDING = object()


class _Worker:
    """One daemon thread working through chunks of calls: ``span`` is the chunk it holds, ``left``
    the iterator over the chunk's first arguments that its calls are made from, ``values`` what
    they returned so far (each replaced whole, so the watcher never reads half of a chunk's
    state); ``done`` counts the calls of its earlier chunks. Abandoning a worker takes the rest of
    ``left``: no call is made from it after the one it is in."""

    __slots__ = ("abandoned", "done", "left", "span", "thread", "values")

    def __init__(self) -> None:
        self.span: tuple[int, int] = (0, 0)
        self.left: Iterator[Any] = iter(())
        self.values: list[Any] = []
        self.done = 0
        self.abandoned = False
        self.thread: threading.Thread | None = None

    def position(self) -> tuple[tuple[int, int], int, bool]:
        """Its chunk, the index of the call it is in or makes next, and whether that call is made."""
        span, left, values = self.span, self.left, self.values
        made = span[1] - span[0] - operator.length_hint(left)
        at = span[0] + len(values)
        return span, at, len(values) < made


def call_each(
    function: Callable[[Any, Any], Any],
    firsts: Sequence[Any],
    seconds: Sequence[Any],
    *,
    workers: int,
    timeout_s: float,
    second_of: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """``function(firsts[i], seconds[i])`` for every ``i`` on up to ``workers`` daemon threads, each
    call under ``timeout_s``: per call its return value, a :class:`Raised` or :data:`TIMED_OUT`.
    ``second_of`` (an ``operator.attrgetter``, say) is applied to each of ``seconds`` first,
    as the calls are made: no second list is built.

    A system's calls go through :class:`_Driver`, which reports every result as it comes (the
    checkpoint, the progress bar) and so takes locks per call. A metric function is called once
    per case and may cost less than that bookkeeping, so here a worker maps the function over a
    chunk of calls at a time, and the calling thread watches the chunks' progress instead of the
    calls: a call whose value has not come within ``timeout_s`` is timed out, its worker is
    abandoned (a Python call cannot be stopped from outside) and a fresh one takes the rest of its
    chunk. One worker starts; more join while the calls are slow (:data:`SLOW_RATE`). What the
    function prints goes to stderr, so a ``--json`` line on stdout stays whole.
    """
    count = len(firsts)
    results: list[Any] = [_PENDING] * count
    timed_out: set[int] = set()
    lock = threading.Lock()
    returned: list[tuple[int, int]] = []
    """Chunks given back: the rest of an abandoned worker's."""
    cursor = [0]

    def next_span(size: int) -> tuple[int, int] | None:
        with lock:
            if returned:
                start, end = returned.pop()
                if end - start > size:
                    returned.append((start + size, end))
                return start, min(end, start + size)
            start = cursor[0]
            if start >= count:
                return None
            cursor[0] = min(start + size, count)
            return start, cursor[0]

    def left() -> bool:
        with lock:
            return bool(returned) or cursor[0] < count

    def work(me: _Worker) -> None:
        call, size = function, 1
        while not me.abandoned:
            span = next_span(size)
            if span is None:
                return
            started = monotonic()
            start, end = span
            values: list[Any] = []
            me.values, me.left, me.span = values, iter(firsts[start:end]), span
            firsts_left = me.left
            seconds_left = iter(seconds[start:end]) if second_of is None else map(second_of, seconds[start:end])
            while True:
                try:
                    # map takes the first argument first: once the watcher has taken the rest of
                    # them, no further call is made; extend keeps the values made before a raise.
                    values.extend(map(call, firsts_left, seconds_left))
                    break
                except BaseException as exc:  # the function's own failure: that call's result
                    values.append(Raised(exc))
            results[start : start + len(values)] = values
            me.done += len(values)
            took = monotonic() - started
            size = min(size * 2, MAX_CHUNK) if took < CHUNK_S else max(size // 2, 1)

    def spawn() -> None:
        me = _Worker()
        me.thread = threading.Thread(target=work, args=(me,), name="ragexp-metric", daemon=True)
        pool.append(me)
        me.thread.start()

    poll = min(0.05, timeout_s / 10)
    pool: list[_Worker] = []
    seen: dict[int, tuple[tuple[int, int], int, float]] = {}
    """id(worker) -> (its chunk, the call it was in, since when)."""
    with contextlib.redirect_stdout(sys.stderr):
        spawn()
        last, progress = monotonic(), 0
        while True:
            alive = [me for me in pool if not me.abandoned and me.thread is not None and me.thread.is_alive()]
            if not alive:
                if not left():
                    break
                spawn()  # work was given back after every worker had finished
                continue
            alive[0].thread.join(poll)  # type: ignore[union-attr]
            now = monotonic()
            moved = sum(me.done for me in pool)
            for me in alive:
                span, at, made = me.position()
                moved += at - span[0]
                before = seen.get(id(me))
                if before is None or before[:2] != (span, at):
                    seen[id(me)] = (span, at, now)
                elif made and now - before[2] >= timeout_s:
                    me.abandoned = True
                    rest = len(list(me.left))  # taken whole (one C call): the worker gets none of them
                    finished = me.values[:]
                    results[span[0] : span[0] + len(finished)] = finished
                    if len(finished) == at - span[0]:  # else it returned just now, and counts
                        timed_out.add(at)
                    with lock:
                        if rest:
                            returned.append((span[1] - rest, span[1]))
                    spawn()
            slow = moved - progress < SLOW_RATE * (now - last) * len(alive)
            if slow and len(alive) < workers and left():
                for _ in range(min(len(alive), workers - len(alive))):
                    spawn()
            last, progress = now, moved
    if not any(me.abandoned for me in pool):
        return results
    # A copy: an abandoned worker whose call returns late writes into the list it holds, not this.
    final = list(results)
    for index in timed_out:
        final[index] = TIMED_OUT
    return final
