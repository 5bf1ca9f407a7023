"""Two-step pipelines over the bundled kb_zh_hops knowledge base, with planted faults.

``two_step`` finds the product the question names (hop 1), reads its maker from the product's
page (the bridge), and finds the maker's page (hop 2): every hop's gold is retrieved.
``hop2_fault``'s second retrieval ignores the bridge (it searches for the question again);
``hop1_fault``'s first retrieval misses the product (it returns other products), so the bridge it
reads is wrong too. Each returns its calls as ``retrievals`` (ragexp's contract), and a
``query -> calls`` log lets a test recompute the scores directly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOCS_FILE = Path(__file__).resolve().parents[2] / "ragexp" / "data" / "kb_zh_hops" / "docs.jsonl"
DOCS: list[dict[str, str]] = [json.loads(line) for line in DOCS_FILE.read_text(encoding="utf-8").splitlines()]
MAKER = re.compile(r"由(.+?)生产")
CALLS: dict[str, list[dict[str, Any]]] = {}
"""Question -> the retrieval calls returned for it (the last pipeline that answered it)."""


def _call(query: str, docs: list[dict[str, str]], k: int) -> dict[str, Any]:
    chosen = docs[:k]
    return {
        "query": query,
        "ranked_ids": [doc["id"] for doc in chosen],
        "contexts": [doc["text"] for doc in chosen],
        "doc_ids": [doc["id"] for doc in chosen],
        "latency_seconds": 0.01 * len(query),
    }


def _named(text: str) -> list[dict[str, str]]:
    """The documents whose title the text names, then the rest in file order."""
    hits = [doc for doc in DOCS if doc["title"] and doc["title"] in text]
    return hits + [doc for doc in DOCS if doc not in hits]


def _answer(question: str, k: int, *, fault: str | None) -> dict[str, Any]:
    first_docs = _named(question)
    if fault == "hop1":  # misses the named product: other products' pages first
        first_docs = [doc for doc in first_docs[1:] if doc["id"].startswith("product-")]
    first = _call(question, first_docs, k)
    found = MAKER.search(first["contexts"][0]) if first["contexts"] else None
    bridge = found.group(1) if found else ""
    query = question if fault == "hop2" else bridge
    second = _call(query, _named(query), k)
    CALLS[question] = [first, second]
    answer = second["contexts"][0] if second["contexts"] else ""
    return {"answer": answer, "retrievals": [first, second]}


def two_step(question: str, k: int) -> dict[str, Any]:
    return _answer(question, k, fault=None)


def hop2_fault(question: str, k: int) -> dict[str, Any]:
    return _answer(question, k, fault="hop2")


def hop1_fault(question: str, k: int) -> dict[str, Any]:
    return _answer(question, k, fault="hop1")


def calls_unreported_for_some(question: str, k: int) -> dict[str, Any]:
    """``two_step``, but the reply of every question naming a 笔 (pen, brush) omits its calls."""
    reply = _answer(question, k, fault=None)
    if "笔" in question:
        first, second = reply.pop("retrievals")
        reply["ranked_ids"] = second["ranked_ids"] + first["ranked_ids"]
        reply["contexts"] = second["contexts"] + first["contexts"]
        reply["doc_ids"] = second["doc_ids"] + first["doc_ids"]
    return reply
