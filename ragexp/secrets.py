"""Secret values: read from the environment once, checked, and scrubbed from every text ragexp
records or prints.

A secret can come back in many spellings: as it is, escaped by ``repr`` (an httpx error quotes
a header value), escaped by JSON, or URL-encoded in each common way (``quote`` keeping ``/``,
``quote`` of everything, ``quote_plus``; hex digits in either case), in a value or a mapping key. Every
configured value is registered here when it is read, and :func:`scrub` masks all its spellings.
The registry is per process: the CLI scrubs its one error line with it as a last line of defence.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

from ragexp.errors import ProviderError

MASK = "***"
_SPELLINGS: dict[str, str] = {}
"""Every spelling of every registered secret -> the mask; longest first when applied."""
_PATTERN: re.Pattern[str] | None = None
CREDENTIAL_PARAM = re.compile(r"(key|token|secret|passw(or)?d|pwd|auth|credential|signature|sig)$", re.IGNORECASE)
"""Query-string parameters whose values are credentials (``?api_key=``, ``?access_token=``)."""


def register(value: str) -> None:
    """Remember a secret so that :func:`scrub` masks it wherever it appears."""
    global _PATTERN
    if not value:
        return
    spellings = {
        value,
        repr(value)[1:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        quote(value),  # urllib's default keeps "/": the way most clients build a path or query
        quote(value, safe=""),
        quote_plus(value),
    }
    # Percent-encoders differ in the case of their hex digits (%2F, %2f).
    spellings |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), s) for s in spellings if "%" in s}
    stripped = value.strip()
    if stripped and stripped != value:
        spellings.add(stripped)
    for spelling in spellings:
        if spelling:
            _SPELLINGS[spelling] = MASK
    _PATTERN = re.compile("|".join(re.escape(s) for s in sorted(_SPELLINGS, key=len, reverse=True)))


def scrub(text: str) -> str:
    """``text`` with every spelling of every registered secret masked."""
    if _PATTERN is None or not text:
        return text
    return _PATTERN.sub(MASK, text)


def holds(text: str) -> bool:
    """Whether ``text`` holds a spelling of a registered secret."""
    return _PATTERN is not None and bool(text) and _PATTERN.search(text) is not None


def scrub_mapping(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` with every value scrubbed (tags, params: the names are ragexp's or checked)."""
    return {key: scrub(value) for key, value in values.items()}


def scrub_value(value: object) -> object:
    """Scrub every string inside plain JSON-like data (recorded outputs, reasons), mapping keys
    included (a service can echo a header as a key: ``{"Bearer abc": ...}``)."""
    if _PATTERN is None:
        return value
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_value(item) for item in value]
    if isinstance(value, dict):
        return {scrub(key) if isinstance(key, str) else key: scrub_value(item) for key, item in value.items()}
    return value


def from_env(variable: str, where: str) -> str:
    """The value of a secret environment variable, surrounding white space removed.

    Kubernetes secrets and token files often end in a newline; curl and kubectl users expect it
    to be ignored. Any other control or non-ASCII character could not be sent in an HTTP header
    and is refused in one line that names the variable, never the value.
    """
    raw = os.environ.get(variable)
    if raw is not None:
        register(raw)
    value = (raw or "").strip()
    if not value:
        raise ProviderError(f"{where}: environment variable {variable} is not set")
    bad = next((ch for ch in value if not (" " <= ch <= "~")), None)
    if bad is not None:
        kind = "a control character" if ord(bad) < 32 or ord(bad) == 127 else "a non-ASCII character"
        raise ProviderError(
            f"{where}: environment variable {variable} contains {kind} (U+{ord(bad):04X}); "
            "a header value must be printable ASCII"
        )
    register(value)
    # "Bearer X": a service that echoes the credential quotes X without its scheme.
    scheme, _, credential = value.partition(" ")
    if credential.strip() and scheme.isalpha():
        register(credential.strip())
    return value


def register_url(url: str | None) -> None:
    """Register the credentials written into a URL: the password and credential query values."""
    if not url:
        return
    parts = urlsplit(url)
    if parts.password:
        register(parts.password)
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if CREDENTIAL_PARAM.search(name):
            register(value)


def url_credentials(url: str | None) -> str | None:
    """What kind of credential a URL carries (``user:password`` or a query parameter), if any."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.username or parts.password:
        return "user:password@"
    for name, _ in parse_qsl(parts.query):
        if CREDENTIAL_PARAM.search(name):
            return f"?{name}="
    return None


def mask_url(url: str) -> str:
    """The URL with its user info and credential query values masked, for params and messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(CREDENTIAL_PARAM.search(name) for name, _ in pairs):
            query = urlencode([(n, MASK if CREDENTIAL_PARAM.search(n) else v) for n, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url  # urlunsplit would drop the empty authority of sqlite:///path
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def without_userinfo(url: str) -> str:
    """The URL without ``user:password@`` (which httpx would send as basic auth)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, parts.query, parts.fragment))


_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def mask_urls(text: str) -> str:
    """Every URL inside ``text`` passed through :func:`mask_url`."""
    return _URL.sub(lambda match: mask_url(match.group(0)), text)
