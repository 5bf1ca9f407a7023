"""A streamed reply read event by event (``sse`` or ``ndjson``) through the response mapping: the
answer's pieces, every other expression's last value, what arrived, by kind, for the messages."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jmespath.exceptions
import orjson

from ragexp.config.models import StreamConfig
from ragexp.providers.expressions import compile_expression
from ragexp.providers.mapping import (
    CompiledMapping,
    Gaps,
    MappingError,
    SystemReplyError,
    Where,
)
from ragexp.records import SystemOutput
from ragexp.transport import (
    BOM,
    BadReply,
    Body,
    parse_json,
    read_capped,
    unreadable,
)


@dataclass
class Streamed:
    """What a streamed reply gave: the raw values of every expression, gathered over its events."""

    reader: StreamReader
    found: dict[str, Any]
    pieces: list[str]
    ttft: float | None
    events: int
    gaps: dict[str, Gaps | None] = field(default_factory=dict)
    """For each list the expressions found: what :meth:`CompiledMapping.gaps` said of it."""
    seen: Counter[str] = field(default_factory=Counter)
    """What arrived, by kind: each event's type, comments, keep-alives, ``[DONE]``, lines that
    are not part of the configured format."""
    whole: bool = False
    """The reply was one JSON body, not a stream."""

    def output(self, latency: float, needed: frozenset[str] | None = None) -> SystemOutput:
        found = dict(self.found)
        where = Where(self.arrived)
        if self.reader.text_key is not None:
            if not self.pieces:
                raise MappingError(
                    f"answer: the {'reply' if self.whole else 'stream'} ended with no answer text ({where.text})"
                )
            found["answer"] = self.reader.answer(self.pieces)
            if not found["answer"].strip():  # keep-alive blanks are no answer: never scored as one
                raise MappingError(
                    f"answer: the {'reply' if self.whole else 'stream'} ended with white space only as its answer "
                    f"text ({where.text})"
                )
        output = self.reader.mapping.build(found, latency, needed=needed, gaps=self.gaps, where=where)
        output.ttft_seconds = self.ttft
        return output

    def arrived(self) -> str:
        """What the reply held, for a message: "one JSON body", or "3 events (message 2,
        message_end 1), 1 keep-alive and [DONE]"."""
        if self.whole:
            return "one JSON body"
        kinds = {kind: n for kind, n in self.seen.items() if kind not in _EXTRAS}
        text = f"{self.events} event{'' if self.events == 1 else 's'}"
        if kinds:
            text += " (" + ", ".join(f"{kind} {n}" for kind, n in kinds.items()) + ")"
        sse = self.reader.stream.format == "sse"
        names = {
            **_EXTRAS,
            FOREIGN: ("line that is not an event-stream field", "lines that are not event-stream fields")
            if sse
            else ("server-sent-event line", "server-sent-event lines"),
        }
        extras = [f"{n} {names[kind][n != 1]}" for kind, n in self.seen.items() if kind in names and kind != DONE]
        if self.seen.get(DONE):
            extras.append("[DONE]")
        if extras:
            text += ", " + ", ".join(extras)
        if self.seen.get(FOREIGN) and not self.events:
            other = "ndjson" if sse else "sse"
            text += f" (is it {other}? provider.system.stream.format={other})"
        return text


DONE = "[DONE]"


COMMENT = "comment"


KEEPALIVE = "keep-alive"


FOREIGN = "foreign"


_EXTRAS = {
    COMMENT: ("comment", "comments"),
    KEEPALIVE: ("keep-alive", "keep-alives"),
    DONE: ("[DONE]", "[DONE]"),
    FOREIGN: ("foreign line", "foreign lines"),
}


