"""The judge's HTTP side: chat completions and embeddings behind one limit on calls in flight.

ragas metrics talk to an ``InstructorBaseRagasLLM`` and a ``BaseRagasEmbedding``. Both are
implemented here directly over httpx rather than through the OpenAI SDK and instructor: the
client CPU per call is what bounds throughput on a small machine, and this way one place owns
retries, timeouts, the concurrency bound across all cases and metrics, and token accounting.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import ssl
import threading
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from ragas.embeddings.base import BaseRagasEmbedding
from ragas.llms.base import InstructorBaseRagasLLM

from ragexp.config.models import JudgeConfig
from ragexp.metrics.judge import identity
from ragexp.metrics.judge.usage import Usage
from ragexp.secrets import mask_url, scrub, without_userinfo
from ragexp.transport import BadReply, CallFailed, CallPolicy, post_json

Model = TypeVar("Model", bound=BaseModel)
FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
PARSE_ATTEMPTS = 2
REFUSAL_CHARS = 300
"""How much of a judge's refusal a case's error quotes."""
CHAT_USAGE = ("prompt_tokens", "completion_tokens")
"""The counts an OpenAI-compatible chat reply's ``usage`` gives; one missing leaves its tokens unknown."""
EMBEDDINGS_USAGE = ("prompt_tokens",)
"""The count an OpenAI-compatible embeddings reply's ``usage`` gives (TEI's ``/embed`` reports none)."""
"""A reply that does not match the output schema is asked again once (as instructor does)."""


class JudgeCallError(Exception):
    """A judge call failed for good (after retries); the message is the reason, free of secrets."""

    def __init__(self, reason: str) -> None:
        super().__init__(scrub(reason))


class JudgeUnreachable(JudgeCallError):
    """Nothing answered at the transport level."""


class JudgeHTTP:
    """A pool of ``concurrency`` keep-alive clients: taking one is the limit on calls in flight."""

    def __init__(self, config: JudgeConfig, api_key: str | None, verify: ssl.SSLContext) -> None:
        self.config = config
        self.usage = Usage()
        self.policy = CallPolicy(config.timeout_s, config.max_retries, 0.5, config.max_response_bytes)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._verify = verify
        self._pool: asyncio.Queue[httpx.AsyncClient] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.server_parts: dict[str, str] = {}
        """Channel (``chat``, ``embed``) -> what the server's own metadata says it is (MindIE, TEI)."""

    async def __aenter__(self) -> JudgeHTTP:
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self._pool = asyncio.Queue()
        for _ in range(self.config.concurrency):
            self._pool.put_nowait(
                httpx.AsyncClient(
                    timeout=httpx.Timeout(self.config.timeout_s),
                    verify=self._verify,
                    headers=self._headers,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                    trust_env=False,
                )
            )
        await self._server_metadata()
        return self

    async def _server_metadata(self) -> None:
        """MindIE's version and TEI's model revision, where their APIs give them: asked once, and a
        server that does not answer is simply not named (the replies' own ``model`` still is)."""
        assert self._pool is not None
        asks = []
        if self.config.kind == "mindie" and self.config.base_url:
            root = without_userinfo(self.config.base_url).rstrip("/").removesuffix("/v1")
            asks.append(("chat", root + "/v2", identity.of_mindie))
        if self.config.embeddings.kind == "tei" and self.config.embeddings.url:
            asks.append(("embed", without_userinfo(self.config.embeddings.url).rstrip("/") + "/info", identity.of_tei))
        if not asks:
            return
        client = await self._pool.get()
        try:
            for channel, url, read in asks:
                try:
                    reply = await client.get(url, timeout=min(self.config.timeout_s, 10.0))
                    found = read(reply.json()) if reply.status_code == 200 else ""
                except (httpx.HTTPError, ValueError):
                    found = ""
                if found:
                    self.server_parts[channel] = found
        finally:
            self._pool.put_nowait(client)

    async def __aexit__(self, *exc: object) -> None:
        assert self._pool is not None
        while not self._pool.empty():
            await self._pool.get_nowait().aclose()

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        """POST JSON under the shared call policy; returns the parsed reply."""
        assert self._pool is not None, "use JudgeHTTP as an async context manager"
        if self._headers:  # the API key wins over user:password in the URL (preflight said so)
            url = without_userinfo(url)
        client = await self._pool.get()
        try:
            reply = await post_json(client, url, body, self.policy)
        except CallFailed as exc:
            self.usage.failed_calls += 1
            if exc.transport:
                self.usage.transport_failures += 1
                raise JudgeUnreachable(f"{exc} ({mask_url(url)})") from None
            if isinstance(exc, BadReply):
                raise JudgeCallError(f"judge reply from {mask_url(url)}: {exc}") from None
            raise JudgeCallError(f"{exc} from {mask_url(url)}") from None
        finally:
            self._pool.put_nowait(client)
        self.usage.successes += 1
        chat = url.endswith("/chat/completions")
        identity.note(identity.of_reply("chat" if chat else "embeddings", reply.data))
        identity.note(self.server_parts.get("chat" if chat else "embed", ""))
        return reply.data


