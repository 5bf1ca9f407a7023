"""A small deterministic judge: OpenAI-compatible chat completions and embeddings, plus a
text-embeddings-inference ``/embed`` endpoint, for testing the judge path offline.

    python tests/servers/judge.py --port 0 [--delay-ms 100] [--tls-cert C --tls-key K] [--api-key KEY]

Chat replies are computed, not canned: the reply schema (named in the request, as JSON mode
asks) picks a rule, and the rule reads the prompt's input. Statements are the answer's
sentences; a statement is supported by a context when at least half of its character bigrams
(words, for ASCII) occur in it; ratings follow the same overlap. Embeddings hash bigrams into
64 dimensions, so equal texts embed equally. A prompt containing JUDGE-BROKEN gets a reply that
is not JSON; one containing JUDGE-NAN gets an out-of-range rating. GET /stats counts calls;
GET /prompts lists the chat prompts received.

What it says it is: chat replies carry ``model`` (``--served-model``, else the model asked for)
and ``system_fingerprint`` (``--fingerprint``; ``--switch-after N --switch-fingerprint F``: F from
the (N+1)th chat call on, a redeployment mid-run); GET /v2 answers as MindIE's service metadata
and GET /info as TEI's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.servers.base import Backlogged, JsonHandler, maybe_tls

DIM = 64
COUNTS = {"chat": 0, "embeddings": 0, "tei": 0, "translate": 0, "json_mode": 0}
LOCK = threading.Lock()
LENIENT: list[str] = []
"""``--lenient-on WORD``: statements holding WORD are supported whatever the context (a judge
that drifted to leniency on such answers)."""
PROMPTS: list[str] = []
"""Every chat prompt received, in order (GET /prompts)."""
SENTENCES = re.compile(r"[^。！？.!?;；\n]+")


def units(text: str) -> set[str]:
    out: set[str] = set()
    for run in re.findall(r"[\u4e00-\u9fff]+|[A-Za-z0-9]+", text):
        if run.isascii():
            out.add(run.lower())
        elif len(run) == 1:
            out.add(run)
        else:
            out.update(run[i : i + 2] for i in range(len(run) - 1))
    return out


def coverage(part: str, whole: str) -> float:
    """Share of ``part``'s units found in ``whole``."""
    a = units(part)
    return len(a & units(whole)) / len(a) if a else 0.0


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCES.findall(text) if s.strip()]


def embed(text: str) -> list[float]:
    vector = [0.0] * DIM
    for unit in units(text) or {"<empty>"}:
        vector[int(hashlib.md5(unit.encode()).hexdigest(), 16) % DIM] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def rate(value: float, steps: tuple[float, ...], scores: tuple[int, ...]) -> int:
    for step, score in zip(steps, scores, strict=False):
        if value >= step:
            return score
    return scores[-1]


