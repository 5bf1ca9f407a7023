"""HTTP plumbing shared by the RAG-service provider and the LLM judge: TLS, a check of the
endpoint before any run exists, and one call policy (a deadline per attempt, a cap on the reply's
size, which failures are retried and how long to wait, when a run gives up)."""

from __future__ import annotations

import asyncio
import email.utils
import gc
import random
import re
import signal
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson

from ragexp.errors import ProviderError
from ragexp.escape import terminal
from ragexp.secrets import mask_url, scrub

T = TypeVar("T")
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF = 30.0
MAX_RETRY_AFTER = 120.0
BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte-order mark some servers (and Windows tools behind them) put first: not data."""
ERROR_BODY_BYTES = 16_384
"""How much of an error reply is read for the server's reason (the rest is not read)."""
REASON_CHARS = 200
"""Characters of a server's reason kept in a case's error."""
PREVIEW_CHARS = 60
"""Characters of an unreadable reply shown in its error."""


@dataclass(frozen=True)
class CallPolicy:
    """How one logical call is made: the same rules for the system under test and the judge."""

    timeout_s: float
    """Deadline for a whole attempt: connecting, sending, and reading the complete reply."""
    max_retries: int
    """Attempts after the first, on transport failures, timeouts, 408/429 and 5xx."""
    backoff_s: float
    """First retry delay; doubles per attempt (capped) with jitter."""
    max_response_bytes: int
    """A larger reply is refused without being read further."""


class CallFailed(Exception):
    """A call failed for good; ``str(error)`` is the reason, free of secrets.

    ``transport`` is true when nothing usable came back because of the network or an overloaded
    server (refused, reset, timed out, 5xx/429 after every retry): such a failure says nothing
    about the case, counts toward aborting the run, and is tried again by ``--resume``.
    """

    def __init__(self, reason: str, *, transport: bool) -> None:
        super().__init__(scrub(reason))
        self.transport = transport


