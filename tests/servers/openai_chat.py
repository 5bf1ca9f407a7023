"""A stand-in for an OpenAI-compatible chat completions endpoint, after OpenAI's public API
reference (what vLLM, Ollama, LiteLLM and others serve).

    python tests/servers/openai_chat.py --port 0        # prints "listening on URL"

POST /v1/chat/completions  {"model", "messages", "stream"?}; Authorization: Bearer
  $OPENAI_STANDIN_KEY (default sk-standin), else 401 {"error": {"message", "type", "code"}}.
  Model "standin-model" exists; any other is 404 {"error": ...}.
  stream false: {"id", "object": "chat.completion", "created", "model", "choices": [{"index",
  "message": {"role", "content"}, "finish_reason"}], "usage"}.
  stream true: ``data: {...}`` chat.completion.chunk events (the first delta holds the role and
  empty content, the last one an empty delta and finish_reason "stop"), then ``data: [DONE]``;
  with "stream_options": {"include_usage": true}, every chunk has "usage": null and one more
  chunk with empty "choices" and the "usage" comes before ``data: [DONE]``.
  usage: prompt_tokens 20 + the question's length // 4, completion_tokens the answer's length // 4 + 1.
The answer is the knowledge's answer to the last user message; a question containing "long" is
400 context_length_exceeded. Streams that end the ways real servers and gateways end them:
"silent" streams the role delta and finish_reason but no text, "doneonly" only ``data: [DONE]``;
"blocking" ignores ``stream`` and answers with one chat.completion; "lastdone" ends with
``data: [DONE]`` and no blank line after it; "bom" starts the stream with a UTF-8 byte-order mark.
GET /stats  the attempts seen per question.
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

from tests.servers.streaming import StreamingHandler, key_ok, knowledge_after, main, pieces

MODEL = "standin-model"


def error(message: str, kind: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Handler(StreamingHandler):
    def do_GET(self) -> None:
        self.stats()

    def do_POST(self) -> None:
        key = os.environ.get("OPENAI_STANDIN_KEY", "sk-standin")
        if not key_ok(self.headers.get("Authorization"), f"Bearer {key}"):
            return self.reply(401, error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"))
        if self.path.split("?")[0] != "/v1/chat/completions":
            return self.reply(404, error("Not found", "invalid_request_error", "unknown_url"))
        body = self.body()
        if body.get("model") != MODEL:
            message = f"The model `{body.get('model')}` does not exist."
            return self.reply(404, error(message, "invalid_request_error", "model_not_found"))
        messages = body.get("messages")
        users = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            return self.reply(400, error("messages: a user message is required", "invalid_request_error", "x"))
        question = users[-1]["content"]
        self.record(question)
        if "long" in question:
            message = "This model's maximum context length is 8192 tokens."
            return self.reply(400, error(message, "invalid_request_error", "context_length_exceeded"))
        # The conversation is the messages: a follow-up is read after the user's earlier ones.
        earlier = [m["content"] for m in users[:-1] if isinstance(m.get("content"), str)]
        answer, _ = knowledge_after(question, earlier)
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        prompt, completion = 20 + len(question) // 4, len(answer) // 4 + 1
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        if not body.get("stream") or "blocking" in question:
            choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
            return self.reply(
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": MODEL,
                    "choices": [choice],
                    "usage": usage,
                },
            )
        self.start_stream()
        if "bom" in question:
            self.raw(b"\xef\xbb\xbf")
        if "doneonly" in question:
            self.chunk(b"data: [DONE]\n\n")
            return self.end_stream()
        base: dict[str, Any] = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL}
        if with_usage:
            base["usage"] = None
        said = [] if "silent" in question else pieces(answer)
        deltas = [{"role": "assistant", "content": ""}, *({"content": piece} for piece in said)]
        for delta in deltas:
            self.event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        self.event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if with_usage:
            self.event({**base, "choices": [], "usage": usage})
        self.chunk(b"data: [DONE]\n" if "lastdone" in question else b"data: [DONE]\n\n")
        self.end_stream()

    def event(self, data: dict[str, Any]) -> None:
        self.chunk(b"data: " + json.dumps(data).encode() + b"\n\n")


if __name__ == "__main__":
    main(Handler)
