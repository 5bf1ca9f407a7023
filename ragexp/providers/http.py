"""``provider=http``: a live RAG service, called concurrently with bounded retries.

Each of ``concurrency`` workers owns one keep-alive connection (its own ``httpx.AsyncClient``)
and pulls cases from a shared queue: connections are reused and there is no shared pool to scan,
which measured faster here than one client under a semaphore.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ragexp.datasets.loader import Dataset
from ragexp.errors import ProviderError
from ragexp.providers.base import OnResult, Provider
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.transport import (
    RETRY_STATUS,
    backoff,
    check_reachable,
    collecting_garbage,
    describe,
    retry_after,
    ssl_context,
)

STAGES = ("embedding", "vector", "keyword", "rerank", "model")


class ContractError(Exception):
    """The service answered, but not in the shape the contract asks for."""


class Unreachable(Exception):
    """Nothing answered at the transport level (after retries)."""


class HttpProvider(Provider):
    remote = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers: dict[str, str] = {}
        self._secrets: list[str] = []

    def preflight(self, dataset: Dataset) -> None:
        cfg = self.config
        if not cfg.url:
            raise ProviderError("provider.system.url: required for provider kind http")
        for header, variable in cfg.headers_env.items():
            value = os.environ.get(variable)
            if not value:
                raise ProviderError(f"provider.system.headers_env.{header}: environment variable {variable} is not set")
            self._headers[header] = value
            self._secrets.append(value)
        for key in ("ca_file", "client_cert", "client_key"):
            path = getattr(cfg, key)
            if path and not Path(path).is_file():
                raise ProviderError(f"provider.system.{key}: no such file: {path}")
        self._ssl_context()  # a broken PEM file fails here, before any run exists
        check_reachable("provider.system.url", cfg.url, cfg.timeout_s)

    def _ssl_context(self) -> ssl.SSLContext:
        cfg = self.config
        return ssl_context("provider.system", cfg.ca_file, cfg.client_cert, cfg.client_key)

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        with collecting_garbage():
            asyncio.run(self._run(cases, on_result))

    async def _run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for index in range(len(cases)):
            queue.put_nowait(index)
        state = _StartWatch(min(self.config.abort_after, len(cases)))
        verify = self._ssl_context()
        workers = [
            asyncio.create_task(self._worker(queue, cases, on_result, state, verify))
            for _ in range(min(self.settings.concurrency, len(cases)))
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        if state.aborted is not None:
            raise ProviderError(state.aborted)

    async def _worker(
        self,
        queue: asyncio.Queue[int],
        cases: Sequence[Case],
        on_result: OnResult,
        state: _StartWatch,
        verify: ssl.SSLContext | bool,
    ) -> None:
        cfg = self.config
        timeout = httpx.Timeout(cfg.timeout_s)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(
            timeout=timeout, limits=limits, verify=verify, headers=self._headers, trust_env=False
        ) as client:
            while state.aborted is None:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                case = cases[index]
                try:
                    output = await self._call(client, case)
                except Unreachable as exc:
                    reason = self._scrub(str(exc))
                    if state.failed(reason):
                        return
                    on_result(index, CaseResult(case.id, None, reason))
                    continue
                except ContractError as exc:
                    state.succeeded()
                    on_result(index, CaseResult(case.id, None, self._scrub(f"contract: {exc}")))
                    continue
                except _Failed as exc:
                    state.succeeded()
                    on_result(index, CaseResult(case.id, None, self._scrub(str(exc))))
                    continue
                state.succeeded()
                on_result(index, CaseResult(case.id, output))

    async def _call(self, client: httpx.AsyncClient, case: Case) -> SystemOutput:
        cfg = self.config
        assert cfg.url is not None  # checked in preflight
        body = {"question": case.question, "k": self.settings.k, "case_id": case.id}
        attempts = cfg.max_retries + 1
        last = "no attempt made"
        transport_only = True
        for attempt in range(attempts):
            delay: float | None = None
            started = time.perf_counter()
            try:
                response = await client.post(cfg.url, json=body)
            except httpx.TimeoutException:
                last = f"timed out after {cfg.timeout_s:g} s"
                transport_only = False
            except httpx.TransportError as exc:
                last = describe(exc)
            else:
                latency = time.perf_counter() - started
                transport_only = False
                status = response.status_code
                if status < 300:
                    return _parse(response, latency)
                last = f"HTTP {status}"
                if status not in RETRY_STATUS:
                    raise _Failed(f"{last} (not retried)")
                if status == 429:
                    delay = retry_after(response.headers.get("retry-after"))
            if attempt + 1 < attempts:
                await asyncio.sleep(delay if delay is not None else backoff(cfg.backoff_s, attempt))
        message = f"{last} after {attempts} attempt{'s' if attempts > 1 else ''}"
        if transport_only:
            raise Unreachable(message)
        raise _Failed(message)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


class _Failed(Exception):
    """The case failed for good (HTTP error or retries used up)."""


class _StartWatch:
    """Stops the run when the first cases all fail to reach the service: nothing is listening."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.failures = 0
        self.any_success = False
        self.aborted: str | None = None

    def succeeded(self) -> None:
        self.any_success = True

    def failed(self, reason: str) -> bool:
        """Count a transport failure; True when the run must stop."""
        if self.any_success:
            return False
        self.failures += 1
        if self.failures >= self.window:
            if self.aborted is None:
                self.aborted = f"the service did not answer the first {self.window} cases: {reason}"
            return True
        return False


def _parse(response: httpx.Response, latency: float) -> SystemOutput:
    try:
        data = response.json()
    except ValueError:
        raise ContractError(f"response is not JSON ({_preview(response.text)})") from None
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
        isinstance(item, int) and not isinstance(item, bool) and item >= 1 for item in citations
    ):
        raise ContractError("'citations' must be a list of 1-based integers")
    timings = data.get("timings")
    if timings is not None:
        if not isinstance(timings, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in timings.values()
        ):
            raise ContractError("'timings' must map stage names to non-negative seconds")
        timings = {str(k): float(v) for k, v in timings.items()}
    return SystemOutput(ranked, contexts, answer, citations, latency, timings)


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text[:60] + ("..." if len(text) > 60 else "")