class BadReply(CallFailed):
    """The server answered 2xx, but the body is unusable (not JSON, too large, not decodable)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, transport=False)


HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, httpx.CookieConflict)
"""Every exception httpx raises (its own hierarchy has four roots)."""


def classify(exc: BaseException) -> CallFailed | None:
    """Every exception httpx raises, as what it means for the call: a transport failure (the
    network or the server's connection: retried, counted toward aborting, asked again by
    ``--resume``) or a reply that cannot be used (that case's error). None: not httpx's."""
    if isinstance(exc, httpx.TimeoutException):
        return CallFailed("timed out", transport=True)
    if isinstance(exc, httpx.TransportError):
        return CallFailed(describe(exc), transport=True)
    if isinstance(exc, httpx.DecodingError):
        return BadReply(f"the reply could not be decoded ({_exception_text(exc)})")
    if isinstance(exc, httpx.TooManyRedirects):
        return CallFailed(f"too many redirects ({_exception_text(exc)})", transport=False)
    if isinstance(exc, HTTPX_ERRORS):
        return CallFailed(f"request failed ({_exception_text(exc)})", transport=False)
    return None


def _exception_text(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = " ".join(mask_url(str(exc)).split())
    except Exception:  # an exception whose message cannot be printed still has a type
        text = ""
    return f"{name}: {text}" if text else name


@dataclass
class Reply:
    data: Any
    """The parsed JSON body (strict JSON: no NaN or Infinity, nesting and integers bounded)."""
    latency: float
    """Seconds taken by the successful attempt."""


class Body(Protocol):
    """What reading a reply's body needs: its headers and its decoded bytes (an
    ``httpx.Response``, or a wrapper that keeps what it reads)."""

    @property
    def headers(self) -> httpx.Headers: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


ReadBody = Callable[[httpx.Response, int, float], Awaitable[Any]]
"""Reads a 2xx reply into its data: (response, size cap, when the attempt started) -> data.
Raising :class:`BadReply` fails the call; an ``httpx.TransportError`` (a stream cut in the
middle) fails the attempt, which is retried like any other transport failure."""


async def post_json(client: httpx.AsyncClient, url: str, body: Any, policy: CallPolicy) -> Reply:
    """POST JSON and parse the JSON reply, with retries, a deadline per attempt and a size cap."""
    return await call_json(client, url, policy, body=body)


async def call_json(
    client: httpx.AsyncClient,
    url: str,
    policy: CallPolicy,
    *,
    method: str = "POST",
    body: Any = None,
    params: Any = None,
    read: ReadBody | None = None,
) -> Reply:
    """One logical call under ``policy``: ``body`` sent as JSON (POST) or ``params`` as the query
    string (GET); the reply read by ``read`` (default: the whole body as strict JSON), within
    the deadline and the size cap of every attempt."""
    attempts = policy.max_retries + 1
    last, reason = "no attempt made", ""
    for attempt in range(attempts):
        delay: float | None = None
        started = time.perf_counter()
        try:
            async with asyncio.timeout(policy.timeout_s):
                request = client.build_request(method, url, json=body, params=params)
                status, headers, data = await _send(client, request, policy.max_response_bytes, read, started)
        except (TimeoutError, httpx.TimeoutException):
            last, reason = f"timed out after {policy.timeout_s:g} s", ""
        except HTTPX_ERRORS as exc:
            failed = classify(exc)
            if failed is None:  # pragma: no cover - classify knows every exception of HTTPX_ERRORS
                raise
            if not failed.transport:
                raise failed from None
            last, reason = str(failed), ""
        else:
            if status < 300:
                return Reply(data if read is not None else parse_json(data), time.perf_counter() - started)
            last, reason = f"HTTP {status}", server_reason(data)
            if status not in RETRY_STATUS:
                raise CallFailed(f"{last} (not retried){reason}", transport=False)
            if status == 429:
                delay = retry_after(headers.get("retry-after"))
        if attempt + 1 < attempts:
            await asyncio.sleep(delay if delay is not None else backoff(policy.backoff_s, attempt))
    raise CallFailed(f"{last} after {attempts} attempt{'s' if attempts > 1 else ''}{reason}", transport=True)


async def _send(
    client: httpx.AsyncClient, request: httpx.Request, cap: int, read: ReadBody | None, started: float
) -> tuple[int, httpx.Headers, Any]:
    """One attempt; of an error reply only the start is read (for the server's reason)."""
    response = await client.send(request, stream=True)
    try:
        if response.status_code >= 300:
            return response.status_code, response.headers, await read_start(response, ERROR_BODY_BYTES)
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise BadReply(f"response of {int(declared):,} bytes is larger than max_response_bytes ({cap:,})")
        if read is not None:
            return response.status_code, response.headers, await read(response, cap, started)
        return response.status_code, response.headers, await read_capped(response, cap)
    finally:
        await response.aclose()


async def read_capped(response: Body, cap: int) -> bytes:
    """The whole body, refused past ``cap`` bytes without reading further. A gzip or deflate body
    is decoded here, from the raw bytes, so that one cut in transit is told from a whole one."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if isinstance(response, httpx.Response) and encoding in _WBITS:
        return await _read_compressed(response, cap, encoding)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise BadReply(f"response is larger than max_response_bytes ({cap:,} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's window bits per Content-Encoding it decodes (deflate: zlib-wrapped, else raw)."""


async def _read_compressed(response: httpx.Response, cap: int, encoding: str) -> bytes:
    """A gzip or deflate body decoded with the standard library: a stream that stops before its own
    end is a cut reply (it would decode to a part, often nothing: an empty or broken reply)."""
    stream = zlib.decompressobj(_WBITS[encoding])
    chunks, size, arrived = [], 0, 0
    async for raw in response.aiter_raw():
        arrived += len(raw)
        try:
            chunk = stream.decompress(raw)
        except zlib.error as exc:
            if encoding != "deflate" or arrived != len(raw):
                # As httpx's own decoder says it: the reply could not be decoded, that case's error.
                raise httpx.DecodingError(str(exc), request=response.request) from None
            stream = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send it
            try:
                chunk = stream.decompress(raw)
            except zlib.error as again:
                raise httpx.DecodingError(str(again), request=response.request) from None
        size += len(chunk)
        if size > cap:
            raise BadReply(f"response is larger than max_response_bytes ({cap:,} bytes)")
        chunks.append(chunk)
    if not stream.eof:
        raise BadReply(
            f"response is cut: {arrived:,} bytes arrived as Content-Encoding {encoding}, "
            "and the compressed stream does not end"
        )
    return b"".join(chunks)


async def read_start(response: httpx.Response, cap: int) -> bytes:
    """At most ``cap`` bytes of the body; the rest is not read. Nothing when it cannot be read:
    what matters of an error reply is its status."""
    chunks, size = [], 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= cap:
                break
    except (httpx.HTTPError, httpx.StreamError):
        pass
    return b"".join(chunks)[:cap]


_REASON_KEYS = ("message", "error_description", "detail", "error", "reason", "msg", "title", "description")
_TAG = re.compile(r"<[^>]{0,1000}>")
_SPACES = re.compile(r"[ \t\r\n]+")


def server_reason(body: bytes) -> str:
    """What an error reply says went wrong, as ``": reason"`` (empty when it says nothing): the
    message of a JSON error envelope (``message``, ``error.message``, ``detail``, ...), else the
    body's text without markup; one line of at most :data:`REASON_CHARS` characters, invisible
    characters shown as escapes (secrets are masked where the reason is used)."""
    body = body.removeprefix(BOM)
    if not body.strip():
        return ""
    try:
        found = _reason_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        found = None
    text = found if found is not None else _TAG.sub(" ", body.decode("utf-8", "replace"))
    text = " ".join(text.split())
    if not text:
        return ""
    if len(text) > REASON_CHARS:
        text = text[:REASON_CHARS] + "…"
    return f": {terminal(text)}"


def _reason_of(data: Any, depth: int = 0) -> str | None:
    if isinstance(data, str):
        return data
    if depth > 3:
        return None
    if isinstance(data, dict):
        for key in _REASON_KEYS:
            if key in data:
                found = _reason_of(data[key], depth + 1)
                if found:
                    return found
        return orjson.dumps(data).decode()
    if isinstance(data, list) and data:  # FastAPI: "detail": [{"msg": ...}, ...]
        return _reason_of(data[0], depth + 1)
    return orjson.dumps(data).decode() if data is not None else None


def parse_json(data: bytes, what: str = "response") -> Any:
    """Strict JSON. Python's json accepts NaN and Infinity and recurses without bound; orjson
    refuses both, and turns integers beyond 64 bits into floats (which type checks then refuse).
    A UTF-8 byte-order mark before the value is not part of it. ``what`` names the value in
    the error."""
    try:
        return orjson.loads(data.removeprefix(BOM))
    except orjson.JSONDecodeError as exc:
        kind = "too deeply nested" if "depth" in str(exc) else "not JSON"
        if not data.strip():
            raise BadReply(f"{what} is empty") from None
        if exc.doc:
            preview = unreadable(exc.doc, exc.pos)
        else:  # not UTF-8: orjson gives no text to point into
            preview = "not UTF-8: " + unreadable(data[: PREVIEW_CHARS * 2].decode("utf-8", "backslashreplace"), None)
        raise BadReply(f"{what} is {kind} ({preview})") from None


def unreadable(text: str, position: int | None) -> str:
    """A short preview of ``text`` that shows the characters where reading it failed: its
    start when that is where, else the characters around ``position`` (a character offset);
    invisible characters (a NUL, a stray byte-order mark) shown as escapes."""
    if position is None or position < PREVIEW_CHARS:
        return _shown(text[: PREVIEW_CHARS * 2], PREVIEW_CHARS)
    start = max(0, position - PREVIEW_CHARS // 2)
    window = _shown(text[start : position + PREVIEW_CHARS // 2], PREVIEW_CHARS)
    return f"at character {position:,}: …{window}"


def _shown(text: str, limit: int) -> str:
    flat = terminal(_SPACES.sub(" ", text).strip())
    return flat[:limit] + ("..." if len(flat) > limit else "")


class AbortWatch:
    """Stops a run whose calls keep failing: ``limit`` failures in a row with no success between.

    A service that is down, or accepts connections and never answers, would otherwise take
    every case's full retry budget before the run ends.
    """

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.in_a_row = 0
        self.succeeded = False
        self.aborted: str | None = None

    def success(self) -> None:
        self.succeeded = True
        self.in_a_row = 0

    def failure(self, reason: str) -> bool:
        """Count a failure; True when the run must stop."""
        self.in_a_row += 1
        if self.in_a_row >= self.limit and self.aborted is None:
            since = "since its last answer" if self.succeeded else "from the start"
            self.aborted = f"{self.what} failed {self.in_a_row} calls in a row {since}: {reason}"
        return self.aborted is not None


def ssl_context(
    where: str, ca_file: str | None, client_cert: str | None = None, client_key: str | None = None
) -> ssl.SSLContext:
    """One verified context (shared by every connection: building one costs tens of ms)."""
    try:
        context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        if client_cert:
            context.load_cert_chain(client_cert, client_key)
    except (ssl.SSLError, OSError) as exc:
        raise ProviderError(f"{where}: TLS files cannot be used ({exc})") from None
    return context


def check_reachable(where: str, url: str, timeout: float, context: ssl.SSLContext | None = None) -> None:
    """Fail before any run exists when nothing listens at the URL, when an https endpoint's
    certificate does not verify, or when an http:// URL points at a TLS port.

    No HTTP request is sent: a TCP connection, then a TLS handshake (https) or a look at what
    the server says to a ``HEAD`` request (http), so a service under test sees no extra query.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(f"{where}: not an http(s) URL: {mask_url(url)}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    wait = min(timeout, 5.0)
    try:
        sock = socket.create_connection((parts.hostname, port), timeout=wait)
    except OSError as exc:
        raise ProviderError(
            f"{where}: cannot connect to {parts.hostname}:{port} ({exc.strerror or exc}) at {mask_url(url)}; "
            "is the service running?"
        ) from None
    with sock:
        if parts.scheme == "https":
            try:
                with (context or ssl.create_default_context()).wrap_socket(sock, server_hostname=parts.hostname):
                    pass
            except ssl.SSLCertVerificationError as exc:
                raise ProviderError(
                    f"{where}: TLS certificate of {parts.hostname}:{port} does not verify ({exc.verify_message}); "
                    "set ca_file to the CA that signed it"
                ) from None
            except (ssl.SSLError, OSError) as exc:
                raise ProviderError(f"{where}: TLS handshake with {parts.hostname}:{port} failed ({exc})") from None
            return
        try:
            sock.sendall(f"HEAD / HTTP/1.1\r\nHost: {parts.hostname}\r\nConnection: close\r\n\r\n".encode())
            head = sock.recv(5)
        except OSError:
            head = b""
    if head.startswith(b"HTTP/"):
        return
    # No HTTP answer to a plain request: a TLS server resets or sends an alert. Tell that apart
    # from a server that is merely broken by trying a handshake.
    if _speaks_tls(parts.hostname, port, wait):
        raise ProviderError(f"{where}: {parts.hostname}:{port} is an HTTPS port: use https:// in the URL")


def _speaks_tls(host: str, port: int, wait: float) -> bool:
    probe = ssl.create_default_context()
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # only asks whether TLS is spoken; nothing is sent over it
    try:
        with (
            socket.create_connection((host, port), timeout=wait) as sock,
            probe.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def backoff(base: float, attempt: int, cap: float = MAX_BACKOFF) -> float:
    """Exponential backoff with jitter, so failed requests do not come back in lockstep."""
    delay: float = min(cap, base * (2**attempt)) * (0.5 + random.random() / 2)
    return delay


def retry_within(
    call: Callable[[], T],
    *,
    timeout_s: float,
    base: float,
    again: Callable[[Exception], bool],
    attempts: int | None = None,
    cap: float = MAX_BACKOFF,
) -> T:
    """``call()``, asked again after each failure ``again`` accepts, with :func:`backoff` from
    ``base`` (no pause longer than ``cap``), for as long as the next pause ends within
    ``timeout_s`` of the first call and at most ``attempts`` calls in all. The policy of the calls
    that are not a run's HTTP requests (the tracking store's writes, a promotion's lock); the last
    failure is raised as it is."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            pause = backoff(base, attempt, cap)
            attempt += 1
            if not again(exc) or attempt == attempts or time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def describe(exc: Exception) -> str:
    """A transport exception as a short reason."""
    text = mask_url(str(exc))
    name = type(exc).__name__
    return f"connection failed ({name}: {text})" if text else f"connection failed ({name})"


def run_interruptibly(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that turns Ctrl-C and SIGTERM into one clean ``KeyboardInterrupt``.

    A signal handler raising inside the event loop leaves tasks half-finished and asyncio prints
    "Task exception was never retrieved" with a traceback on exit. Here the signal cancels the
    main task instead; every connection closes in order, and the interrupt is raised after.
    """
    stopped: list[signal.Signals] = []

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        installed: dict[signal.Signals, Any] = {}

        def stop(sig: signal.Signals) -> None:
            stopped.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, stop, sig)
            except (RuntimeError, ValueError):  # not the main thread: signals stay as they were
                continue
            installed[sig] = previous
        try:
            return await coro
        finally:
            for sig, previous in installed.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, previous)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if stopped:
            raise KeyboardInterrupt from None
        raise


@contextmanager
def collecting_garbage() -> Iterator[None]:
    """Turn the cyclic collector back on for a long I/O-bound phase.

    The CLI disables it (cheap batch work over many objects); asyncio and httpx leave reference
    cycles behind (futures, exceptions with tracebacks) that a long run would otherwise keep.
    """
    was_enabled, thresholds = gc.isenabled(), gc.get_threshold()
    gc.freeze()  # what exists now (imports, cases) is long-lived: never rescan it
    gc.set_threshold(100_000, 50, 100)  # collect rarely: a request allocates hundreds of objects
    gc.enable()
    try:
        yield
    finally:
        if not was_enabled:
            gc.disable()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
