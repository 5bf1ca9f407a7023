"""``kind: http``: a live RAG service, called concurrently with bounded retries.

The request is ragexp's own ``{"question", "k", "case_id"}`` or a template (``request``, sent as
the JSON body or the query string); the reply is read by ragexp's own contract or by a response
mapping (:mod:`ragexp.providers.mapping`), from one JSON body or from a stream of events (SSE or
NDJSON). Every shape goes through the one call policy of :mod:`ragexp.transport`.

Each of ``concurrency`` workers owns one keep-alive connection (its own ``httpx.AsyncClient``)
and pulls cases from a shared queue: connections are reused and there is no shared pool to scan,
which measured faster here than one client under a semaphore.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jmespath.exceptions
import orjson

from ragexp import secrets
from ragexp.config.models import HttpSystemConfig, StreamConfig
from ragexp.datasets.loader import OUTPUT_FIELDS, Dataset
from ragexp.errors import ConfigError, ProviderError
from ragexp.providers.base import OnResult, Provider, RunSettings
from ragexp.providers.mapping import (
    CONTRACT,
    CompiledMapping,
    MappingError,
    ReplyError,
    SystemReplyError,
    check_template,
    compile_expression,
    compile_mapping,
    render,
)
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.transport import (
    AbortWatch,
    BadReply,
    CallFailed,
    CallPolicy,
    Reply,
    call_json,
    check_reachable,
    collecting_garbage,
    describe,
    parse_json,
    read_capped,
    run_interruptibly,
    ssl_context,
)

MAX_CITATION = 2**31 - 1
PROBE_TEXT = 4000
"""Characters of a probed reply shown by ``ragexp validate --probe``."""


class ContractError(ReplyError):
    """The service answered, but not in the shape the contract asks for."""


class HttpProvider(Provider):
    remote = True
    config: HttpSystemConfig

    def __init__(self, config: HttpSystemConfig, settings: RunSettings) -> None:
        super().__init__(config, settings)
        self._headers: dict[str, str] = {}
        self.stream = config.stream if config.stream is not None and config.stream.format != "none" else None
        response = config.response
        if response is None and self.stream is not None:
            response = CONTRACT
        # Compiled here, so a bad expression is refused while the run is planned, before any call.
        self.mapping = compile_mapping(response, "provider.system.response") if response is not None else None
        self.reader = StreamReader(self.mapping, self.stream) if self.stream is not None and self.mapping else None

    def request_template(self) -> Any:
        """The body (POST) or query parameters (GET) of every request, before filling in a case."""
        if self.config.request is not None:
            return self.config.request
        return {"question": "{question}", "k": "{k}", "case_id": "{case_id}"}

    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        if self.mapping is None:
            return frozenset(OUTPUT_FIELDS)
        fields = set(self.mapping.fields())
        if self.stream is not None and (self.stream.delta is not None or "answer" in self.mapping.expressions):
            fields.add("response")
        return frozenset(fields)

    def preflight(self, dataset: Dataset) -> None:
        cfg = self.config
        if not cfg.url:
            raise ProviderError("provider.system.url: required for provider kind http")
        check_template(self.request_template(), "provider.system.request", dataset.cases, str(dataset.path))
        secrets.register_url(cfg.url)
        for header, variable in cfg.headers_env.items():
            self._headers[header] = secrets.from_env(variable, f"provider.system.headers_env.{header}")
        credential = secrets.url_credentials(cfg.url)
        if credential and any(name.lower() == "authorization" for name in self._headers):
            sys.stderr.write(
                f"warning: provider.system.url carries credentials ({credential}) and "
                "provider.system.headers_env sets Authorization: the Authorization header is sent\n"
            )
        for key in ("ca_file", "client_cert", "client_key"):
            path = getattr(cfg, key)
            if path and not Path(path).is_file():
                raise ProviderError(f"provider.system.{key}: no such file: {path}")
        check_reachable("provider.system.url", cfg.url, cfg.timeout_s, self._ssl_context())

    def _ssl_context(self) -> ssl.SSLContext:
        cfg = self.config
        return ssl_context("provider.system", cfg.ca_file, cfg.client_cert, cfg.client_key)

    def _policy(self) -> CallPolicy:
        cfg = self.config
        return CallPolicy(cfg.timeout_s, cfg.max_retries, cfg.backoff_s, cfg.max_response_bytes)

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        with collecting_garbage():
            run_interruptibly(self._run(cases, on_result))

    async def _run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for index in range(len(cases)):
            queue.put_nowait(index)
        watch = AbortWatch(min(self.config.abort_after, len(cases)), "the service")
        verify = self._ssl_context()
        workers = [
            asyncio.create_task(self._worker(queue, cases, on_result, watch, verify))
            for _ in range(min(self.settings.concurrency, len(cases)))
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        if watch.aborted is not None:
            raise ProviderError(watch.aborted)

    def client(self, verify: ssl.SSLContext | bool) -> httpx.AsyncClient:
        """One keep-alive connection with the configured headers and TLS."""
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            verify=verify,
            headers=self._headers,
            trust_env=False,
        )

    def target_url(self) -> str:
        cfg = self.config
        if cfg.url is None:  # checked in preflight
            raise ProviderError("provider.system.url: required for provider kind http")
        # httpx sends a URL's user:password as basic auth, which would replace a configured
        # Authorization header: the header wins (preflight said so).
        has_header = any(name.lower() == "authorization" for name in self._headers)
        return secrets.without_userinfo(cfg.url) if has_header else cfg.url

    async def ask(self, client: httpx.AsyncClient, url: str, case: Case, policy: CallPolicy) -> Reply:
        """One case's call: the request filled in for ``case``, the reply read as configured
        (``reply.data`` is a :class:`Streamed` for a streamed reply)."""
        cfg = self.config
        if cfg.request is None and cfg.method == "POST":
            payload: Any = {"question": case.question, "k": self.settings.k, "case_id": case.id}
        else:
            payload = render(self.request_template(), case, self.settings.k)
        read = self.reader.read if self.reader is not None else None
        if cfg.method == "GET":
            return await call_json(client, url, policy, method="GET", params=query_params(payload), read=read)
        return await call_json(client, url, policy, body=payload, read=read)

    def output(self, reply: Reply) -> SystemOutput:
        """The output fields of a reply; raises :class:`ReplyError` for an unscorable one."""
        if isinstance(reply.data, Streamed):
            return reply.data.output(reply.latency)
        if self.mapping is None:
            return _parse(reply.data, reply.latency)
        return self.mapping.extract(reply.data, reply.latency)

    def probe(self, case: Case) -> dict[str, Any]:
        with collecting_garbage():
            return run_interruptibly(self._probe(case))

    async def _probe(self, case: Case) -> dict[str, Any]:
        cfg = self.config
        payload = (
            {"question": case.question, "k": self.settings.k, "case_id": case.id}
            if cfg.request is None and cfg.method == "POST"
            else render(self.request_template(), case, self.settings.k)
        )
        url = self.target_url()
        report: dict[str, Any] = {"case_id": case.id, "method": cfg.method, "url": secrets.mask_url(url)}
        report["params" if cfg.method == "GET" else "body"] = payload
        async with self.client(self._ssl_context()) as client:
            if cfg.method == "GET":
                request = client.build_request("GET", url, params=query_params(payload))
            else:
                request = client.build_request("POST", url, json=payload)
            started = time.perf_counter()
            try:
                async with asyncio.timeout(cfg.timeout_s):
                    response = await client.send(request, stream=True)
                    try:
                        raw = await read_capped(response, cfg.max_response_bytes)
                    finally:
                        await response.aclose()
            except (TimeoutError, httpx.TimeoutException):
                report["error"] = f"timed out after {cfg.timeout_s:g} s"
                return report
            except httpx.TransportError as exc:
                report["error"] = describe(exc)
                return report
            except BadReply as exc:
                report["error"] = str(exc)
                return report
        latency = time.perf_counter() - started
        text = raw.decode("utf-8", "replace")
        report |= {
            "status": response.status_code,
            "content_type": response.headers.get("content-type", ""),
            "seconds": round(latency, 3),
            "bytes": len(raw),
            "raw": secrets.scrub(text[:PROBE_TEXT]) + ("..." if len(text) > PROBE_TEXT else ""),
        }
        if response.status_code >= 300:
            report["error"] = f"HTTP {response.status_code}"
            return report
        report["extracted"], report["output"], report["error"] = await self._read_probe(raw, response, latency)
        return report

    async def _read_probe(
        self, raw: bytes, response: httpx.Response, latency: float
    ) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        """What each expression found in a probe's reply, the output built from it, or why not."""
        extracted: dict[str, Any] = {}
        try:
            if self.reader is not None:
                replay = httpx.Response(200, headers=response.headers, content=raw)
                streamed = await self.reader.read(replay, len(raw) + 1, time.perf_counter())
                extracted = {f"{key} ({self.mapping_text(key)})": streamed.found.get(key) for key in self.reader.keys}
                text = self.reader.answer(streamed.pieces)
                extracted[f"answer ({self.stream_text()}, over {streamed.events} events)"] = text
                output = streamed.output(latency)
                output.ttft_seconds = None  # read back from memory: the replay's timing means nothing
            else:
                data = parse_json(raw)
                if self.mapping is not None:
                    for key in self.mapping.expressions:
                        extracted[f"{key} ({self.mapping_text(key)})"] = self.mapping.search(key, data)
                output = self.output(Reply(data, latency))
        except (ReplyError, CallFailed) as exc:
            kind = "service error" if isinstance(exc, SystemReplyError) else "contract"
            return extracted, None, secrets.scrub(f"{kind}: {exc}")
        return extracted, output.to_json(), None

    def mapping_text(self, key: str) -> str:
        mapping = self.mapping.mapping if self.mapping is not None else CONTRACT
        return repr(getattr(mapping, key))

    def stream_text(self) -> str:
        if self.stream is not None and self.stream.delta is not None:
            return f"stream.delta {self.stream.delta!r}"
        return f"response.answer {self.mapping_text('answer')}"

    async def _worker(
        self,
        queue: asyncio.Queue[int],
        cases: Sequence[Case],
        on_result: OnResult,
        watch: AbortWatch,
        verify: ssl.SSLContext | bool,
    ) -> None:
        policy = self._policy()
        url = self.target_url()
        async with self.client(verify) as client:
            while watch.aborted is None:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                case = cases[index]
                try:
                    reply = await self.ask(client, url, case, policy)
                    output = self.output(reply)
                except CallFailed as exc:
                    if exc.transport:
                        if watch.failure(str(exc)):
                            return  # the case stays unevaluated: a resume asks again
                    else:
                        watch.success()  # the service answered
                    reason = f"contract: {exc}" if isinstance(exc, BadReply) else str(exc)
                    on_result(index, CaseResult(case.id, None, reason, retryable=exc.transport))
                    continue
                except SystemReplyError as exc:
                    watch.success()
                    on_result(index, CaseResult(case.id, None, secrets.scrub(f"service error: {exc}")))
                    continue
                except ReplyError as exc:
                    watch.success()
                    on_result(index, CaseResult(case.id, None, secrets.scrub(f"contract: {exc}")))
                    continue
                watch.success()
                on_result(index, CaseResult(case.id, _scrubbed(output)))


