"""A stand-in for RAGFlow's chat assistant API, after RAGFlow's public HTTP API reference.

    python tests/servers/ragflow.py --port 0        # prints "listening on URL"

POST /api/v1/chats/{chat_id}/completions  {"question", "stream", "session_id"?, "user_id"?};
  Authorization: Bearer $RAGFLOW_STANDIN_KEY (default ragflow-standin). Every reply is HTTP 200
  with a business code: {"code": 0, "data": ...} or {"code": 102 | 109, "message": ...}, sent as
  plain JSON even when streaming was asked for.
  stream true: ``data:{...}`` server-sent events, each repeating the whole answer so far in
  ``data.answer``, the last one with ``data.reference.chunks`` (id, content, document_id,
  document_name, dataset_id, image_id, positions, similarity, vector_similarity,
  term_similarity) and ``doc_aggs``; then ``data:{"code": 0, "message": "", "data": true}``.
  stream false: one {"code": 0, "data": {"answer", "reference", "session_id", "id"}}.
  The answer cites chunks with ``[ID:n]`` markers, n counting from 0.
Chat id "standin" exists; any other is code 102. A question containing "forbidden" is code 102
("You don't own the dialog."). "cut" questions are cut short while $STANDIN_CUT_FILE exists.
Sessions: without ``session_id`` a new session is generated (its id in every reply's
``data.session_id``); a session id it never issued is code 102 "Session does not exist". A
question naming no fact number is about the last one its session named.
GET /stats  the attempts seen per question; GET /sessions  the questions of each session.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.streaming import (
    REFUSAL,
    StreamingHandler,
    cut_enabled,
    follow_up,
    indexed,
    key_ok,
    main,
    pieces,
)


def reference(chunks: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "total": len(chunks),
        "chunks": [
            {
                "id": chunk_id,
                "content": text,
                "document_id": document,
                "document_name": f"{document}.txt",
                "dataset_id": "ds-standin",
                "image_id": "",
                "positions": [""],
                "similarity": 0.7,
                "vector_similarity": 0.6,
                "term_similarity": 0.8,
            }
            for chunk_id, text, document in indexed(chunks)
        ],
        "doc_aggs": [
            {"doc_name": f"{document}.txt", "doc_id": document, "count": 1} for _, _, document in indexed(chunks)
        ],
    }


class Handler(StreamingHandler):
    def do_GET(self) -> None:
        self.stats()

    def do_POST(self) -> None:
        key = os.environ.get("RAGFLOW_STANDIN_KEY", "ragflow-standin")
        if not key_ok(self.headers.get("Authorization"), f"Bearer {key}"):
            return self.reply(200, {"code": 109, "message": "Authentication error: API key is invalid!"})
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) != 5 or parts[:3] != ["api", "v1", "chats"] or parts[4] != "completions":
            return self.reply(404, {"code": 404, "message": "Not Found"})
        if parts[3] != "standin":
            return self.reply(200, {"code": 102, "message": f"You don't own the chat {parts[3]}"})
        body = self.body()
        question = body.get("question")
        if not isinstance(question, str) or not question.strip():
            return self.reply(200, {"code": 102, "message": "Please input your question."})
        self.record(question)
        if "forbidden" in question:
            return self.reply(200, {"code": 102, "message": "You don't own the dialog."})
        turn = follow_up(body.get("session_id"), question)
        if turn is None:
            return self.reply(200, {"code": 102, "message": "Session does not exist"})
        session, answer, chunks = turn
        if chunks:
            answer = answer.rstrip(".") + " [ID:0]."
        message = str(uuid.uuid4())
        if body.get("stream") is False:
            data = {"answer": answer, "reference": reference(chunks), "session_id": session, "id": message}
            return self.reply(200, {"code": 0, "data": data})
        self.start_stream()
        so_far = ""
        words = pieces(answer)
        for index, piece in enumerate(words):
            so_far += piece
            last = index == len(words) - 1
            data = {
                "answer": so_far,
                "reference": reference(chunks) if last else {},
                "audio_binary": None,
                "id": message,
                "session_id": session,
            }
            self.event({"code": 0, "message": "", "data": data})
            if index == 0 and "cut" in question and cut_enabled():
                return self.cut(b'data:{"code": 0, "data": {"ans')
        if answer == REFUSAL and not words:
            self.event({"code": 0, "message": "", "data": {"answer": answer, "reference": {}, "id": message}})
        self.event({"code": 0, "message": "", "data": True})
        self.end_stream()

    def event(self, data: dict[str, Any]) -> None:
        self.chunk(b"data:" + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


if __name__ == "__main__":
    main(Handler)