def prompt_input(prompt: str) -> dict[str, Any]:
    at = prompt.rfind("input: ")
    if at == -1:
        return {}
    try:
        value, _ = json.JSONDecoder().raw_decode(prompt[at + len("input: ") :])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def reply_for(schema: dict[str, Any], prompt: str) -> Any:
    title = schema.get("title", "")
    data = prompt_input(prompt)
    if "JUDGE-NAN" in prompt and "rating" in schema.get("properties", {}):
        return {"rating": 7}
    if title == "StatementGeneratorOutput":
        return {"statements": sentences(str(data.get("answer", "")))}
    if title in ("NLIStatementOutput", "StatementFaithfulnessOutput"):
        context = str(data.get("context", ""))
        return {
            "statements": [
                {
                    "statement": s,
                    "reason": "overlap",
                    "verdict": int(coverage(s, context) >= 0.5 or any(word in s for word in LENIENT)),
                }
                for s in data.get("statements", [])
            ]
        }
    if title == "ClassificationWithReason":
        answer, truth = list(data.get("answer", [])), list(data.get("ground_truth", []))
        joined_truth, joined_answer = " ".join(truth), " ".join(answer)
        return {
            "TP": [{"statement": s, "reason": "in truth"} for s in answer if coverage(s, joined_truth) >= 0.5],
            "FP": [{"statement": s, "reason": "not in truth"} for s in answer if coverage(s, joined_truth) < 0.5],
            "FN": [{"statement": s, "reason": "missed"} for s in truth if coverage(s, joined_answer) < 0.5],
        }
    if title == "AnswerRelevanceOutput":
        response = str(data.get("response", ""))
        evasive = any(marker in response for marker in ("无法回答", "不知道", "cannot answer"))
        return {"question": response, "noncommittal": int(evasive)}
    if title == "ContextPrecisionOutput":
        useful = coverage(str(data.get("answer", "")), str(data.get("context", ""))) >= 0.3
        return {"reason": "overlap", "verdict": int(useful)}
    if title == "ContextRecallOutput":
        context = str(data.get("context", ""))
        return {
            "classifications": [
                {"statement": s, "reason": "overlap", "attributed": int(coverage(s, context) >= 0.5)}
                for s in sentences(str(data.get("answer", "")))
            ]
        }
    if title == "EntitiesList":
        text = str(data.get("text", ""))
        return {"entities": sorted({w for w in re.findall(r"[A-Z][a-z]+|\d{4}|[\u4e00-\u9fff]{2,4}", text)})}
    if title == "AnswerAccuracyOutput":
        value = coverage(str(data.get("reference_answer", "")), str(data.get("user_answer", "")))
        return {"rating": rate(value, (0.5, 0.2), (4, 2, 0))}
    if title == "ContextRelevanceOutput":
        value = coverage(str(data.get("user_input", "")), str(data.get("context", "")))
        return {"rating": rate(value, (0.3, 0.1), (2, 1, 0))}
    if title == "ResponseGroundednessOutput":
        value = coverage(str(data.get("response", "")), str(data.get("context", "")))
        return {"rating": rate(value, (0.5, 0.2), (2, 1, 0))}
    if title == "RubricVerdict":
        if "JUDGE-BOOL" in prompt:
            return {"score": True, "rationale": "a bool, not a score"}
        if "JUDGE-TEXT" in prompt:
            return {"score": "1", "rationale": "a string, not a score"}
        return rubric_verdict(data, "JUDGE-NAN" in prompt)
    if title == "_TranslatedStrings":
        with LOCK:
            COUNTS["translate"] += 1
        match = re.search(r"Statements to translate:\s*(\[.*\])", prompt, re.DOTALL)
        items = json.loads(match.group(1)) if match else []
        return {"statements": [f"〔中文〕{item}" for item in items]}
    return generic(schema, schema)


def rubric_verdict(data: dict[str, Any], out_of_scale: bool) -> dict[str, Any]:
    """A rubric of the user's (ragexp's own prompt): the top of the scale when the answer holds
    every term the rubric quotes (「…」 or "…"), else the bottom; a rubric quoting nothing is
    scored by how much of the question the answer covers."""
    low, high = data.get("scale", [0, 1])
    answer = str(data.get("answer", ""))
    terms = re.findall(r"「([^」]+)」|\"([^\"]+)\"", str(data.get("rubric", "")))
    wanted = [a or b for a, b in terms]
    if out_of_scale:
        return {"score": high + 5, "rationale": "off the scale"}
    if wanted:
        missing = [term for term in wanted if term not in answer]
        score = low if missing else high
        why = f"missing {missing[0]}" if missing else f"has {', '.join(wanted)}"
        return {"score": score, "rationale": why}
    value = coverage(str(data.get("question", "")), answer)
    return {"score": low + round(value * (high - low)), "rationale": f"covers {value:.0%} of the question"}


def generic(node: dict[str, Any], root: dict[str, Any]) -> Any:
    if "$ref" in node:
        return generic(root["$defs"][node["$ref"].split("/")[-1]], root)
    kind = node.get("type")
    if kind == "object":
        return {name: generic(sub, root) for name, sub in node.get("properties", {}).items()}
    if kind == "array":
        return [generic(node.get("items", {}), root)]
    return {"integer": 1, "number": 1.0, "boolean": True}.get(kind or "", "text")


