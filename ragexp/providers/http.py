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
import dataclasses
import json
import math
import ssl
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from ragexp import secrets
from ragexp.config.models import HttpSystemConfig, ResponseMapping
from ragexp.conversations import Turns
from ragexp.datasets.loader import OUTPUT_FIELDS, Dataset
from ragexp.errors import ConfigError, ProviderError
from ragexp.metrics.registry import RETRIEVALS, STREAMED
from ragexp.providers.base import OnResult, Provider, Retrieval, RunSettings
from ragexp.providers.hops import HopReadError, read_retrievals
from ragexp.providers.mapping import (
    CONTRACT,
    NEEDED,
    OUTPUT_OF,
    ReplyError,
    SystemReplyError,
    check_stages,
    check_template,
    compile_mapping,
    mark_missing,
    over_contract,
    preview,
    render,
)
from ragexp.providers.streams import Streamed, StreamReader
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.transport import (
    HTTPX_ERRORS,
    AbortWatch,
    BadReply,
    CallFailed,
    CallPolicy,
    Reply,
    call_json,
    check_reachable,
    classify,
    collecting_garbage,
    parse_json,
    read_capped,
    run_interruptibly,
    server_reason,
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
        if response is not None or self.stream is not None:
            response = over_contract(response)
        # Compiled here, so a bad expression is refused while the run is planned, before any call.
        self.mapping = compile_mapping(response, "provider.system.response") if response is not None else None
        self.reader = StreamReader(self.mapping, self.stream) if self.stream is not None and self.mapping else None

    def reports_usage(self) -> bool:
        return self.mapping is not None and self.mapping.reports_usage()

    def request_template(self) -> Any:
        """The body (POST) or query parameters (GET) of every request, before filling in a case."""
        if self.config.request is not None:
            return self.config.request
        return {"question": "{question}", "k": "{k}", "case_id": "{case_id}"}

    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        # A streamed reply gives its time to first token too (the ttft_* metrics read it).
        streamed = {STREAMED} if self.stream is not None else set()
        if self.mapping is None:
            return frozenset({*OUTPUT_FIELDS, *streamed, RETRIEVALS})
        fields = set(self.mapping.fields()) | streamed
        if self.stream is not None and (self.stream.delta is not None or "answer" in self.mapping.expressions):
            fields.add("response")
        return frozenset(fields)

    def check(self, dataset: Dataset) -> None:
        cfg = self.config
        if not cfg.url:
            raise ProviderError("provider.system.url: required for provider kind http")
        check_template(self.request_template(), "provider.system.request", dataset.cases, str(dataset.path))
        secrets.register_url(cfg.url)
        for header, variable in cfg.headers_env.items():
            self._headers[header] = secrets.from_env(variable, f"provider.system.headers_env.{header}")
        for key in ("ca_file", "client_cert", "client_key"):
            path = getattr(cfg, key)
            if path and not Path(path).is_file():
                raise ProviderError(f"provider.system.{key}: no such file: {path}")

    def preflight(self, dataset: Dataset) -> None:
        cfg = self.config
        if cfg.url is None:  # pragma: no cover - refused by check
            raise ProviderError("provider.system.url: required for provider kind http")
        credential = secrets.url_credentials(cfg.url)
        if credential and any(name.lower() == "authorization" for name in self._headers):
            sys.stderr.write(
                f"warning: provider.system.url carries credentials ({credential}) and "
                "provider.system.headers_env sets Authorization: the Authorization header is sent\n"
            )
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
        await gather_workers(
            [
                asyncio.create_task(self._worker(queue, cases, on_result, watch, verify))
                for _ in range(min(self.settings.concurrency, len(cases)))
            ],
            watch,
        )

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
        needed = self.settings.outputs
        if isinstance(reply.data, Streamed):
            return reply.data.output(reply.latency, needed)
        if self.mapping is None:
            return _parse(reply.data, reply.latency, needed)
        return self.mapping.extract(reply.data, reply.latency, needed)

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
        chunks: list[bytes] = []
        response: httpx.Response | None = None
        streamed: Streamed | None = None
        failure: str | None = None
        started = time.perf_counter()
        async with self.client(self._ssl_context()) as client:
            if cfg.method == "GET":
                request = client.build_request("GET", url, params=query_params(payload))
            else:
                request = client.build_request("POST", url, json=payload)
            try:
                async with asyncio.timeout(cfg.timeout_s):
                    response = await client.send(request, stream=True)
                    try:
                        if response.status_code < 300 and self.reader is not None:
                            # Read event by event, as a run reads it: a failure shows where a run meets it.
                            body = Recorded(response, chunks)
                            streamed = await self.reader.read(body, cfg.max_response_bytes, started)
                        else:
                            chunks.append(await read_capped(response, cfg.max_response_bytes))
                    finally:
                        await response.aclose()
            except (TimeoutError, httpx.TimeoutException):
                failure = f"timed out after {cfg.timeout_s:g} s"
            except (*HTTPX_ERRORS, CallFailed, ReplyError) as exc:
                failure = case_error(exc)
        latency = time.perf_counter() - started
        raw = b"".join(chunks)
        if response is not None:
            text = raw.decode("utf-8", "replace")
            report |= {
                "status": response.status_code,
                "content_type": response.headers.get("content-type", ""),
                "seconds": round(latency, 3),
                "bytes": len(raw),
                "raw": secrets.scrub(text[:PROBE_TEXT]) + ("..." if len(text) > PROBE_TEXT else ""),
            }
        if failure is not None:
            report["error"] = failure
            return report
        if response is not None and response.status_code >= 300:
            report["error"] = secrets.scrub(f"HTTP {response.status_code}{server_reason(raw)}")
            return report
        report["extracted"], report["missing"], report["output"], report["error"] = self._read_probe(
            raw, streamed, latency, case
        )
        return report

    def _read_probe(
        self, raw: bytes, streamed: Streamed | None, latency: float, case: Case
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any] | None, str | None]:
        """What each expression found in a probe's reply, which outputs it found nothing for
        (label -> whether the chosen metrics read it), the output built from it, or why not."""
        extracted: dict[str, Any] = {}
        missing: dict[str, str] = {}
        needed = self.settings.outputs
        try:
            if streamed is not None:
                for key in streamed.reader.keys:
                    label = f"{key} ({self.mapping_text(key)})"
                    extracted[label] = value = streamed.found.get(key)
                    mark_missing(missing, label, key, value, streamed.gaps.get(key), needed)
                label = f"answer ({self.stream_text(streamed)})"
                extracted[label] = streamed.reader.answer(streamed.pieces)
                if streamed.reader.text_key is not None and not streamed.pieces:
                    missing[label] = NEEDED
                output = streamed.output(latency, needed)
                output.ttft_seconds = None  # measured from the probe's one request: not a run's figure
            else:
                data = parse_json(raw)
                if self.mapping is not None and self.mapping.reply_error(data) is None:
                    for key in self.mapping.expressions:
                        label = f"{key} ({self.mapping_text(key)})"
                        extracted[label] = value = self.mapping.search(key, data)
                        mark_missing(missing, label, key, value, self.mapping.gaps(key, data, value), needed)
                output = self.output(Reply(data, latency))
            if self.mapping is not None:
                self.mapping.check_turn(output, case)
        except (CallFailed, ReplyError) as exc:
            return extracted, missing, None, case_error(exc)
        return extracted, missing, output.to_json(), None

    def mapping_text(self, key: str) -> str:
        mapping = self.mapping.mapping if self.mapping is not None else CONTRACT
        return repr(getattr(mapping, key))

    def stream_text(self, streamed: Streamed | None = None) -> str:
        """Where a streamed reply's answer was read: the expression, over how many events."""
        over = f", over {streamed.events} events" if streamed is not None and not streamed.whole else ""
        if streamed is not None and streamed.whole:
            read_by = streamed.reader.whole_text
            over = ", one JSON body"
        elif self.stream is not None and self.stream.delta is not None:
            read_by = f"stream.delta {self.stream.delta!r}"
        else:
            read_by = f"response.answer {self.mapping_text('answer')}"
        return read_by + over

    def generation_missing(self) -> str | None:
        if self.config.generate is None:
            return (
                "provider.system.generate is not set (the URL of the answer stage, a request template "
                "with {question} and {contexts}, and response.answer)"
            )
        return None

    def generate(self, cases: Sequence[Case], retrievals: Sequence[Retrieval], on_result: OnResult) -> None:
        endpoint = self.config.generate
        if endpoint is None:
            raise ProviderError(self.generation_missing() or "")
        given = [
            dataclasses.replace(
                case,
                metadata={**case.metadata, "contexts": list(found.contexts), "ranked_ids": list(found.ranked_ids)},
            )
            for case, found in zip(cases, retrievals, strict=True)
        ]
        where = "provider.system.generate.request"
        check_template(endpoint.request, where, given, "the replayed cases")
        mapping = ResponseMapping(answer=endpoint.response.answer, citations=endpoint.response.citations)
        config = self.config.model_copy(
            update={"url": endpoint.url, "method": "POST", "request": endpoint.request, "response": mapping}
        )
        config = config.model_copy(update={"stream": None, "generate": None})
        needed = frozenset({"response"}) | (self.settings.outputs or frozenset({"citations"})) & {"citations"}
        answerer = HttpProvider(config, dataclasses.replace(self.settings, outputs=needed))
        secrets.register_url(endpoint.url)
        for header, variable in config.headers_env.items():
            answerer._headers[header] = secrets.from_env(variable, f"provider.system.headers_env.{header}")

        def keep_retrieval(index: int, result: CaseResult) -> None:
            if result.output is not None:
                found = retrievals[index]
                result.output.ranked_ids = list(found.ranked_ids)
                result.output.contexts = list(found.contexts)
                result.output.doc_ids = list(found.doc_ids)
            on_result(index, result)

        answerer.run(given, keep_retrieval)

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
                result = await self._one(client, url, cases[index], policy, watch)
                if result is None:
                    return  # the case stays unevaluated: a resume asks again
                on_result(index, result)

    async def _one(
        self, client: httpx.AsyncClient, url: str, case: Case, policy: CallPolicy, watch: AbortWatch
    ) -> CaseResult | None:
        """One case's call and its result; None when the failure aborted the run."""
        try:
            reply = await self.ask(client, url, case, policy)
            output = self.output(reply)
            if self.mapping is not None:
                self.mapping.check_turn(output, case)
        except CallFailed as exc:
            if exc.transport:
                if watch.failure(str(exc)):
                    return None
            else:
                watch.success()  # the service answered
            return CaseResult(case.id, None, case_error(exc), retryable=exc.transport)
        except ReplyError as exc:
            watch.success()
            return CaseResult(case.id, None, case_error(exc))
        watch.success()
        return CaseResult(case.id, _scrubbed(output))

    def ask_chains(self, chains: Turns, on_result: OnResult) -> None:
        with collecting_garbage():
            run_interruptibly(self._ask_chains(chains, on_result))

    async def _ask_chains(self, chains: Turns, on_result: OnResult) -> None:
        """Each worker takes the next ready case, whichever chain it is of; a chain's next case
        is ready once the one before it is reported. A worker finding none ready waits for one
        while cases are still in flight."""
        ready = deque(chains.first())
        left = [len(chains.cases)]
        woken = asyncio.Event()
        watch = AbortWatch(min(self.config.abort_after, len(chains.cases)), "the service")
        verify = self._ssl_context()

        def report(index: int, result: CaseResult) -> None:
            on_result(index, result)
            unasked, after = chains.settled(index, result)
            for other, outcome in unasked:
                on_result(other, outcome)
            left[0] -= 1 + len(unasked)
            if after is not None:
                ready.append(after)
            if after is not None or not left[0]:
                woken.set()

        async def worker() -> None:
            policy = self._policy()
            url = self.target_url()
            async with self.client(verify) as client:
                while watch.aborted is None:
                    if not ready:
                        if not left[0]:
                            return
                        woken.clear()
                        await woken.wait()
                        continue
                    index = ready.popleft()
                    chains.prepare(index)
                    result = await self._one(client, url, chains.cases[index], policy, watch)
                    if result is None:
                        woken.set()  # the run is aborted: the waiting workers stop too
                        return
                    report(index, result)

        await gather_workers(
            [asyncio.create_task(worker()) for _ in range(min(self.settings.concurrency, len(chains.chains)))], watch
        )


