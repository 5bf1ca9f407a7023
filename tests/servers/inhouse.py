"""An in-house RAG API with its own field names, for the generic mapping tests.

    python tests/servers/inhouse.py --port 0        # prints "listening on URL"

GET /search?q=...&top=N&lang=...  (X-Api-Key: $INHOUSE_STANDIN_KEY, default inhouse-standin;
  401 otherwise) -> 200 {"status": "ok", "result": {"text", "hits": [{"doc", "body"}], "cites":
  ["doc id", ...]}, "took": {"search": s, "llm": s}}, at most ``top`` hits; lang must be given.
  Business errors are HTTP 200 {"status": "error", "reason": ...}: a question containing
  "broken". A question containing "badtype" gets "text" as a list of words; "echo" gets the
  request's key back in "text"; "bom" gets its JSON after a UTF-8 byte-order mark.
POST /ask/stream  {"q", "top"}: NDJSON, {"type": "token", "text"} lines, ": " comment-free,
  then {"type": "done", "hits": [...]}; "cut" questions are cut short while $STANDIN_CUT_FILE
  exists; "halfline" ones, while it exists, end the body cleanly after half a line (a proxy that
  closed the stream in the middle of a line).
GET /stats  the attempts seen per question.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.streaming import StreamingHandler, cut_enabled, knowledge, main, pieces


class Handler(StreamingHandler):
    def authorized(self) -> bool:
        if self.headers.get("X-Api-Key") == os.environ.get("INHOUSE_STANDIN_KEY", "inhouse-standin"):
            return True
        self.reply(401, {"status": "error", "reason": "unauthorized"})
        return False

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/stats":
            return self.stats()
        if not self.authorized():
            return None
        query = parse_qs(parts.query)
        if parts.path != "/search" or "q" not in query or "lang" not in query:
            return self.reply(400, {"status": "error", "reason": "q and lang are required"})
        question, top = query["q"][0], int(query.get("top", ["10"])[0])
        self.record(question)
        if "broken" in question:
            return self.reply(200, {"status": "error", "reason": "index is rebuilding"})
        answer, chunks = knowledge(question)
        hits = [{"doc": chunk_id, "body": text} for chunk_id, text in chunks[:top]]
        cites = [chunks[0][0]] if chunks else []
        result: dict[str, Any] = {"text": answer, "hits": hits, "cites": cites}
        if "badtype" in question:
            result["text"] = answer.split()
        if "echo" in question:
            result["text"] = f"invalid key {self.headers.get('X-Api-Key')}"
        payload = {"status": "ok", "result": result, "took": {"search": 0.01, "llm": 0.02}}
        if "bom" in question:
            data = b"\xef\xbb\xbf" + json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data) and None
        return self.reply(200, payload)

    def do_POST(self) -> None:
        if not self.authorized():
            return None
        body = self.body()
        question = str(body.get("q"))
        self.record(question)
        answer, chunks = knowledge(question)
        self.start_stream("application/x-ndjson")
        for index, piece in enumerate(pieces(answer)):
            self.line({"type": "token", "text": piece})
            if index == 0 and "cut" in question and cut_enabled():
                return self.cut(b'{"type": "tok')
            if index == 0 and "halfline" in question and cut_enabled():
                self.chunk(b'{"type": "tok')
                return self.end_stream()
        self.line({"type": "done", "hits": [{"doc": chunk_id, "body": text} for chunk_id, text in chunks]})
        self.end_stream()

    def line(self, data: dict[str, Any]) -> None:
        self.chunk(json.dumps(data).encode() + b"\n")


if __name__ == "__main__":
    main(Handler)
