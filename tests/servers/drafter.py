"""A deterministic drafting model: OpenAI chat completions that draft cases from the chunks in
the prompt by rule, for testing ``ragexp draft`` offline.

    python tests/servers/drafter.py --port 0 [--delay-ms 100]

The reply schema's title (sent in the system message, as JSON mode asks) picks the rule; the
chunks are read from the ``<chunk id="...">`` blocks of the prompt. A single-chunk question asks
about the chunk's longest sentence and gives that sentence (end punctuation off) as the fact; a
two-chunk one does that for both; an unanswerable one asks for a made-up code, and gives it as
the answer candidate. Markers in a chunk's text change the reply: DRAFT-PARAPHRASE gives a fact
that is not a span until the re-ask, DRAFT-NEVER-SPAN never gives a span, DRAFT-ANSWERABLE gives
an "unanswerable" question whose candidate is in the chunk, JUDGE-BROKEN gives prose, not JSON.
With --like-llm, answerable replies behave as a real model's do, chosen by a hash of the chunks:
facts copied verbatim (clauses of two sentences, one of them across a "；"), facts written with
half-width punctuation ("，" as ","), facts joining both chunks of a two-chunk question, or facts
all from one of its chunks; every one but the verbatim kind is corrected on the re-ask for half of
the prompts and repeated for the rest, and the question is written out in full.
With --fail-after N, every chat call after the N-th is closed without
a reply. GET /stats counts chat calls.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.base import Backlogged, JsonHandler

COUNTS = {"chat": 0}
LOCK = threading.Lock()
CHUNK = re.compile(r'<chunk id="([^"]*)">\n(.*?)\n</chunk>', re.DOTALL)
SENTENCE = re.compile(r"[^。！？!?\n]+")
RETRY_MARKS = ("Reply again with the same JSON fields", "请用相同的 JSON 字段重新回答")


def key_sentence(text: str) -> str:
    sentences = [s.strip(" .;；，,") for s in SENTENCE.findall(text) if s.strip(" .;；，,")]
    return max(sentences, key=len)[:60] if sentences else text.strip()[:60]


def clauses(text: str) -> list[str]:
    """The chunk's sentences, longest first (end punctuation off)."""
    return sorted((s.strip(" .;；，,") for s in SENTENCE.findall(text) if s.strip(" .;；，,")), key=len, reverse=True)


def like_llm(texts: list[str], retry: bool) -> Any:
    """An answerable reply as a real model writes one (see the module docstring)."""
    digest = hashlib.md5("\0".join(texts).encode()).digest()
    habit, stubborn = digest[0] % 4, digest[1] % 2 == 0
    facts = [sentence for text in texts for sentence in clauses(text)[:2]]
    if habit and not (retry and not stubborn):
        if habit == 1:
            facts = [fact.replace("，", ",").replace("；", ";") for fact in facts]
        elif habit == 2 or len(texts) == 1:
            facts = [clauses(texts[0])[0] + "，" + clauses(texts[-1])[-1]]
        else:
            facts = clauses(texts[0])[:2]
    question = "请问" + "；另外".join(facts) + "，具体是怎样的？"
    return {"question": question, "expected_facts": facts, "reference": "；".join(facts) + "。"}


def draft(title: str, prompt: str) -> Any:
    chunks = CHUNK.findall(prompt)
    texts = [text for _, text in chunks]
    retry = any(mark in prompt for mark in RETRY_MARKS)
    if any("JUDGE-BROKEN" in text for text in texts):
        return None
    if title == "DraftUnanswerable":
        text = texts[0]
        code = "ZQ-" + hashlib.md5(text.encode()).hexdigest()[:8].upper()
        if "DRAFT-ANSWERABLE" in text:
            return {
                "question": f"「{key_sentence(text)[:12]}」具体指什么？",
                "answer_candidates": [key_sentence(text)[:8]],
            }
        return {"question": f"「{key_sentence(text)[:12]}」对应的内部编号 {code} 是什么？", "answer_candidates": [code]}
    if Handler.like_llm:
        return like_llm(texts, retry)
    facts = [key_sentence(text) for text in texts]
    paraphrase = any("DRAFT-NEVER-SPAN" in t for t in texts) or (
        any("DRAFT-PARAPHRASE" in t for t in texts) and not retry
    )
    if paraphrase:
        facts = [fact + "（大意）" for fact in facts]
    question = "，".join(f"关于「{fact[:16]}」" for fact in facts) + "，文档是怎么说的？"
    return {"question": question, "expected_facts": facts, "reference": "；".join(facts) + "。"}


class Handler(JsonHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    delay = 0.0
    fail_after: int | None = None
    like_llm = False

    def do_GET(self) -> None:
        with LOCK:
            self.reply(200, dict(COUNTS))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.delay:
            time.sleep(self.delay)
        if not self.path.endswith("/chat/completions"):
            return self.reply(404, {"error": {"message": "not found"}})
        with LOCK:
            COUNTS["chat"] += 1
            dead = self.fail_after is not None and COUNTS["chat"] > self.fail_after
        if dead:  # the model went away: the connection closes without a reply
            self.close_connection = True
            self.connection.shutdown(2)
            return None
        messages = body["messages"]
        system = messages[0]["content"]
        schema = json.loads(system[system.index("{") :]) if "{" in system else {}
        prompt = "\n".join(m["content"] for m in messages if m["role"] == "user")
        value = draft(str(schema.get("title", "")), prompt)
        content = "I am unable to produce JSON for this." if value is None else json.dumps(value, ensure_ascii=False)
        return self.reply(
            200,
            {
                "id": "chatcmpl-drafter",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "drafter"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": len(prompt) // 2,
                    "completion_tokens": len(content) // 2,
                    "total_tokens": len(prompt) // 2 + len(content) // 2,
                },
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--fail-after", type=int, help="close every chat call after this many without a reply")
    parser.add_argument("--like-llm", action="store_true", help="answer as a real model would (module docstring)")
    args = parser.parse_args()
    Handler.delay, Handler.fail_after, Handler.like_llm = args.delay_ms / 1000, args.fail_after, args.like_llm
    server = Backlogged(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