class StreamReader:
    """Reads a streamed reply event by event (``sse`` or ``ndjson``), within the size cap.

    The answer is the events' text (``stream.delta``, else ``response.answer``) joined, or the
    last one when ``cumulative``; every other expression is read from each event and the last
    non-null value wins; the ``error`` expression is checked on every event. Comments, keep-alive
    events without data and ``[DONE]`` are skipped; a UTF-8 byte-order mark before the first
    event is not part of it. A reply that is one JSON body (a gateway that ignores ``stream``, an
    error envelope sent without streaming) is read as that one reply, through the same mapping:
    its answer is ``response.answer`` when that is set, else ``stream.delta`` read from the body.
    A stream that ends with no answer text is an error for that case, saying what arrived.
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
        answer = mapping.expressions.get("answer")
        self.whole_expression = answer if answer is not None else self.text
        self.whole_text = (
            f"response.answer {mapping.mapping.answer!r}" if answer is not None else f"stream.delta {stream.delta!r}"
        )

    def answer(self, pieces: list[str]) -> str:
        if self.stream.cumulative:
            return pieces[-1] if pieces else ""
        return "".join(pieces)

    async def read(self, response: Body, cap: int, started: float) -> Streamed:
        state = Streamed(self, {}, [], None, 0)
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind in ("application/json", "text/json"):
            state.whole = True
            self.event(parse_json(await read_capped(response, cap)), state, started, self.whole_expression)
            return state
        events = (sse_events if self.stream.format == "sse" else ndjson_events)(response, cap, state.seen)
        async for name, data, ended in events:
            if data.strip() == b"[DONE]":
                state.seen[DONE] += 1
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                if not ended:  # the last line was cut: the service or a proxy ended the stream early
                    raise httpx.RemoteProtocolError("the stream ended in the middle of a line") from None
                preview = unreadable(exc.doc or data[:200].decode("utf-8", "replace"), exc.pos if exc.doc else None)
                raise BadReply(f"stream event {state.events + 1} is not JSON ({preview})") from None
            state.seen[name or _kind_of(event)] += 1
            self.event(event, state, started, self.text)
        return state

    def event(self, event: Any, state: Streamed, started: float, text: Any) -> None:
        state.events += 1
        message = self.mapping.reply_error(event)
        if message is not None:
            raise SystemReplyError(message)
        if text is not None:
            piece = _search(text, event, "stream.delta" if self.stream.delta and text is self.text else "answer")
            if isinstance(piece, str) and piece:
                if state.ttft is None and not piece.isspace():
                    state.ttft = time.perf_counter() - started
                state.pieces.append(piece)
            elif piece not in (None, False, ""):
                raise MappingError(f"answer: the text of stream event {state.events} is not a string")
        for key in self.keys:
            value = self.mapping.search(key, event)
            if value is not None:
                state.found[key] = value
                if key in self.mapping.levels:
                    state.gaps[key] = self.mapping.gaps(key, event, value)
        if state.whole:
            state.seen[_kind_of(event)] += 1


def _kind_of(event: Any) -> str:
    """An event's type as services write it inside the event (Dify's ``event``, an NDJSON
    ``type``, OpenAI's ``object``), else ``data``."""
    if type(event) is dict:
        for key in ("event", "type", "object"):
            value = event.get(key)
            if isinstance(value, str) and value:
                return value[:40]
    return "data"


def _search(expression: Any, data: Any, key: str) -> Any:
    try:
        return expression.search(data)
    except jmespath.exceptions.JMESPathError as exc:
        raise MappingError(f"{key}: {' '.join(str(exc).split())}") from None


def _is_done(line: bytes) -> bool:
    field, _, value = line.partition(b":")
    return field == b"data" and value.strip() == b"[DONE]"


async def _lines(response: Body, cap: int) -> AsyncIterator[tuple[bytes, bool]]:
    """The reply's lines (without their ending) and whether each was ended; ``\r\n``, ``\n``
    and ``\r`` all end a line, as the event-stream format says. A UTF-8 byte-order mark at the
    very start is dropped."""
    size, pending, started = 0, b"", False
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise BadReply(f"stream is larger than max_response_bytes ({cap:,} bytes)")
        pending += chunk
        if not started:
            if len(pending) < len(BOM) and BOM.startswith(pending):
                continue  # the mark may be split across chunks
            pending, started = pending.removeprefix(BOM), True
        if b"\r" in pending:
            if pending.endswith(b"\r"):
                continue  # a \r\n may be split across chunks
            pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line, True
    if not started:
        pending = pending.removeprefix(BOM)
    if pending:
        yield pending.replace(b"\r", b""), False


async def sse_events(
    response: Body, cap: int, seen: Counter[str] | None = None
) -> AsyncIterator[tuple[str, bytes, bool]]:
    """(event type, data, True) of each server-sent event with data; events without data
    (keep-alives), comments and lines that are no event-stream field are counted in ``seen``.
    The type is the ``event:`` field, empty when none is given."""
    seen = seen if seen is not None else Counter()
    data: list[bytes] = []
    name = b""
    async for line, ended in _lines(response, cap):
        if not ended:
            if _is_done(line):
                data.append(b"[DONE]")
                break  # the last event, sent without its line ending: the stream is complete
            # The stream ended inside an event: the service or a proxy cut it short.
            raise httpx.RemoteProtocolError("the event stream ended in the middle of an event")
        if not line:
            if data:
                yield name.decode("utf-8", "replace")[:40], b"\n".join(data), True
                data = []
            elif name:
                seen[KEEPALIVE] += 1
            name = b""
            continue
        if line.startswith(b":"):
            seen[COMMENT] += 1
            continue
        field, colon, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
        elif field not in (b"id", b"retry") or not colon:
            seen[FOREIGN] += 1
    if data:
        if b"\n".join(data).strip() == b"[DONE]":
            yield "", b"[DONE]", True  # ``data: [DONE]`` without the closing blank line: complete
            return
        raise httpx.RemoteProtocolError("the event stream ended in the middle of an event")


async def ndjson_events(
    response: Body, cap: int, seen: Counter[str] | None = None
) -> AsyncIterator[tuple[str, bytes, bool]]:
    """Each non-empty line: one JSON value, and whether its line was ended (a last line without
    its ending that does not parse was cut short). Server-sent-event lines are counted in
    ``seen`` as foreign (a service streaming SSE where NDJSON is configured)."""
    async for line, ended in _lines(response, cap):
        if not line.strip():
            continue
        if seen is not None and line.startswith((b"data:", b"event:", b":")):
            seen[FOREIGN] += 1
            continue
        yield "", line, ended