class Handler(JsonHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    delay = 0.0
    api_key: str | None = None
    fail_all = False
    zero_embeddings = False
    leak_key = False
    served_model: str | None = None
    fingerprint: str | None = None
    switch_after: int | None = None
    switch_fingerprint: str | None = None
    version = "1.0.0"
    usage: Any = None
    """What chat replies give as ``usage`` instead of the counts (``--usage JSON``)."""

    def do_GET(self) -> None:
        with LOCK:
            if self.path.endswith("/prompts"):
                return self.reply(200, list(PROMPTS))
            if self.path.endswith("/v2"):
                return self.reply(200, {"name": "MindIE Server", "version": self.version, "extensions": {}})
            if self.path.endswith("/info"):
                return self.reply(
                    200,
                    {"model_id": "embed-model", "model_sha": self.fingerprint or "main", "version": self.version},
                )
            self.reply(200, dict(COUNTS))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.api_key and self.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.reply(401, {"error": {"message": "bad key"}})
        if self.fail_all:
            return self.reply(503, {"error": {"message": "overloaded"}})
        if self.delay:
            time.sleep(self.delay)
        if self.path.endswith("/chat/completions"):
            return self.chat(body)
        if self.path.endswith("/embeddings"):
            with LOCK:
                COUNTS["embeddings"] += 1
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            return self.reply(
                200,
                {
                    "data": [
                        {"index": i, "embedding": [0.0] * DIM if self.zero_embeddings else embed(t)}
                        for i, t in enumerate(inputs)
                    ],
                    "model": body.get("model"),
                    "usage": {"prompt_tokens": sum(len(t) for t in inputs) // 4},
                },
            )
        if self.path.endswith("/embed"):
            with LOCK:
                COUNTS["tei"] += 1
            inputs = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
            return self.reply(200, [embed(t) for t in inputs])
        return self.reply(404, {"error": {"message": "no such endpoint"}})

    def chat(self, body: dict[str, Any]) -> None:
        with LOCK:
            COUNTS["chat"] += 1
            COUNTS["json_mode"] += "response_format" in body
            switched = self.switch_after is not None and COUNTS["chat"] > self.switch_after
        fingerprint = self.switch_fingerprint if switched else self.fingerprint
        if self.leak_key:
            data = f"invalid key {self.headers.get('Authorization')}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        messages = body.get("messages", [])
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
        with LOCK:
            PROMPTS.append(prompt)
        match = re.search(r"json_schema:\s*(\{.*\})\s*$", system, re.DOTALL)
        schema = json.loads(match.group(1)) if match else {}
        content = (
            "this is not json"
            if "JUDGE-BROKEN" in prompt
            else json.dumps(reply_for(schema, prompt), ensure_ascii=False)
        )
        self.reply(
            200,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": self.served_model or body.get("model"),
                **({"system_fingerprint": fingerprint} if fingerprint else {}),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "refusal": "I cannot grade this content."}
                        if "JUDGE-REFUSE" in prompt
                        else {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(content) // 4}
                if self.usage is None
                else self.usage,
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--api-key")
    parser.add_argument("--fail-all", action="store_true", help="answer every call with 503")
    parser.add_argument("--zero-embeddings", action="store_true", help="every embedding is all zeros")
    parser.add_argument("--leak-key", action="store_true", help="chat replies echo the Authorization header")
    parser.add_argument("--served-model", help="the model chat replies say served them")
    parser.add_argument("--fingerprint", help="the system_fingerprint of chat replies")
    parser.add_argument("--switch-after", type=int, help="chat calls answered before the fingerprint changes")
    parser.add_argument("--switch-fingerprint", help="the system_fingerprint after --switch-after calls")
    parser.add_argument("--version", default="1.0.0", help="the server version GET /v2 and GET /info report")
    parser.add_argument("--lenient-on", action="append", default=[], help="statements with this word are supported")
    parser.add_argument("--usage", type=json.loads, help="what chat replies give as usage (JSON)")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    Handler.delay, Handler.api_key, Handler.fail_all = args.delay_ms / 1000, args.api_key, args.fail_all
    Handler.zero_embeddings, Handler.leak_key = args.zero_embeddings, args.leak_key
    Handler.served_model, Handler.fingerprint, Handler.version = args.served_model, args.fingerprint, args.version
    Handler.switch_after, Handler.switch_fingerprint = args.switch_after, args.switch_fingerprint
    LENIENT.extend(args.lenient_on)
    Handler.usage = args.usage
    server = Backlogged(("127.0.0.1", args.port), Handler)
    scheme = maybe_tls(server, args.tls_cert, args.tls_key)
    print(f"listening on {scheme}://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
