"""What the stand-in servers share: JSON replies, quiet logs, and a listen backlog for bursts."""

from __future__ import annotations

import json
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    def reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Backlogged(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    """The listen backlog: a class attribute, since the socket listens inside the constructor, and
    the clients under test open dozens of connections at once."""


def maybe_tls(server: ThreadingHTTPServer, cert: str | None, key: str | None) -> str:
    """Serve HTTPS with ``cert``/``key`` when a certificate is given; the URL scheme either way."""
    if not cert:
        return "http"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return "https"
