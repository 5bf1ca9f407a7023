"""What the product stand-ins (dify.py, ragflow.py, openai_chat.py, inhouse.py) share: an
HTTP/1.1 handler that streams chunked bodies (and can cut one short or stall), the attempts seen
per question, and the knowledge every stand-in answers from.

$STANDIN_NO_AUTH: the stand-ins take only requests without an Authorization header.

Knowledge: a question ending in a number n ("what about 7?") retrieves chunk ``seg-n`` (text
"fact n lives here.", of document ``doc-n``) then ``seg-n-x`` (unrelated, of ``doc-n-x``), and is
answered "fact n is documented.". A question without a number retrieves nothing and is answered
with a refusal. With $STANDIN_REINDEXED set, the documents were re-indexed (as Dify and RAGFlow
do when a document's chunking changes): every chunk has a new id (``seg-n-r2``) and a wider text
("Section n. fact n lives here. Read on."); the documents keep their ids.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.base import Backlogged, JsonHandler, maybe_tls

ATTEMPTS: dict[str, list[float]] = {}
LOCK = threading.Lock()
REFUSAL = "无法回答: the knowledge base has nothing on that."


def knowledge(question: str) -> tuple[str, list[tuple[str, str]]]:
    """(answer, [(chunk id, chunk text), ...]) for a question."""
    match = re.search(r"(\d+)\D*$", question)
    if match is None:
        return REFUSAL, []
    n = match.group(1)
    return f"fact {n} is documented.", [(f"seg-{n}", f"fact {n} lives here."), (f"seg-{n}-x", "Unrelated text.")]


SESSIONS: dict[str, list[str]] = {}
"""Conversation id the stand-in issued -> the questions asked in it, in order (GET /sessions)."""


def knowledge_after(question: str, earlier: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """:func:`knowledge`, where a follow-up naming no fact ("那它呢？") is about the last fact its
    conversation named: answerable only when the service is given the conversation's id."""
    if re.search(r"\d", question) is None:
        named = [text for text in earlier if re.search(r"\d", text)]
        if named:
            return knowledge(named[-1])
    return knowledge(question)


def converse(given: str | None) -> tuple[str, list[str]] | None:
    """The conversation a request continues (``given``: the id it sent, or none) and its earlier
    questions; a new one when none is given; None for an id this stand-in never issued."""
    with LOCK:
        if not given:
            session = uuid.uuid4().hex
            SESSIONS[session] = []
        elif given not in SESSIONS:
            return None
        else:
            session = given
        return session, list(SESSIONS[session])


def remember(session: str, question: str) -> None:
    with LOCK:
        SESSIONS[session].append(question)


def follow_up(given: str | None, question: str) -> tuple[str, str, list[tuple[str, str]]] | None:
    """One turn of the conversation a request continues (``given``: the id it sent, or none): the
    conversation's id, the answer and its chunks (:func:`knowledge_after` its earlier questions),
    the question kept as its latest; None for an id this stand-in never issued."""
    continued = converse(given)
    if continued is None:
        return None
    conversation, earlier = continued
    remember(conversation, question)
    answer, chunks = knowledge_after(question, earlier)
    return conversation, answer, chunks


def indexed(chunks: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(chunk id, text, document id) of each retrieved chunk as the knowledge base holds it now."""
    reindexed = bool(os.environ.get("STANDIN_REINDEXED"))
    out = []
    for chunk_id, text in chunks:
        document = "doc-" + chunk_id.removeprefix("seg-")
        if reindexed:
            chunk_id, text = f"{chunk_id}-r2", f"Section {document[4:]}. {text} Read on."
        out.append((chunk_id, text, document))
    return out


def pieces(text: str) -> list[str]:
    """The answer as a model streams it: a word at a time, spaces kept."""
    return re.findall(r"\S+\s*", text)


def key_ok(sent: str | None, expected: str) -> bool:
    """Whether a request's Authorization header is what the stand-in takes: ``expected``; with
    $STANDIN_NO_AUTH set, none at all (a service without authentication, which must not be sent
    a key)."""
    if os.environ.get("STANDIN_NO_AUTH"):
        return sent is None
    return sent == expected


def cut_enabled() -> bool:
    """``cut`` questions are cut short while the file named by STANDIN_CUT_FILE exists."""
    path = os.environ.get("STANDIN_CUT_FILE")
    return bool(path) and os.path.exists(path)


class StreamingHandler(JsonHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def record(self, question: str) -> int:
        with LOCK:
            ATTEMPTS.setdefault(question, []).append(time.time())
            return len(ATTEMPTS[question])

    def body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def stats(self) -> None:
        with LOCK:
            if self.path.split("?")[0] == "/sessions":
                return self.reply(200, SESSIONS)
            self.reply(200, ATTEMPTS)

    def start_stream(self, content_type: str = "text/event-stream") -> None:
        self.send_response(200)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def raw(self, data: bytes) -> None:
        """Bytes as they are, outside the chunked framing's bookkeeping of :meth:`event`."""
        self.chunk(data)

    def cut(self, data: bytes = b'data: {"par') -> None:
        """Send part of an event, then drop the connection without ending the body."""
        self.chunk(data)
        self.drop()

    def drop(self) -> None:
        """Drop the connection without ending the body (no closing chunk)."""
        self.close_connection = True
        self.connection.shutdown(2)
        self.connection.close()

    def stall(self) -> None:
        time.sleep(60)


def main(handler: type[StreamingHandler]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (and --tls-key)")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    server = Backlogged(("127.0.0.1", args.port), handler)
    scheme = maybe_tls(server, args.tls_cert, args.tls_key)
    print(f"listening on {scheme}://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
