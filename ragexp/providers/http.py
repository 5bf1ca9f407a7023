"""``provider=http``: a live RAG service, called concurrently with bounded retries.

Each of ``concurrency`` workers owns one keep-alive connection (its own ``httpx.AsyncClient``)
and pulls cases from a shared queue: connections are reused and there is no shared pool to scan,
which measured faster here than one client under a semaphore.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ragexp import secrets
from ragexp.config.models import HttpSystemConfig
from ragexp.datasets.loader import Dataset
from ragexp.errors import ProviderError
from ragexp.providers.base import OnResult, Provider
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.transport import (
    AbortWatch,
    BadReply,
    CallFailed,
    CallPolicy,
    check_reachable,
    collecting_garbage,
    post_json,
    run_interruptibly,
    ssl_context,
)

MAX_CITATION = 2**31 - 1


class ContractError(Exception):
    """The service answered, but not in the shape the contract asks for."""


class HttpProvider(Provider):
    remote = True
    config: HttpSystemConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers: dict[str, str] = {}

    def preflight(self, dataset: Dataset) -> None:
        cfg = self.config
        if not cfg.url:
            raise ProviderError("provider.system.url: required for provider kind http")
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

    async def _worker(
        self,
        queue: asyncio.Queue[int],
        cases: Sequence[Case],
        on_result: OnResult,
        watch: AbortWatch,
        verify: ssl.SSLContext | bool,
    ) -> None:
        cfg = self.config
        assert cfg.url is not None  # checked in preflight
        policy = self._policy()
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        # httpx sends a URL's user:password as basic auth, which would replace a configured
        # Authorization header: the header wins (preflight said so).
        has_header = any(name.lower() == "authorization" for name in self._headers)
        url = secrets.without_userinfo(cfg.url) if has_header else cfg.url
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.timeout_s),
            limits=limits,
            verify=verify,
            headers=self._headers,
            trust_env=False,
        ) as client:
            while watch.aborted is None:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                case = cases[index]
                body = {"question": case.question, "k": self.settings.k, "case_id": case.id}
                try:
                    reply = await post_json(client, url, body, policy)
                    output = _parse(reply.data, reply.latency)
                except CallFailed as exc:
                    if exc.transport:
                        if watch.failure(str(exc)):
                            return  # the case stays unevaluated: a resume asks again
                    else:
                        watch.success()  # the service answered
                    reason = f"contract: {exc}" if isinstance(exc, BadReply) else str(exc)
                    on_result(index, CaseResult(case.id, None, reason, retryable=exc.transport))
                    continue
                except ContractError as exc:
                    watch.success()
                    on_result(index, CaseResult(case.id, None, secrets.scrub(f"contract: {exc}")))
                    continue
                watch.success()
                on_result(index, CaseResult(case.id, _scrubbed(output)))


def _scrubbed(output: SystemOutput) -> SystemOutput:
    """A service may echo a credential (``invalid token ...``) into what it returns."""
    output.answer = secrets.scrub(output.answer)
    output.contexts = [secrets.scrub(text) for text in output.contexts]
    output.ranked_ids = [secrets.scrub(item) for item in output.ranked_ids]
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
    return SystemOutput(ranked, contexts, answer, citations, latency, timings)
