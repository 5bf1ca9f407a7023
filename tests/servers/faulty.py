"""A fault-injecting RAG service for tests: the case id's prefix chooses the behaviour.

    python tests/servers/faulty.py --port 0        # prints "listening on URL"

ok-*        answers at once (retrieves rel-<id>, cites it, states "fact <id>", reports timings)
flaky500-*  500 on the first two attempts, then answers
rate-*      429 with Retry-After: 1 on the first attempt, then answers
drop-*      closes the connection without a reply on the first attempt, then answers
dropall-*   always closes the connection without a reply
slow-*      answers after 2 s (longer than the tests' timeout)
always500-* 500 on every attempt
bad400-*    400 (not retryable)
badjson-*   200 with a body that is not JSON
contract-*  200 with JSON that lacks "answer"
leak-*      200 with a non-JSON body that echoes the request's Authorization header
echo-*      200, a valid answer that quotes the request's token ("invalid token ...")
echoq-*     200, a valid answer with the token URL-encoded by urllib's quote ("/" kept) in a link
hostile-*   200 with a non-JSON body of terminal escapes, Markdown links and images, HTML
trickle-*   sends its headers, then one byte a second (never a whole reply in time)
hang-*      reads the request and never answers
huge-*      200 with a 3 MB JSON reply
big-*       200, a valid answer padded to 300 KB
inf-*       200 with "timings": {"model": Infinity}
bigint-*    200 with a citation beyond 64 bits
deep-*      200 with JSON nested 100,000 deep
notimpl-*   501 on every attempt
gated-*     503 while the file given by --gate-file exists, then answers
badgzip-*   200 marked Content-Encoding: gzip whose body is not gzip
deny-*      403 whose JSON reason echoes the request's Authorization header
GET /stats  the attempts seen per case id, with their times

Set FAULTY_TOKEN to require "Authorization: Bearer $FAULTY_TOKEN" (401 otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.base import Backlogged

ATTEMPTS: dict[str, list[float]] = {}
LOCK = threading.Lock()
DELAY = 0.0
GATE_FILE: str | None = None
HOSTILE_BODY = (
    "\x1b[2J\x1b[31mred\x1b[0m \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \u202eevil\u202c "
    "[x](javascript:alert(1)) ![i](http://evil.example/p.png) <script>alert(1)</script> `tick` a|b ]]> over\rwrite"
)
"""What a broken service's error page could hold: every destination must show it as text."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        with LOCK:
            self.reply(200, json.dumps(ATTEMPTS).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        case_id = str(body.get("case_id"))
        with LOCK:
            ATTEMPTS.setdefault(case_id, []).append(time.time())
            attempt = len(ATTEMPTS[case_id])
        token = os.environ.get("FAULTY_TOKEN")
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            return self.reply(401, b'{"error": "unauthorized"}')
        kind = case_id.split("-", 1)[0]
        if DELAY:
            time.sleep(DELAY)
        if (kind == "flaky500" and attempt <= 2) or kind == "always500":
            return self.reply(500, b'{"error": "boom"}')
        if kind == "rate" and attempt == 1:
            return self.reply(429, b'{"error": "slow down"}', {"Retry-After": "1"})
        if (kind == "drop" and attempt == 1) or kind == "dropall":
            self.close_connection = True
            self.connection.close()
            return None
        if kind == "slow":
            time.sleep(2.0)
        if kind == "trickle":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(120):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(1.0)
            self.close_connection = True
            return None
        if kind == "hang":
            time.sleep(120)
            self.close_connection = True
            return None
        if kind == "notimpl":
            return self.reply(501, b'{"error": "not implemented"}')
        if kind == "gated" and GATE_FILE and os.path.exists(GATE_FILE):
            return self.reply(503, b'{"error": "maintenance"}')
        if kind == "huge":
            return self.reply(200, json.dumps({"answer": "x" * 3_000_000, "ranked_ids": []}).encode())
        if kind == "deep":
            return self.reply(200, b"[" * 100_000 + b"]" * 100_000)
        if kind == "inf":
            text = '{"ranked_ids": ["a"], "answer": "a", "citations": [], "timings": {"model": Infinity}}'
            return self.reply(200, text.encode())
        if kind == "bigint":
            text = '{"ranked_ids": ["a"], "answer": "a", "citations": [123456789012345678901234567890]}'
            return self.reply(200, text.encode())
        if kind == "bad400":
            return self.reply(400, b'{"error": "bad request"}')
        if kind == "badgzip":
            return self.reply(200, b'{"answer": "not gzip"}', {"Content-Encoding": "gzip"})
        if kind == "deny":
            reason = f"key {self.headers.get('Authorization')} may not read this index"
            return self.reply(403, json.dumps({"error": {"message": reason}}).encode())
        if kind == "badjson":
            return self.reply(200, b"<html>not json</html>")
        if kind == "hostile":
            return self.reply(200, HOSTILE_BODY.encode())
        if kind == "leak":
            return self.reply(200, f"oops {self.headers.get('Authorization')}".encode())
        number = case_id.split("-", 1)[-1]
        payload: dict[str, Any] = {
            "ranked_ids": [f"rel-{number}", f"noise-{number}"],
            "contexts": [f"fact {number}.", "noise"],
            "answer": f"fact {number}. [1]",
            "citations": [1],
            "timings": {"embedding": 0.001, "vector": 0.002, "rerank": 0.004, "model": 0.02},
        }
        if kind == "contract":
            del payload["answer"]
        if kind == "big":
            payload["answer"] += " " + "填充" * 150_000
        if kind == "echo":
            token = str(self.headers.get("Authorization", "")).removeprefix("Bearer ")
            payload["answer"] = f"invalid token {token}, fact {number}. [1]"
        if kind == "echoq":
            token = str(self.headers.get("Authorization", "")).removeprefix("Bearer ")
            payload["answer"] = f"see https://svc.example/cb?t={urllib.parse.quote(token)} fact {number}. [1]"
        self.reply(200, json.dumps(payload).encode())

    def reply(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    global DELAY, GATE_FILE
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="latency added to every reply")
    parser.add_argument("--gate-file", help="gated-* cases fail with 503 while this file exists")
    args = parser.parse_args()
    DELAY = args.delay_ms / 1000
    GATE_FILE = args.gate_file
    server = Backlogged(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/query", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