async def gather_workers(workers: list[asyncio.Task[None]], watch: AbortWatch) -> None:
    """Wait for the workers; cancel the rest when one raises; a run the watch aborted is refused."""
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    if watch.aborted is not None:
        raise ProviderError(watch.aborted)


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


def case_error(exc: BaseException) -> str:
    """A failed call or an unusable reply as that case's error, the same in a run and a probe."""
    if isinstance(exc, SystemReplyError):
        return secrets.scrub(f"service error: {exc}")
    failed = exc if isinstance(exc, CallFailed | ReplyError) else classify(exc) or exc
    if isinstance(failed, ReplyError | BadReply):
        return secrets.scrub(f"contract: {failed}")
    return secrets.scrub(str(failed))


class Recorded:
    """A reply's body read through, every chunk kept (what ``validate --probe`` shows)."""

    def __init__(self, response: httpx.Response, chunks: list[bytes]) -> None:
        self.response = response
        self.headers = response.headers
        self.chunks = chunks

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.aiter_bytes():
            self.chunks.append(chunk)
            yield chunk


def _scrubbed(output: SystemOutput) -> SystemOutput:
    """A service may echo a credential (``invalid token ...``) into what it returns."""
    output.answer = secrets.scrub(output.answer)
    output.contexts = [secrets.scrub(text) for text in output.contexts]
    output.ranked_ids = [secrets.scrub(item) for item in output.ranked_ids]
    output.doc_ids = [secrets.scrub(item) for item in output.doc_ids]
    if output.timings:
        output.timings = {secrets.scrub(stage): seconds for stage, seconds in output.timings.items()}
    return output


def _parse(data: Any, latency: float, needed: frozenset[str] | None = None) -> SystemOutput:
    if not isinstance(data, dict):
        raise ContractError("response is not a JSON object")
    for key in ("contexts", "citations"):
        if key not in data and (needed is None or OUTPUT_OF[key] in needed):
            raise ContractError(f"'{key}' is missing from the reply ({preview(data)})")
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
    if data.get("stages") is not None:
        try:
            output.stages = check_stages(data["stages"])
        except ValueError as exc:
            raise ContractError(f"'stages' {exc}") from None
    if data.get("retrievals") is not None:  # a multi-hop system's calls, as response.retrievals reads them
        try:
            output.retrievals = read_retrievals(data["retrievals"], "'retrievals'")
        except HopReadError as exc:
            raise ContractError(str(exc)) from None
    return output