def query_params(payload: Any) -> dict[str, Any]:
    """A GET request's query parameters from the rendered template: scalars as text (``true``,
    ``5``), lists as repeated parameters, objects as JSON text."""
    if not isinstance(payload, dict):
        raise ConfigError("provider.system.request: a GET request's parameters must be an object")
    params: dict[str, Any] = {}
    for key, value in payload.items():
        if isinstance(value, list):
            params[str(key)] = [_param(item) for item in value]
        else:
            params[str(key)] = _param(value)
    return params


def _param(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Streamed:
    """What a streamed reply gave: the raw values of every expression, gathered over its events."""

    reader: StreamReader
    found: dict[str, Any]
    pieces: list[str]
    ttft: float | None
    events: int

    def output(self, latency: float) -> SystemOutput:
        found = dict(self.found)
        if self.reader.text_key is not None:
            found["answer"] = self.reader.answer(self.pieces)
        output = self.reader.mapping.build(found, latency)
        output.ttft_seconds = self.ttft
        return output


class StreamReader:
    """Reads a streamed reply event by event (``sse`` or ``ndjson``), within the size cap.

    The answer is the events' text (``stream.delta``, else ``response.answer``) joined, or the
    last one when ``cumulative``; every other expression is read from each event and the last
    non-null value wins; the ``error`` expression is checked on every event. Comments, keep-alive
    events without data and ``[DONE]`` are skipped. A reply that is one JSON body (an error
    envelope sent without streaming) is read as a single event.
    """

    def __init__(self, mapping: CompiledMapping, stream: StreamConfig) -> None:
        self.mapping = mapping
        self.stream = stream
        self.text = (
            compile_expression(stream.delta, "provider.system.stream.delta")
            if stream.delta is not None
            else mapping.expressions.get("answer")
        )
        self.text_key = "answer" if self.text is not None else None
        self.keys = [key for key in mapping.expressions if key not in ("error", "answer")]

    def answer(self, pieces: list[str]) -> str:
        if self.stream.cumulative:
            return pieces[-1] if pieces else ""
        return "".join(pieces)

    async def read(self, response: httpx.Response, cap: int, started: float) -> Streamed:
        state = Streamed(self, {}, [], None, 0)
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind in ("application/json", "text/json"):
            self.event(parse_json(await read_capped(response, cap)), state, started)
            return state
        events = sse_events if self.stream.format == "sse" else ndjson_events
        async for data in events(response, cap):
            if data.strip() == b"[DONE]":
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                preview = " ".join(data[:200].decode("utf-8", "replace").split())[:60]
                raise BadReply(f"stream event {state.events + 1} is not JSON ({preview})") from None
            self.event(event, state, started)
        return state

    def event(self, event: Any, state: Streamed, started: float) -> None:
        state.events += 1
        message = self.mapping.reply_error(event)
        if message is not None:
            raise SystemReplyError(message)
        if self.text is not None:
            piece = _search(self.text, event, "stream.delta" if self.stream.delta else "answer")
            if isinstance(piece, str) and piece:
                if state.ttft is None:
                    state.ttft = time.perf_counter() - started
                state.pieces.append(piece)
            elif piece not in (None, False, ""):
                raise MappingError(f"answer: the text of stream event {state.events} is not a string")
        for key in self.keys:
            value = self.mapping.search(key, event)
            if value is not None:
                state.found[key] = value


def _search(expression: Any, data: Any, key: str) -> Any:
    try:
        return expression.search(data)
    except jmespath.exceptions.JMESPathError as exc:
        raise MappingError(f"{key}: {' '.join(str(exc).split())}") from None


async def _lines(response: httpx.Response, cap: int) -> AsyncIterator[tuple[bytes, bool]]:
    """The reply's lines (without their ending) and whether each was ended; ``\r\n``, ``\n``
    and ``\r`` all end a line, as the event-stream format says."""
    size, pending = 0, b""
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise BadReply(f"stream is larger than max_response_bytes ({cap:,} bytes)")
        pending += chunk
        if b"\r" in pending:
            if pending.endswith(b"\r"):
                continue  # a \r\n may be split across chunks
            pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line, True
    if pending:
        yield pending.replace(b"\r", b""), False


async def sse_events(response: httpx.Response, cap: int) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event; events without data (keep-alives) are skipped."""
    data: list[bytes] = []
    async for line, ended in _lines(response, cap):
        if not ended:
            # The stream ended inside an event: the service or a proxy cut it short.
            raise httpx.RemoteProtocolError("the event stream ended in the middle of an event")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
            continue
        if line.startswith(b":"):
            continue  # a comment
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        raise httpx.RemoteProtocolError("the event stream ended in the middle of an event")


async def ndjson_events(response: httpx.Response, cap: int) -> AsyncIterator[bytes]:
    """Each non-empty line: one JSON value."""
    async for line, _ended in _lines(response, cap):
        if line.strip():
            yield line


def _scrubbed(output: SystemOutput) -> SystemOutput:
    """A service may echo a credential (``invalid token ...``) into what it returns."""
    output.answer = secrets.scrub(output.answer)
    output.contexts = [secrets.scrub(text) for text in output.contexts]
    output.ranked_ids = [secrets.scrub(item) for item in output.ranked_ids]
    output.doc_ids = [secrets.scrub(item) for item in output.doc_ids]
    if output.timings:
        output.timings = {secrets.scrub(stage): seconds for stage, seconds in output.timings.items()}
    return output


def _parse(data: Any, latency: float) -> SystemOutput:
    if not isinstance(data, dict):
        raise ContractError("response is not a JSON object")
    ranked = data.get("ranked_ids")
    contexts = data.get("contexts", [])
    answer = data.get("answer")
    citations = data.get("citations", [])
    if not isinstance(ranked, list) or not all(isinstance(item, str) for item in ranked):
        raise ContractError("'ranked_ids' must be a list of strings")
    if not isinstance(contexts, list) or not all(isinstance(item, str) for item in contexts):
        raise ContractError("'contexts' must be a list of strings")
    if contexts and len(contexts) != len(ranked):
        raise ContractError(f"'contexts' has {len(contexts)} items but 'ranked_ids' has {len(ranked)}")
    if not isinstance(answer, str):
        raise ContractError("'answer' must be a string")
    if not isinstance(citations, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= MAX_CITATION for item in citations
    ):
        raise ContractError("'citations' must be a list of 1-based integers")
    timings = data.get("timings")
    if timings is not None:
        if not isinstance(timings, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in timings.values()
        ):
            raise ContractError("'timings' must map stage names to finite, non-negative seconds")
        timings = {str(k): float(v) for k, v in timings.items()}
    output = SystemOutput(ranked, contexts, answer, citations, latency, timings)
    doc_ids = data.get("doc_ids", [])
    if not isinstance(doc_ids, list) or not all(isinstance(item, str) for item in doc_ids):
        raise ContractError("'doc_ids' must be a list of strings")
    if doc_ids and len(doc_ids) != len(ranked):
        raise ContractError(f"'doc_ids' has {len(doc_ids)} items but 'ranked_ids' has {len(ranked)}")
    output.doc_ids = doc_ids
    return output
