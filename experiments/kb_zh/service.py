"""The bundled sample RAG system served over HTTP: the system under test for provider=http.

    python experiments/kb_zh/service.py --port 8000                      # baseline
    python experiments/kb_zh/service.py --port 8001 --chunking sentence  # a candidate to compare

The retriever and answerer are ``ragexp.sample`` (BM25 over character bigrams, a coverage
reranker, an extractive answer citing its source, or a refusal): the same code ``provider=sample``
runs in-process, so both give the same outputs for the same settings. This file is only the HTTP
wrapper. It speaks ragexp's service contract: POST {"question", "k", "case_id"} ->
{"ranked_ids", "contexts", "answer", "citations", "timings", "doc_ids"}. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

try:
    from ragexp.sample import CHUNKINGS, CITATION_POLICIES, DocsError, SampleSystem, Settings, load_docs
except ModuleNotFoundError:  # a checkout without the package installed: use its source tree
    sys.path.insert(0, str(HERE.parents[1]))
    from ragexp.sample import CHUNKINGS, CITATION_POLICIES, DocsError, SampleSystem, Settings, load_docs

from ragexp.paths import package_data  # noqa: E402

class Service:
    def __init__(self, args: argparse.Namespace) -> None:
        settings = Settings(
            top_k=args.top_k,
            rerank=not args.no_rerank,
            citations=args.citations,
            chunking=args.chunking,
            threshold=args.threshold,
            chunk_chars=args.chunk_chars,
            overlap=args.overlap,
            hops=args.hops,
        )
        self.system = SampleSystem(load_docs(Path(args.docs)), settings)
        self.delay = args.delay_ms / 1000.0

    def answer(self, question: str, k: int) -> dict[str, Any]:
        reply = self.system.answer(question, k)
        if self.delay:  # simulated generation time, counted in the model stage
            time.sleep(self.delay)
            reply["timings"]["model"] += self.delay
        return reply


def make_handler(service: Service, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes

        def do_POST(self) -> None:
            if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                return self.reply(401, {"error": "unauthorized"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                question, k = str(body["question"]), int(body.get("k", 5))
            except (ValueError, KeyError, TypeError):
                return self.reply(400, {"error": "expected {question, k, case_id}"})
            self.reply(200, service.answer(question, max(1, k)))

        def reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--docs", default=str(package_data() / "kb_zh" / "docs.jsonl"))
    parser.add_argument("--chunking", choices=CHUNKINGS, default="doc")
    parser.add_argument("--chunk-chars", type=int, default=120, help="characters per window (--chunking window)")
    parser.add_argument("--overlap", type=int, default=0, help="characters a window shares with the one before")
    parser.add_argument("--no-rerank", action="store_true", help="rank by BM25 alone")
    parser.add_argument("--hops", type=int, choices=(1, 2), default=1, help="2: search, then search with the bridge")
    parser.add_argument("--citations", choices=CITATION_POLICIES, default="source", help="what the answer cites")
    parser.add_argument("--top-k", type=int, default=None, help="documents returned (default: the request's k)")
    parser.add_argument("--threshold", type=float, default=3.0, help="refuse below this BM25 score")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="extra latency per request")
    parser.add_argument("--token-env", help="require 'Authorization: Bearer <value of this variable>'")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="private key of --tls-cert")
    args = parser.parse_args()
    token = os.environ[args.token_env] if args.token_env else None
    try:
        service = Service(args)
    except (DocsError, ValueError) as exc:
        parser.exit(1, f"service.py: error: {exc}\n")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(service, token))
    server.daemon_threads = True
    server.request_queue_size = 256
    scheme = "http"
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    print(f"listening on {scheme}://{args.host}:{server.server_address[1]}/query", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
