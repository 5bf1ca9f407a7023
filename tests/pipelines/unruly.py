"""Targets that misbehave the ways user code does: exceptions that cannot be printed or are not
Exceptions, generators returned instead of answers, numpy numbers, and print calls (at import
and on every call) with terminal escapes in them. The case "password" misbehaves; the others get
ragexp's own contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from tests.pipelines.corpus import DOCS, retrieve

print("\x1b[2Jloading unruly pipeline \x1b[31mred\x1b[0m")  # at import, as notebooks and libraries do


def answer(question: str, k: int = 2) -> dict[str, Any]:
    ranked = retrieve(question, k)
    return {"ranked_ids": ranked, "contexts": [DOCS[d] for d in ranked], "answer": DOCS[ranked[0]], "citations": [1]}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("even the message fails")


class NotAnException(BaseException):
    """What some libraries raise to unwind (gevent's GreenletExit, trio's Cancelled)."""


RAISED: dict[str, BaseException] = {
    "unprintable": Unprintable(),
    "interrupt": KeyboardInterrupt(),
    "exit": SystemExit(3),
    "base": NotAnException("unwound"),
}


def raising(question: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """Raises what the case's ``metadata.raise`` names (nothing when it names nothing)."""
    if metadata.get("raise") in RAISED:
        raise RAISED[metadata["raise"]]
    return answer(question)


async def raising_async(question: str, metadata: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return raising(question, metadata)


async def _pieces() -> AsyncIterator[str]:
    yield "Passwords"


def streaming(question: str, metadata: dict[str, Any]) -> Any:
    """Returns what the case's ``metadata.returns`` names: a generator (a chain's stream() instead
    of its invoke()), an iterator, an async generator; else the answer."""
    returns = metadata.get("returns")
    if returns == "generator":
        return (piece for piece in DOCS["d3"].split())
    if returns == "iterator":
        return iter([answer(question)])
    if returns == "async generator":
        return _pieces()
    return answer(question)


def with_numpy(question: str) -> dict[str, Any]:
    """Timings and scores as numpy computes them (np.float32 is not a Python float)."""
    reply = answer(question)
    scores = np.array([0.9, 0.4], dtype=np.float32)[: len(reply["ranked_ids"])]
    reply["timings"] = {"retrieve": np.float32(0.25), "rerank": np.float64(0.125), "model": np.int64(1)}
    reply["stages"] = {"retrieve": {"ids": list(reply["ranked_ids"]), "scores": list(scores)}}
    return reply


def noisy(question: str, case_id: str) -> dict[str, Any]:
    print(f"\x1b]8;;http://evil.example/\x1b\\answering {case_id}\x1b]8;;\x1b\\")
    print("no newline yet", end="")
    print(" ... done")
    return answer(question)
