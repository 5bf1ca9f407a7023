"""An HTTP proxy in front of a real server that loses replies, or dies, on the requests chosen.

    python tests/servers/dropproxy.py --port 0 --upstream URL [--drop RULE]... [--die-on RULE]
                                      [--hold RULE --hold-file PATH] [--fail RULE]...

prints "listening on URL". A RULE is ``METHOD PATH-SUBSTRING`` with an optional ``#N``: the Nth
matching request (1 by default, counted from the proxy's start); ``#*``: every one.

--drop    forwards the matching request to the upstream server, waits for its answer, then closes
          the client's connection without a byte of it: the server did the work, the client never
          hears (a proxy timeout, a reset load balancer). Repeatable.
--die-on  on the matching request the proxy stops listening, closes every connection and exits
          without forwarding it: the tracking server is gone from the client's point of view, as
          if killed at that moment.
--hold    forwards the matching request, then keeps its answer until PATH (--hold-file) is
          removed: the test acts while the client waits at that exact point.
--fail    answers the matching request 503 without forwarding it: the server never saw it (an
          overloaded load balancer). Repeatable.

GET /__proxy__/stats answers {"seen": [[METHOD, PATH, ACTION], ...]} (ACTION: forwarded, dropped,
held, died, failed; a held request is listed once its answer is held).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
)


@dataclass
class Rule:
    method: str
    path: str
    nth: int
    seen: int = 0

    @classmethod
    def parse(cls, text: str) -> Rule:
        spec, _, nth = text.partition("#")
        method, _, path = spec.strip().partition(" ")
        return cls(method.upper(), path.strip(), 0 if nth == "*" else int(nth) if nth else 1)

    def hit(self, method: str, path: str) -> bool:
        """Count a matching request; True for the chosen one."""
        if method != self.method or self.path not in path:
            return False
        self.seen += 1
        return self.nth == 0 or self.seen == self.nth


UPSTREAM = ("127.0.0.1", 80)
DROPS: list[Rule] = []
DIE: list[Rule] = []
FAILS: list[Rule] = []
HOLDS: list[Rule] = []
HOLD_FILE: str | None = None
SEEN: list[list[str]] = []
LOCK = threading.Lock()
SERVER: ThreadingHTTPServer | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        method, path = self.command, self.path
        body = self._body()
        if path == "/__proxy__/stats":
            with LOCK:
                data = json.dumps({"seen": SEEN}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        with LOCK:
            die = any(rule.hit(method, path) for rule in DIE)
            fail = not die and any(rule.hit(method, path) for rule in FAILS)
            if fail:
                SEEN.append([method, path, "failed"])
            drop = not die and not fail and any(rule.hit(method, path) for rule in DROPS)
            hold = not die and not drop and any(rule.hit(method, path) for rule in HOLDS)
            if not hold and not fail:
                SEEN.append([method, path, "died" if die else "dropped" if drop else "forwarded"])
        if die:
            _die(self.connection)
        if fail:
            data = b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "overloaded"}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        upstream = http.client.HTTPConnection(*UPSTREAM, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            upstream.request(method, path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reason, answer = response.status, response.reason, response.getheaders()
        finally:
            upstream.close()
        if hold:
            with LOCK:
                SEEN.append([method, path, "held"])
            while HOLD_FILE is not None and os.path.exists(HOLD_FILE):
                time.sleep(0.05)
        if drop:
            # The server has answered; the client gets nothing but a closed connection.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response_only(status, reason)
        for key, value in answer:
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


def _die(connection: socket.socket) -> None:
    """Stop listening and exit at once: later connections are refused, this one is reset."""
    if SERVER is not None:
        SERVER.socket.close()
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    global UPSTREAM, SERVER, HOLD_FILE
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--drop", action="append", default=[])
    parser.add_argument("--die-on", action="append", default=[])
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--hold-file")
    parser.add_argument("--fail", action="append", default=[])
    args = parser.parse_args()
    parts = urlsplit(args.upstream)
    UPSTREAM = (parts.hostname or "127.0.0.1", parts.port or 80)
    DROPS.extend(Rule.parse(text) for text in args.drop)
    DIE.extend(Rule.parse(text) for text in args.die_on)
    HOLDS.extend(Rule.parse(text) for text in args.hold)
    FAILS.extend(Rule.parse(text) for text in args.fail)
    HOLD_FILE = args.hold_file
    SERVER = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    SERVER.daemon_threads = True
    print(f"listening on http://127.0.0.1:{SERVER.server_address[1]}", flush=True)
    SERVER.serve_forever()


if __name__ == "__main__":
    main()