class JudgeLLM(InstructorBaseRagasLLM):
    """Chat completions in JSON mode, parsed into the metric's output model."""

    def __init__(self, http: JudgeHTTP, config: JudgeConfig, json_mode: bool) -> None:
        self.http = http
        self.config = config
        self.json_mode = json_mode
        self.url = (config.base_url or "").rstrip("/") + "/chat/completions"

    def generate(self, prompt: str, response_model: type[Model]) -> Model:
        raise TypeError("the ragexp judge is asynchronous: use agenerate")

    async def agenerate(self, prompt: str, response_model: type[Model]) -> Model:
        # As instructor's JSON mode does: the schema goes in a system message, since not every
        # ragas prompt (the translation one, for one) spells it out.
        system = _schema_message(response_model)
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        problem = ""
        for _ in range(PARSE_ATTEMPTS):
            data = await self.http.post(self.url, body)
            self.http.usage.chat_calls += 1
            self.http.usage.count(data.get("usage") if isinstance(data, dict) else None, CHAT_USAGE)
            try:
                content = data["choices"][0]["message"]["content"]
                return response_model.model_validate_json(_json_text(content))
            except (KeyError, IndexError, TypeError):
                problem = _refusal(data) or "the reply has no choices[0].message.content"
            except ValidationError as exc:
                problem = f"the reply does not match {response_model.__name__} ({exc.errors()[0]['msg']})"
            if len(body["messages"]) == 2:
                body["messages"] = [
                    *body["messages"],
                    {"role": "user", "content": "Reply with one JSON object that follows the schema exactly."},
                ]
        raise JudgeCallError(f"judge output unusable: {problem}")


def _refusal(data: Any) -> str | None:
    """What the judge said when it refused (an OpenAI-compatible ``message.refusal``), if it did."""
    try:
        said = data["choices"][0]["message"]["refusal"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(said, str) or not said.strip():
        return None
    return "the judge refused: " + scrub(" ".join(said.split()))[:REFUSAL_CHARS]


def _json_text(content: str) -> str:
    """The JSON object in a reply, without Markdown fences or prose around it."""
    fenced = FENCE.search(content)
    if fenced:
        content = fenced.group(1)
    start, end = content.find("{"), content.rfind("}")
    if start == -1 or end < start:
        return content
    return content[start : end + 1]


class JudgeEmbeddings(BaseRagasEmbedding):
    """OpenAI-compatible ``/embeddings`` or TEI ``/embed``, through the same pool and limit.

    ragas' SemanticSimilarity calls the synchronous ``embed_text`` inside a coroutine; ragexp
    runs that metric in a worker thread, and the synchronous call here hands the request to the
    event loop's pool and waits for it, so it neither blocks the loop nor escapes the limit.
    """

    def __init__(self, http: JudgeHTTP, config: JudgeConfig) -> None:
        super().__init__()
        self.http = http
        self.config = config
        base = (config.embeddings.url or "").rstrip("/")
        self.url = base + ("/embed" if config.embeddings.kind == "tei" else "/embeddings")

    def embed_text(self, text: str, **kwargs: Any) -> list[float]:
        loop = self.http.loop
        if loop is None or threading.get_ident() == self.http.loop_thread:
            raise RuntimeError("embed_text must be called from a worker thread while the judge loop runs")
        return asyncio.run_coroutine_threadsafe(self.aembed_text(text), loop).result()

    async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
        return (await self._embed([text]))[0]

    async def aembed_texts(self, texts: list[str], **kwargs: Any) -> list[list[float]]:
        return await self._embed(list(texts))

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        if self.config.embeddings.kind == "tei":
            data = await self.http.post(self.url, {"inputs": texts, "truncate": True})
            vectors = data
        else:
            data = await self.http.post(self.url, {"model": self.config.embeddings.model, "input": texts})
            items = data.get("data") if isinstance(data, dict) else None
            vectors = [item.get("embedding") for item in sorted(items or [], key=lambda item: item.get("index", 0))]
            self.http.usage.count(data.get("usage") if isinstance(data, dict) else None, EMBEDDINGS_USAGE)
        self.http.usage.embedding_calls += 1
        if (
            not isinstance(vectors, list)
            or len(vectors) != len(texts)
            or not all(isinstance(v, list) and v and all(isinstance(x, int | float) for x in v) for v in vectors)
        ):
            raise JudgeCallError(f"embeddings reply from {mask_url(self.url)} is not {len(texts)} vector(s)")
        floats = [[float(x) for x in v] for v in vectors]
        for vector in floats:
            # A zero or non-finite vector has no direction: cosine similarity would be NaN (and numpy
            # would print a RuntimeWarning), so the metric fails for this case instead.
            if not all(math.isfinite(x) for x in vector) or not any(vector):
                raise JudgeCallError(
                    f"embeddings reply from {mask_url(self.url)} holds an all-zero or non-finite vector"
                )
        return floats


@functools.cache
def _schema_message(response_model: type[BaseModel]) -> str:
    """The system message naming a reply model's JSON schema, built once per model: pydantic
    builds a schema anew on every call, which a drafting or judging pass makes thousands of times."""
    schema = json.dumps(response_model.model_json_schema(), ensure_ascii=False)
    return "Answer with one JSON object (not the schema itself) that matches this json_schema:\n" + schema
