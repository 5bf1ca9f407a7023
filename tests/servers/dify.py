"""A stand-in for a Dify chat app's service API, after Dify's public API reference.

    python tests/servers/dify.py --port 0        # prints "listening on URL"

POST /v1/chat-messages  {"query", "inputs", "response_mode": "streaming" | "blocking", "user",
                        "conversation_id"?}; Authorization: Bearer $DIFY_STANDIN_KEY (default
                        app-standin), else 401 {"code", "message", "status"}.
  streaming: server-sent events, one JSON object per ``data:`` line, the event's type inside it:
  ``message`` events carry the answer a piece at a time, a ``ping`` keep-alive event comes
  between them, and ``message_end`` carries ``metadata.retriever_resources`` (position,
  dataset_id, dataset_name, document_id, document_name, segment_id, score, content) and usage.
  blocking: one JSON object with ``answer`` and ``metadata.retriever_resources``.
Questions containing "quota" stream an ``error`` event after the first piece ("quotacut": and
then drop the connection without ending the body); "cut" ones are cut short mid-event while
$STANDIN_CUT_FILE exists; "stall" ones stop after the first piece.
Conversations: a request without ``conversation_id`` (or with an empty one) starts one, whose id
every event of the reply carries; a request naming an id the app never issued is 404
"Conversation Not Exists.". A question naming no fact number is about the last one its
conversation named (answerable only in that conversation).
GET /stats  the attempts seen per query; GET /sessions  the questions of each conversation.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.streaming import StreamingHandler, cut_enabled, follow_up, indexed, key_ok, main, pieces


def resources(chunks: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {
            "position": position,
            "dataset_id": "ds-standin",
            "dataset_name": "standin",
            "document_id": document,
            "document_name": f"{document}.txt",
            "segment_id": chunk_id,
            "score": round(0.9 - 0.1 * position, 2),
            "content": text,
        }
        for position, (chunk_id, text, document) in enumerate(indexed(chunks), start=1)
    ]


class Handler(StreamingHandler):
    def do_GET(self) -> None:
        self.stats()

    def do_POST(self) -> None:
        key = os.environ.get("DIFY_STANDIN_KEY", "app-standin")
        if not key_ok(self.headers.get("Authorization"), f"Bearer {key}"):
            return self.reply(401, {"code": "unauthorized", "message": "Access token is invalid", "status": 401})
        if self.path.split("?")[0] != "/v1/chat-messages":
            return self.reply(404, {"code": "not_found", "message": "Not Found", "status": 404})
        body = self.body()
        query, user = body.get("query"), body.get("user")
        if not isinstance(query, str) or not query or not isinstance(user, str) or not user:
            return self.reply(400, {"code": "invalid_param", "message": "query and user are required", "status": 400})
        if not isinstance(body.get("inputs"), dict):
            return self.reply(400, {"code": "invalid_param", "message": "inputs must be an object", "status": 400})
        self.record(query)
        turn = follow_up(body.get("conversation_id"), query)
        if turn is None:
            return self.reply(404, {"code": "not_found", "message": "Conversation Not Exists.", "status": 404})
        conversation, answer, chunks = turn
        task, message = str(uuid.uuid4()), str(uuid.uuid4())
        metadata = {
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "latency": 0.05},
            "retriever_resources": resources(chunks),
        }
        if body.get("response_mode") != "streaming":
            return self.reply(
                200,
                {
                    "event": "message",
                    "task_id": task,
                    "id": message,
                    "message_id": message,
                    "conversation_id": conversation,
                    "mode": "chat",
                    "answer": answer,
                    "metadata": metadata,
                    "created_at": int(time.time()),
                },
            )
        self.start_stream()
        base = {"task_id": task, "id": message, "message_id": message, "conversation_id": conversation}
        for index, piece in enumerate(pieces(answer)):
            self.event({"event": "message", **base, "answer": piece, "created_at": int(time.time())})
            if index == 0:
                self.chunk(b"event: ping\n\n")
                if "quota" in query:
                    self.event(
                        {
                            "event": "error",
                            "task_id": task,
                            "message_id": message,
                            "status": 400,
                            "code": "provider_quota_exceeded",
                            "message": "Your quota of provider has been exceeded.",
                        }
                    )
                    if "quotacut" in query:
                        return self.drop()
                    return self.end_stream()
                if "cut" in query and cut_enabled():
                    return self.cut()
                if "stall" in query:
                    return self.stall()
        self.event({"event": "message_end", **base, "metadata": metadata, "files": None})
        self.end_stream()

    def event(self, data: dict[str, Any]) -> None:
        self.chunk(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


if __name__ == "__main__":
    main(Handler)
