"""``system=python``: the team's own pipeline, imported and called in-process.

``provider.system.target`` names ``package.module:attr`` (``attr`` may be dotted): a plain or
async function, or an object with ``invoke``/``ainvoke`` (a LangChain Runnable; ``ainvoke``
wins). Its return value is turned into plain data and read with the ``response`` mapping, as an
HTTP system's reply is.

Sync targets run in ``concurrency`` daemon threads, async ones on one event loop in a daemon
thread, with at most ``concurrency`` calls in flight; workers report their own results. The
calling thread only watches the deadlines: a call past ``timeout_s`` is an error for its case and
is abandoned
(a Python call cannot be stopped from outside), its slot goes to a fresh worker, and since every
worker is a daemon thread a call that never returns keeps neither the run nor the process alive.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from time import monotonic, perf_counter
from types import ModuleType
from typing import Any, cast

from ragexp import secrets
from ragexp.config.models import PythonSystemConfig, ResponseMapping
from ragexp.conversations import Turns
from ragexp.datasets.loader import Dataset
from ragexp.errors import ProviderError
from ragexp.providers.base import OnResult, Provider, Retrieval
from ragexp.providers.expressions import to_plain
from ragexp.providers.mapping import (
    CompiledMapping,
    ReplyError,
    check_template,
    compile_mapping,
    mark_missing,
    over_contract,
    render,
)
from ragexp.providers.user_output import guard_stdout
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.transport import collecting_garbage
from ragexp.usercode.calls import DaemonExecutor
from ragexp.usercode.imports import check_target, describe, import_target, module_identity, source_identity

WHERE = "provider.system"
CALL_KEYWORDS = ("question", "k", "case_id", "metadata", "history")
"""Parameter names a target receives by keyword, each with the case's value (``history``: the
earlier turns of the case's conversation as ``{"role", "content"}`` messages, empty for a single
question or a first turn)."""
PROBE_TEXT = 4000
"""Characters of the return value ``validate --probe`` shows."""
BLOCKED_GRACE_S = 5.0
"""How long past its deadline an async call may stay unresolved before the event loop is taken
to be blocked (a coroutine calling ``time.sleep``): its own timer could not fire."""
BLOCKED_REASON = "not evaluated: a call blocked the event loop (an async target that does not await, e.g. time.sleep)"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True)
class Target:
    """A resolved target and how each case calls it."""

    function: Callable[..., Any]
    """What is called: the function itself, or the object's ``invoke``/``ainvoke``."""
    is_async: bool
    """Called on the event loop (a coroutine function, or ``ainvoke``)."""
    keywords: tuple[str, ...]
    """Names of :data:`CALL_KEYWORDS` passed by keyword."""
    positional: bool
    """One positional argument: the rendered ``input`` template, or else the question."""
    module: ModuleType
    """The module named before the colon (its version or file identifies the system)."""


def load_target(
    spec: str, path: str | None = None, *, has_input: bool = False, timeout_s: float | None = None
) -> Target:
    """Import ``package.module:attr`` and work out how to call it; a ProviderError naming the key
    otherwise. The working directory and ``path`` go first on the import path; an import still
    running after ``timeout_s`` is refused (None: no bound)."""
    obj, module = import_target(spec, path, WHERE, timeout_s=timeout_s)
    runnable = _runnable(obj, module)
    if runnable is not None:
        return runnable
    if not callable(obj):
        query = next((name for name in ("query", "aquery") if callable(getattr(obj, name, None))), None)
        hint = f" (its {query} method: {spec}.{query})" if query else ""
        raise ProviderError(
            f"{WHERE}.target: '{spec}' is {type(obj).__name__}, not a function or an object with invoke/ainvoke{hint}"
        )
    keywords, positional = _calling(obj, spec, has_input)
    return Target(obj, _is_coroutine_function(obj), keywords, positional, module)


def _runnable(obj: Any, module: ModuleType) -> Target | None:
    """An object (neither a function nor a class) with ``ainvoke`` or ``invoke``, the LangChain
    runnable's way, called with one dict; ``ainvoke`` first, on the event loop."""
    if inspect.isroutine(obj) or inspect.isclass(obj):
        return None
    for method, is_async in (("ainvoke", True), ("invoke", False)):
        function = getattr(obj, method, None)
        if callable(function):
            return Target(function, is_async, (), True, module)
    return None


