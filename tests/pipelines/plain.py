"""Plain and async functions in the shapes teams write them."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

from pydantic import BaseModel

from tests.pipelines.corpus import DOCS, retrieve

CALLS: dict[str, dict[str, Any]] = {}
"""Case id -> the arguments the last call received (the tests read what ragexp passed)."""


def contract(question: str, k: int, case_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """ragexp's own contract, every keyword ragexp offers."""
    CALLS[case_id] = {"question": question, "k": k, "case_id": case_id, "metadata": metadata}
    ranked = retrieve(question, k)
    return {
        "ranked_ids": ranked,
        "contexts": [DOCS[doc_id] for doc_id in ranked],
        "answer": DOCS[ranked[0]] + " [1]",
        "citations": [1],
        "timings": {"retrieve": 0.001},
    }


@dataclasses.dataclass
class Hit:
    doc_id: str
    text: str


@dataclasses.dataclass
class Answer:
    text: str
    hits: list[Hit]


def positional(query):  # type: ignore[no-untyped-def]  # one unannotated parameter, as in a notebook
    """One positional parameter that is none of ragexp's names: it gets the question."""
    CALLS[query] = {"query": query}
    return Answer(DOCS[retrieve(query)[0]], [Hit(doc_id, DOCS[doc_id]) for doc_id in retrieve(query)])


def templated(payload: dict[str, Any], *, top: int = 2) -> dict[str, Any]:
    """Takes one request object (the rendered ``input`` template)."""
    CALLS[payload["case"]] = {"payload": payload}
    ranked = retrieve(payload["query"], payload["n"])
    return {"result": {"text": DOCS[ranked[0]], "sources": [{"id": d, "body": DOCS[d]} for d in ranked]}}


class Reply(BaseModel):
    answer: str
    ids: list[str]
    passages: list[str]


async def asynchronous(question: str, k: int) -> Reply:
    await asyncio.sleep(0.01)
    ranked = retrieve(question, k)
    return Reply(answer=DOCS[ranked[0]], ids=ranked, passages=[DOCS[d] for d in ranked])


def failing(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        raise PermissionError("upstream refused token sk-live-0123456789 for " + question)
    return contract(question, 2, case_id, {})


def slow(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        time.sleep(3)
    return contract(question, 2, case_id, {})


def forever(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        threading.Event().wait()  # never returns
    return contract(question, 2, case_id, {})


async def forever_async(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        while True:  # swallows every cancellation: only abandoning it ends the run
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                continue
    return contract(question, 2, case_id, {})


def wrong_type(question: str) -> dict[str, Any]:
    return {"answer": "ok", "ranked_ids": "d1", "contexts": [], "citations": []}


def two_required(question: str, top_n: int, mode: str) -> dict[str, Any]:
    return {}


NOT_CALLABLE = {"answer": "a dict, not a function"}


async def blocking_async(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        time.sleep(8)  # blocks the event loop: nothing else can run on it meanwhile
    return contract(question, 2, case_id, {})


def long_failure(question: str, case_id: str) -> dict[str, Any]:
    if case_id == "password":
        raise ValueError("upstream said: " + "y" * 20_000)
    return contract(question, 2, case_id, {})
