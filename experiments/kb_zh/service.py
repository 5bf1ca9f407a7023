"""A small, real RAG service over the kb_zh knowledge base: the system under test for provider=http.

    python experiments/kb_zh/service.py --port 8000                      # baseline
    python experiments/kb_zh/service.py --port 8001 --chunking sentence  # a candidate to compare

Retrieval is BM25 over character bigrams (works for Chinese without a tokenizer or a model
download), optionally reranked by query coverage; the answer is the best-matching sentence of
the top chunk, cited as [1], or a refusal when the best score is too low. It speaks ragexp's
service contract: POST {"question", "k", "case_id"} -> {"ranked_ids", "contexts", "answer",
"citations", "timings"}. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import ssl
import sys
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REFUSAL = "知识库中没有足够证据回答这个问题。"
SENTENCE = re.compile(r"[^。！？；;]+[。！？；;]?")


def tokens(text: str) -> list[str]:
    """Character bigrams of CJK runs plus lower-cased words and numbers."""
    out: list[str] = []
    for run in re.findall(r"[\u4e00-\u9fff]+|[A-Za-z]+|\d+", text):
        if run[0].isascii():
            out.append(run.lower())
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


class Index:
    def __init__(self, docs: list[dict[str, str]], chunking: str, k1: float = 1.2, b: float = 0.75) -> None:
        self.chunks: list[tuple[str, str]] = []  # (doc id, text)
        for doc in docs:
            text = doc["text"]
            if chunking == "sentence":
                self.chunks.extend((doc["id"], s.strip()) for s in SENTENCE.findall(text) if s.strip())
            else:
                self.chunks.append((doc["id"], f"{doc.get('title', '')}：{text}"))
        self.terms = [Counter(tokens(text)) for _, text in self.chunks]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.avg = sum(self.lengths) / max(len(self.lengths), 1)
        df: Counter[str] = Counter()
        for terms in self.terms:
            df.update(terms.keys())
        n = len(self.chunks)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def search(self, query: str) -> list[tuple[float, int]]:
        q = tokens(query)
        scored = []
        for i, terms in enumerate(self.terms):
            score = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
            for t in q:
                f = terms.get(t)
                if f:
                    score += self.idf[t] * f * (self.k1 + 1) / (f + norm)
            if score > 0:
                scored.append((score, i))
        scored.sort(reverse=True)
        return scored


def coverage(query: str, text: str) -> float:
    q = set(tokens(query))
    return len(q & set(tokens(text))) / len(q) if q else 0.0


class Service:
    def __init__(self, args: argparse.Namespace) -> None:
        docs = [json.loads(line) for line in Path(args.docs).read_text(encoding="utf-8").splitlines() if line]
        self.index = Index(docs, args.chunking)
        self.rerank = not args.no_rerank
        self.threshold = args.threshold
        self.delay = args.delay_ms / 1000.0

    def answer(self, question: str, k: int) -> dict[str, Any]:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        hits = self.index.search(question)
        timings["keyword"] = time.perf_counter() - started
        started = time.perf_counter()
        candidates = hits[: max(k * 3, 10)]
        if self.rerank:
            candidates.sort(key=lambda hit: (coverage(question, self.index.chunks[hit[1]][1]), hit[0]), reverse=True)
        timings["rerank"] = time.perf_counter() - started
        started = time.perf_counter()
        ranked_ids: list[str] = []
        contexts: list[str] = []
        for _, i in candidates:
            doc_id, text = self.index.chunks[i]
            if doc_id not in ranked_ids:  # several chunks of one document count once
                ranked_ids.append(doc_id)
                contexts.append(text)
            if len(ranked_ids) == k:
                break
        best = candidates[0][0] if candidates else 0.0
        if best < self.threshold or not ranked_ids:
            answer, citations, ranked_ids, contexts = REFUSAL, [], [], []
        else:
            sentences = [s for s in SENTENCE.findall(contexts[0]) if s.strip()] or [contexts[0]]
            answer = max(sentences, key=lambda s: coverage(question, s)).strip() + "[1]"
            citations = [1]
        if self.delay:
            time.sleep(self.delay)
        timings["model"] = time.perf_counter() - started
        return {
            "ranked_ids": ranked_ids,
            "contexts": contexts,
            "answer": answer,
            "citations": citations,
            "timings": timings,
        }


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
    parser.add_argument("--docs", default=str(HERE / "docs.jsonl"))
    parser.add_argument("--chunking", choices=["doc", "sentence"], default="doc")
    parser.add_argument("--no-rerank", action="store_true", help="rank by BM25 alone")
    parser.add_argument("--threshold", type=float, default=3.0, help="refuse below this BM25 score")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="extra latency per request")
    parser.add_argument("--token-env", help="require 'Authorization: Bearer <value of this variable>'")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="private key of --tls-cert")
    args = parser.parse_args()
    token = os.environ[args.token_env] if args.token_env else None
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Service(args), token))
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