def _calling(function: Callable[..., Any], spec: str, has_input: bool) -> tuple[tuple[str, ...], bool]:
    """(keyword names, whether one positional argument is passed) for a plain callable."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        raise ProviderError(f"{WHERE}.target: cannot read the signature of '{spec}' to call it") from None
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    takes_one = bool(positional) or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    required = [p for p in parameters if p.default is inspect.Parameter.empty and p.kind not in _VARIADIC]
    shown = ", ".join(str(p.replace(annotation=inspect.Parameter.empty)) for p in parameters)
    signature = f"'{spec}({shown})'"
    if has_input:
        # The rendered template is the one argument, exactly as a Runnable's invoke takes it.
        if not takes_one or len(required) > 1 or (required and required[0] not in positional[:1]):
            raise ProviderError(
                f"{WHERE}.input: is passed as one positional argument, and {signature} cannot be called with one"
            )
        return (), True
    keywords = tuple(
        p.name for p in parameters if p.name in CALL_KEYWORDS and p.kind is not inspect.Parameter.POSITIONAL_ONLY
    )
    others = [p for p in required if p.name not in keywords]
    if not others:
        if keywords:
            return keywords, False
        if takes_one:
            return (), True
    elif len(others) == 1 and positional and others[0] is positional[0] and "question" not in keywords:
        return keywords, True
    unknown = ", ".join(f"'{p.name}'" for p in others) or "no parameter"
    raise ProviderError(
        f"{WHERE}.target: cannot call {signature}: it takes {unknown} and ragexp passes "
        f"{', '.join(CALL_KEYWORDS)} by name (one other positional parameter gets the question), "
        f"or the {WHERE}.input template as the one argument"
    )


def _is_coroutine_function(function: Any) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - an instance whose __call__ is async
    return not inspect.isroutine(function) and inspect.iscoroutinefunction(call)


class PythonProvider(Provider):
    config: PythonSystemConfig
    remote = True
    """A pipeline may be slow or cost money per call (an LLM): results are checkpointed and a
    resumed run keeps them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.system = self.config
        self.mapping: CompiledMapping = compile_mapping(over_contract(self.system.response), f"{WHERE}.response")
        self._target: Target | None = None
        self._generator: Target | None = None

    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        return self.mapping.fields()

    def check(self, dataset: Dataset) -> None:
        system = self.system
        check_target(system.target, WHERE)
        if system.input is not None:
            check_template(system.input, f"{WHERE}.input", dataset.cases, str(dataset.path))

    def preflight(self, dataset: Dataset) -> None:
        system = self.system
        guard_stdout()  # before the import: what the module prints there is not ragexp's output either
        self._target = load_target(
            system.target, system.path, has_input=system.input is not None, timeout_s=system.timeout_s
        )

    def identity(self) -> str | None:
        if self._target is None:
            return None
        own = f"python:{source_identity(self._target.module)}"
        spec = self.system.generate
        module = spec.partition(":")[0] if spec else None
        if module is None or module == self._target.module.__name__:
            return own
        # The answer stage diff --attribute replays is the team's code too: a change to it is
        # another system, or the attribution would replay code the runs never ran.
        return f"{own}+generate:{module_identity(module)}"

    def probe(self, case: Case) -> dict[str, Any]:
        target = self._target
        if target is None:
            raise RuntimeError("PythonProvider.probe called before preflight")
        calls = _Calls(target, self.system, self.mapping, [case], self.settings.k, self.settings.outputs)
        args, kwargs = calls.arguments(case)
        report: dict[str, Any] = {
            "case_id": case.id,
            "method": "call",
            "url": self.system.target,
            "body": to_plain({"args": list(args), "kwargs": kwargs}),
        }
        outcome = _call_once(target, args, kwargs, self.system.timeout_s)
        if isinstance(outcome, BaseException):
            report["error"] = calls.failed(case, outcome).error
            return report
        if outcome is None:
            report["error"] = calls.timed_out(0).error
            return report
        value, latency = outcome.value, outcome.seconds
        plain = to_plain(value)
        text = json.dumps(plain, ensure_ascii=False, indent=1, default=str)
        report["seconds"] = round(latency, 3)
        report["raw"] = secrets.scrub(text[:PROBE_TEXT]) + ("..." if len(text) > PROBE_TEXT else "")
        mapping = self.mapping
        extracted: dict[str, Any] = {}
        missing: dict[str, str] = {}
        for key in mapping.expressions:
            label = f"{key} ({getattr(mapping.mapping, key)!r})"
            try:
                extracted[label] = found = mapping.search(key, plain)
            except ReplyError as exc:
                extracted[label] = f"failed: {exc}"
                continue
            mark_missing(missing, label, key, found, mapping.gaps(key, plain, found), self.settings.outputs)
        report["extracted"] = extracted
        report["missing"] = missing
        result = calls.finish(case, value, latency)
        report["output"] = result.output.to_json() if result.output is not None else None
        report["error"] = result.error
        return report

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        target = self._target
        if target is None:  # run() before preflight() is a programming error, not bad input
            raise RuntimeError("PythonProvider.run called before preflight")
        if not cases:
            return
        workers = min(self.settings.concurrency, len(cases))
        calls = _Calls(target, self.system, self.mapping, cases, self.settings.k, self.settings.outputs)
        driver: _Driver = (_Loop if target.is_async else _Threads)(calls, workers, self.system.timeout_s, on_result)
        driver.drive()

    def ask_chains(self, chains: Turns, on_result: OnResult) -> None:
        target = self._target
        if target is None:
            raise RuntimeError("PythonProvider.ask_chains called before preflight")
        if not chains.cases:
            return
        workers = min(self.settings.concurrency, len(chains.chains))
        calls = _Calls(target, self.system, self.mapping, chains.cases, self.settings.k, self.settings.outputs)
        driver: _Driver = (_Loop if target.is_async else _Threads)(
            calls, workers, self.system.timeout_s, on_result, chains
        )
        driver.drive()

    def generation_missing(self) -> str | None:
        if self.system.generate is None:
            return (
                "provider.system.generate is not set (package.module:attr of the answer stage, "
                "called with the question and the contexts)"
            )
        return None

    def generate(self, cases: Sequence[Case], retrievals: Sequence[Retrieval], on_result: OnResult) -> None:
        spec = self.system.generate
        if spec is None:
            raise ProviderError(self.generation_missing() or "")
        if not cases:
            return
        target = self._generator or load_generator(spec, self.system.path, timeout_s=self.system.timeout_s)
        self._generator = target
        needed = frozenset({"response"}) | (self.settings.outputs or frozenset({"citations"})) & {"citations"}
        calls = _GenerateCalls(target, self.system, GENERATE_MAPPING, cases, self.settings.k, needed)
        calls.given = {case.id: given for case, given in zip(cases, retrievals, strict=True)}

        def keep_retrieval(index: int, result: CaseResult) -> None:
            if result.output is not None:
                given = retrievals[index]
                result.output.ranked_ids = list(given.ranked_ids)
                result.output.contexts = list(given.contexts)
                result.output.doc_ids = list(given.doc_ids)
            on_result(index, result)

        workers = min(self.settings.concurrency, len(cases))
        driver: _Driver = (_Loop if target.is_async else _Threads)(
            calls, workers, self.system.timeout_s, keep_retrieval
        )
        driver.drive()


