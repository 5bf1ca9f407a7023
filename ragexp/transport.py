"""HTTP plumbing shared by the RAG-service provider and the LLM judge: TLS, reachability,
retry policy (which failures are retried, how long to wait)."""

from __future__ import annotations

import email.utils
import gc
import random
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from ragexp.config.identity import redact
from ragexp.errors import ProviderError

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF = 30.0
MAX_RETRY_AFTER = 120.0


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


def check_reachable(where: str, url: str, timeout: float) -> None:
    """Fail before any run exists when nothing listens at the URL's host and port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(f"{where}: not an http(s) URL: {redact(url)}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=min(timeout, 5.0)):
            pass
    except OSError as exc:
        raise ProviderError(
            f"{where}: cannot connect to {parts.hostname}:{port} ({exc.strerror or exc}); is the service running?"
        ) from None


def backoff(base: float, attempt: int) -> float:
    """Exponential backoff with jitter, so failed requests do not come back in lockstep."""
    delay: float = min(MAX_BACKOFF, base * (2**attempt)) * (0.5 + random.random() / 2)
    return delay


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
    text = str(exc)
    return f"connection failed ({type(exc).__name__}: {text})" if text else f"connection failed ({type(exc).__name__})"


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