GENERATE_MAPPING = compile_mapping(ResponseMapping(answer="answer", citations="citations"), f"{WHERE}.generate")
"""How a ``generate`` function's return value is read (a bare string is the answer)."""


def load_generator(spec: str, path: str | None = None, *, timeout_s: float | None = None) -> Target:
    """The answer stage ``provider.system.generate`` names: a function called with the question
    and the contexts, or an object whose ``invoke``/``ainvoke`` takes ``{"question", "contexts"}``."""
    where = f"{WHERE}.generate"
    obj, module = import_target(spec, path, where, timeout_s=timeout_s)
    runnable = _runnable(obj, module)
    if runnable is not None:
        return runnable
    if not callable(obj):
        raise ProviderError(
            f"{where}: '{spec}' is {type(obj).__name__}, not a function or an object with invoke/ainvoke"
        )
    return Target(obj, _is_coroutine_function(obj), (), False, module)


@dataclass(frozen=True)
class _Returned:
    value: Any
    seconds: float


def _call_once(
    target: Target, args: tuple[Any, ...], kwargs: dict[str, Any], timeout_s: float
) -> _Returned | BaseException | None:
    """One call in a daemon thread (on an event loop of its own for an async target): what it
    returned and how long it took, what it raised, or None when it ran past ``timeout_s``."""
    box: list[_Returned | BaseException] = []

    def work() -> None:
        started = perf_counter()
        try:
            if target.is_async:
                loop = asyncio.new_event_loop()
                loop.set_default_executor(DaemonExecutor(1))
                value = loop.run_until_complete(cast(Awaitable[Any], target.function(*args, **kwargs)))
            else:
                value = target.function(*args, **kwargs)
        except BaseException as exc:  # the target's own failure, reported as the probe's error
            box.append(exc)
            return
        box.append(_Returned(value, perf_counter() - started))

    thread = threading.Thread(target=work, name="ragexp-python-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else None


class _Calls:
    """One case -> one call -> one CaseResult; never raises for what the target does."""

    def __init__(
        self,
        target: Target,
        system: PythonSystemConfig,
        mapping: CompiledMapping,
        cases: Sequence[Case],
        k: int,
        needed: frozenset[str] | None = None,
    ) -> None:
        self.target = target
        self.mapping = mapping
        self.cases = cases
        self.k = k
        self.needed = needed
        self.input = system.input
        self.timeout_s = system.timeout_s

    def arguments(self, case: Case) -> tuple[tuple[Any, ...], dict[str, Any]]:
        target = self.target
        values = {
            "question": case.question,
            "k": self.k,
            "case_id": case.id,
            "metadata": case.metadata,
            "history": case.history or [],
        }
        kwargs = {name: values[name] for name in target.keywords}
        if not target.positional:
            return (), kwargs
        first = case.question if self.input is None else render(self.input, case, self.k)
        return (first,), kwargs

    def call(self, index: int) -> CaseResult:
        case = self.cases[index]
        try:
            args, kwargs = self.arguments(case)
        except Exception as exc:  # a placeholder this case cannot fill
            return CaseResult(case.id, None, secrets.scrub(f"{WHERE}.input: {describe(exc)}"))
        started = perf_counter()
        try:
            value = self.target.function(*args, **kwargs)
        except BaseException as exc:  # in a worker thread: a KeyboardInterrupt here is the target's own
            return self.failed(case, exc)
        return self.finish(case, value, perf_counter() - started)

    async def call_async(self, index: int) -> CaseResult:
        case = self.cases[index]
        try:
            args, kwargs = self.arguments(case)
        except Exception as exc:
            return CaseResult(case.id, None, secrets.scrub(f"{WHERE}.input: {describe(exc)}"))
        started = perf_counter()
        try:
            value = await cast(Awaitable[Any], self.target.function(*args, **kwargs))
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # ragexp cancelled this call (past its deadline): not the target's failure
            return self.failed(case, exc)
        except BaseException as exc:  # on the loop's thread: a KeyboardInterrupt here is the target's own
            return self.failed(case, exc)
        return self.finish(case, value, perf_counter() - started)

    def failed(self, case: Case, exc: BaseException) -> CaseResult:
        return CaseResult(case.id, None, secrets.scrub(describe(exc)))

    def finish(self, case: Case, value: Any, latency: float) -> CaseResult:
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: close it, or Python warns at exit
            return CaseResult(case.id, None, "the target returned an awaitable from a sync call: make it async def")
        if isinstance(value, Iterator | AsyncIterator):
            return CaseResult(case.id, None, _iterator_error(value))
        try:
            output = self.mapping.extract(to_plain(value), latency, self.needed)
        except ReplyError as exc:
            return CaseResult(case.id, None, secrets.scrub(f"{WHERE}.response: {exc}"))
        except Exception as exc:  # an attribute that raises while the value is taken apart
            return CaseResult(case.id, None, secrets.scrub(f"reading the return value: {describe(exc)}"))
        return CaseResult(case.id, _scrubbed(output))

    def timed_out(self, index: int) -> CaseResult:
        # Retryable: a stalled call says nothing about the case, and --resume asks it again.
        reason = f"timed out after {self.timeout_s:g} s ({WHERE}.timeout_s)"
        return CaseResult(self.cases[index].id, None, reason, retryable=True)


def _iterator_error(value: Any) -> str:
    """Why a generator or iterator is not an answer; the generator is closed (never run on)."""
    kind = "an async generator" if inspect.isasyncgen(value) else "a generator" if inspect.isgenerator(value) else None
    kind = kind or f"an iterator ({type(value).__name__})"
    if inspect.isgenerator(value):
        value.close()
    return (
        f"the target returned {kind}, not its answer: ragexp reads one return value per case. "
        "Return the whole result (a dict, an object, a list): for a LangChain Runnable call invoke, not stream; "
        "for a generator, collect what it yields"
    )


def _scrubbed(output: SystemOutput) -> SystemOutput:
    """A pipeline may echo a registered secret (a judge key it shares) into what it returns."""
    output.answer = secrets.scrub(output.answer)
    output.contexts = [secrets.scrub(text) for text in output.contexts]
    output.ranked_ids = [secrets.scrub(item) for item in output.ranked_ids]
    output.doc_ids = [secrets.scrub(item) for item in output.doc_ids]
    return output


class _Driver:
    """Runs the calls in worker threads, which report each result themselves; the caller's
    thread only waits, enforces the deadlines and re-raises what a report raised.

    Each of ``workers`` slots holds at most one call in flight: ``current[slot]`` is its case
    index and start time. A slot gives up its call under ``lock`` before reporting it, and a
    call past its deadline is taken from its slot under the same lock, so a case reported as
    timed out is never reported again. Reports are serialised by ``report_lock`` (the runner's
    callback writes the checkpoint), and none is made once :meth:`stop` returned.
    """

    def __init__(
        self, calls: _Calls, workers: int, timeout_s: float, on_result: OnResult, chains: Turns | None = None
    ) -> None:
        self.calls = calls
        self.chains = chains
        """Cases asked as chains: a slot takes the next ready case (``ready``), and a chain's next
        case becomes ready when the one before it is reported. A slot that finds none ready
        leaves its worker (``idle``); a slot taking a case wakes as many idle ones as cases stay
        ready."""
        self.ready: deque[int] = deque(chains.first()) if chains is not None else deque()
        self.idle: list[int] = []
        self.closed = False
        """No more cases are taken (the event loop was blocked): each ready case is reported
        as not evaluated instead."""
        self.workers = workers
        self.timeout_s = timeout_s
        self.on_result = on_result
        self.total = len(calls.cases)
        self.lock = threading.Lock()
        self.report_lock = threading.Lock()
        self.done = threading.Event()
        self.reported = 0
        self.next_index = 0
        self.current: list[tuple[int, float] | None] = [None] * workers
        self.generation = [0] * workers
        """Bumped when a slot's call is taken from it: the worker holding it then stops."""
        self.stopped = False
        self.failure: BaseException | None = None

    def drive(self) -> None:
        """Start the workers, wait for every report, and stop them, whatever the wait raised."""
        with collecting_garbage():  # a pipeline's own cycles (callbacks, futures) must not pile up
            self.start()
            try:
                self.wait()
            finally:
                self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def overdue(self, now: float) -> None:
        """Report the calls past their deadline (from the caller's thread)."""
        raise NotImplementedError

    def next_wake(self) -> float | None:
        """Another moment the caller's thread must look (beside the calls' deadlines)."""
        return None

    def wait(self) -> None:
        """Until every case is reported; re-raises what a report or a worker raised."""
        while not self.done.wait(self._until_deadline()):
            self.overdue(monotonic())
        if self.failure is not None:
            raise self.failure

    def take(self, slot: int) -> int | None:
        """The next case for ``slot`` (None: no more), recorded as in flight."""
        with self.lock:
            if self.chains is not None:
                return self._take_ready(slot, self.chains)
            if self.stopped or self.next_index >= self.total:
                self.current[slot] = None
                return None
            index = self.next_index
            self.next_index += 1
            self.current[slot] = (index, monotonic())
            return index

    def _take_ready(self, slot: int, chains: Turns) -> int | None:
        """:meth:`take` of a chained run, under ``lock``."""
        if self.stopped or self.closed or not self.ready:
            self.current[slot] = None
            self.idle.append(slot)
            return None
        index = self.ready.popleft()
        chains.prepare(index)
        self.current[slot] = (index, monotonic())
        for _ in range(min(len(self.ready), len(self.idle))):
            self.wake(self.idle.pop())
        return index

    def wake(self, slot: int) -> None:
        """Start a worker for the idle ``slot`` (under ``lock``)."""
        raise NotImplementedError

    def release(self, slot: int, generation: int) -> bool:
        """Give up the slot's call to report it; False when it was reported as timed out."""
        with self.lock:
            if self.generation[slot] != generation:
                return False
            self.current[slot] = None
            return True

    def late(self, now: float) -> list[tuple[int, int]]:
        """(slot, case index) of every call past its deadline, each taken from its slot."""
        found: list[tuple[int, int]] = []
        with self.lock:
            for slot, entry in enumerate(self.current):
                if entry is not None and now - entry[1] >= self.timeout_s:
                    self.generation[slot] += 1
                    self.current[slot] = None
                    found.append((slot, entry[0]))
        return found

    def report(self, index: int, result: CaseResult) -> None:
        with self.report_lock:
            if self.stopped:
                return
            try:
                self.on_result(index, result)
                if self.chains is not None:
                    self._settle(index, result, self.chains)
            except BaseException as exc:  # e.g. the disk is full: the run stops with that error
                self.fail(exc)
                return
            self.reported += 1
            if self.reported == self.total:
                self.done.set()

    def _settle(self, index: int, result: CaseResult, chains: Turns) -> None:
        """After a chained case's report (under ``report_lock``): the cases its failure leaves
        not asked reported, or its chain's next case made ready."""
        while True:
            unasked, after = chains.settled(index, result)
            for other, outcome in unasked:
                self.on_result(other, outcome)
            self.reported += len(unasked)
            if after is None:
                return
            with self.lock:
                if not self.closed:
                    self.ready.append(after)
                    return
            index, result = after, CaseResult(self.calls.cases[after].id, None, BLOCKED_REASON, retryable=True)
            self.on_result(index, result)
            self.reported += 1

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        with self.lock:
            self.stopped = True
        self.done.set()

    def guarded(self, work: Callable[..., None], *args: Any) -> None:
        """Run a worker's loop; if it dies (a ragexp bug), the run stops instead of waiting."""
        try:
            work(*args)
        except BaseException as exc:
            self.fail(RuntimeError(f"a python-system worker failed: {describe(exc)}"))

    def _until_deadline(self) -> float:
        wakes = [entry[1] + self.timeout_s for entry in self.current if entry is not None]
        extra = self.next_wake()
        if extra is not None:
            wakes.append(extra)
        if not wakes:
            return 1.0
        return max(0.0, min(wakes) - monotonic()) + 0.001

    def stop(self) -> None:
        with self.report_lock, self.lock:
            self.stopped = True


class _Threads(_Driver):
    """A sync target: one daemon thread per slot; a timed-out slot gets a new thread."""

    def start(self) -> None:
        for slot in range(self.workers):
            self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        thread = threading.Thread(
            target=self.guarded,
            args=(self._work, slot, self.generation[slot]),
            name=f"ragexp-python-{slot}",
            daemon=True,
        )
        thread.start()

    def _work(self, slot: int, generation: int) -> None:
        call = self.calls.call
        while True:
            index = self.take(slot)
            if index is None:
                return
            result = call(index)
            if not self.release(slot, generation):
                return  # timed out and reported; the slot has a new worker
            self.report(index, result)

    def wake(self, slot: int) -> None:
        self._spawn(slot)

    def overdue(self, now: float) -> None:
        for slot, index in self.late(now):
            self._spawn(slot)
            self.report(index, self.calls.timed_out(index))


class _Loop(_Driver):
    """An async target: one event loop in a daemon thread, one worker coroutine per slot.

    A call past its deadline is reported from the caller's thread, and the loop is asked to
    cancel its worker and start a fresh one for the slot: a coroutine that swallows the
    cancellation is left behind holding nothing. If the loop does not get to that request, a
    coroutine is holding it without awaiting (``time.sleep`` in ``async def``): no other case can
    run on it, so the cases not started are reported as not evaluated. Sync work the target hands
    to the loop's default executor (a Runnable's sync steps under ``ainvoke``) runs in daemon
    threads too.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.tasks: list[asyncio.Task[None] | None] = [None] * self.workers
        self.loop: asyncio.AbstractEventLoop | None = None
        self.asked: float | None = None
        """When the caller's thread asked the loop to replace a worker, until the loop does."""
        self.abandoned = 0

    def start(self) -> None:
        started = threading.Event()
        thread = threading.Thread(
            target=self.guarded, args=(self._main, started), name="ragexp-python-loop", daemon=True
        )
        thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(DaemonExecutor(self.workers))
        asyncio.set_event_loop(loop)
        self.loop = loop
        for slot in range(self.workers):
            self._spawn(loop, slot)
        started.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def _spawn(self, loop: asyncio.AbstractEventLoop, slot: int) -> None:
        self.tasks[slot] = loop.create_task(self._worker(slot, self.generation[slot]))

    async def _worker(self, slot: int, generation: int) -> None:
        call = self.calls.call_async
        while True:
            index = self.take(slot)
            if index is None:
                return
            result = await call(index)
            if not self.release(slot, generation):
                return  # timed out and reported; the slot has a new worker
            self.report(index, result)

    def wake(self, slot: int) -> None:
        loop = self.loop
        if loop is not None:  # taken on the loop's thread: a task can be created here
            self._spawn(loop, slot)

    def _replace(self, loop: asyncio.AbstractEventLoop, slot: int) -> None:
        with self.lock:
            self.asked = None
        old = self.tasks[slot]
        if old is not None and not old.done():
            old.cancel()
            # Left behind on purpose: no "Task was destroyed but it is pending" at exit.
            old._log_destroy_pending = False  # type: ignore[attr-defined]
        self._spawn(loop, slot)

    def overdue(self, now: float) -> None:
        late = self.late(now)
        with self.lock:
            if late and self.asked is None:
                self.asked = now
            blocked = self.asked is not None and now - self.asked >= BLOCKED_GRACE_S
            unstarted: Sequence[int] = range(self.next_index, self.total) if blocked else range(0)
            if blocked:
                self.next_index = self.total
                if self.chains is not None:
                    unstarted, self.closed = list(self.ready), True
                    self.ready.clear()
        loop = self.loop
        for slot, index in late:
            self.abandoned += 1
            self.report(index, self.calls.timed_out(index))
            if loop is not None:
                loop.call_soon_threadsafe(self._replace, loop, slot)
        for index in unstarted:
            self.report(index, CaseResult(self.calls.cases[index].id, None, BLOCKED_REASON, retryable=True))

    def next_wake(self) -> float | None:
        return None if self.asked is None else self.asked + BLOCKED_GRACE_S

    def stop(self) -> None:
        super().stop()
        loop = self.loop
        if loop is not None and not self.abandoned and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)  # with calls left behind, the loop runs on as a daemon


class _GenerateCalls(_Calls):
    """One case and its given retrieval -> one call of the answer stage -> one CaseResult."""

    given: dict[str, Retrieval]

    def arguments(self, case: Case) -> tuple[tuple[Any, ...], dict[str, Any]]:
        contexts = list(self.given[case.id].contexts)
        if self.target.positional:  # invoke/ainvoke: one input, as a Runnable takes it
            return ({"question": case.question, "contexts": contexts},), {}
        return (case.question, contexts), {}

    def finish(self, case: Case, value: Any, latency: float) -> CaseResult:
        return super().finish(case, {"answer": value} if isinstance(value, str) else value, latency)
