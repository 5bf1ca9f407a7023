"""Reading a multi-hop system's retrieval calls from its reply (``response.retrievals``), or an
agent's from the messages it exchanged with its retriever tool (``response.tool_calls`` and
``response.retriever_tool``): pure, no I/O.

A retrieval is ``{"query", "ranked_ids" | "ids", "contexts", "doc_ids", "latency_seconds",
"tokens", "cost"}`` (all optional but one of ``ranked_ids`` and ``contexts``). An agent's
messages (LangChain's, taken apart by :func:`ragexp.providers.expressions.to_plain`) are read
call by call: each call of the retriever tool an AI message makes (``tool_calls[]``: ``name``,
``args``, ``id``) is paired with the tool message that answered it (``tool_call_id``); its
documents are the tool message's ``artifact`` (``create_retriever_tool`` returns the Documents
there), else its ``content`` split as the tool joined them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ragexp.metrics.cost import COST
from ragexp.metrics.registry import RETRIEVALS
from ragexp.records import HopRetrieval

QUERY_ARGS = ("query", "question", "input", "q")
"""The argument of a retriever tool call that holds what it searched for, first found wins."""
CONTENT_SEPARATOR = "\n\n"
"""How ``create_retriever_tool`` joins its documents' texts in the tool message's content."""


class HopReadError(ValueError):
    """A retrieval or tool call in the reply that cannot be read: an error for that case."""


def read_retrievals(value: Any, where: str) -> list[HopRetrieval]:
    """The retrieval calls a ``response.retrievals`` expression found (a list of objects)."""
    if not isinstance(value, list):
        raise HopReadError(f"{where} gave {type(value).__name__}, not a list of retrievals")
    return [_retrieval(item, f"{where}[{index}]") for index, item in enumerate(value)]


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise HopReadError(f"{where} is {type(value).__name__}, not a list")
    out: list[str] = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            out.append(str(item))
        else:
            raise HopReadError(f"{where} holds {type(item).__name__}, not a string")
    return out


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise HopReadError(f"{where} is {value!r}, not a non-negative number")
    return float(value)


def _retrieval(item: Any, where: str) -> HopRetrieval:
    if not isinstance(item, Mapping):
        raise HopReadError(f"{where} is {type(item).__name__}, not an object")
    ranked = _strings(item.get("ranked_ids", item.get("ids")), f"{where}.ranked_ids")
    contexts = _strings(item.get("contexts"), f"{where}.contexts")
    doc_ids = _strings(item.get("doc_ids"), f"{where}.doc_ids")
    if ranked and contexts and len(ranked) != len(contexts):
        raise HopReadError(f"{where}: {len(ranked)} ranked_ids but {len(contexts)} contexts")
    query = item.get("query")
    tokens = _number(item.get("tokens"), f"{where}.tokens")
    return HopRetrieval(
        query if isinstance(query, str) else "" if query is None else str(query),
        ranked,
        contexts,
        doc_ids if any(doc_ids) else [],
        _number(item.get("latency_seconds"), f"{where}.latency_seconds"),
        int(tokens) if tokens is not None else None,
        _number(item.get(COST), f"{where}.{COST}"),
    )


def agent_calls(messages: Any, tool: str | None, where: str) -> tuple[list[dict[str, Any]], list[HopRetrieval]]:
    """Every tool call in an agent's ``messages`` (``{"name", "args"}``, in order) and, of the
    calls of ``tool``, the retrievals they returned."""
    if not isinstance(messages, list):
        raise HopReadError(f"{where} gave {type(messages).__name__}, not a list of messages")
    answers: dict[str, Mapping[str, Any]] = {}
    for message in messages:
        if isinstance(message, Mapping) and message.get("tool_call_id"):
            answers[str(message["tool_call_id"])] = message
    calls: list[dict[str, Any]] = []
    retrievals: list[HopRetrieval] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            name, args = str(call.get("name", "")), call.get("args") or {}
            calls.append({"name": name, "args": args})
            if tool is not None and name != tool:
                continue
            answer = answers.get(str(call.get("id")))
            if answer is None:
                if tool is None:
                    continue
                raise HopReadError(f"{where}: the call {len(calls)} of {tool!r} has no tool message answering it")
            if tool is None and not _documents(answer.get("artifact")):
                continue  # no retriever named: a tool is one when its message carries documents
            retrievals.append(_tool_retrieval(args, answer))
    return calls, retrievals


def _documents(value: Any) -> bool:
    """A tool message's artifact is a list of documents (``page_content`` each)."""
    return isinstance(value, list) and all(isinstance(doc, Mapping) and "page_content" in doc for doc in value)


def _tool_retrieval(args: Any, answer: Mapping[str, Any]) -> HopRetrieval:
    query = next((str(args[key]) for key in QUERY_ARGS if isinstance(args, Mapping) and key in args), "")
    documents = answer.get("artifact")
    if isinstance(documents, list) and _documents(documents):
        ranked: list[str] = []
        contexts: list[str] = []
        doc_ids: list[str] = []
        for doc in documents:
            metadata = doc.get("metadata") or {}
            ranked.append(str(doc.get("id") or metadata.get("id") or ""))
            contexts.append(str(doc.get("page_content", "")))
            doc_ids.append(str(metadata.get("doc_id") or metadata.get("source") or ""))
        return HopRetrieval(query, ranked if all(ranked) else [], contexts, doc_ids if any(doc_ids) else [])
    content = answer.get("content")
    texts = [text for text in content.split(CONTENT_SEPARATOR) if text] if isinstance(content, str) else []
    return HopRetrieval(query, [], texts)


def merged(retrievals: list[HopRetrieval]) -> tuple[list[str], list[str], list[str]]:
    """One ranking from every call's, in call order, each chunk once: the case's ``ranked_ids``,
    ``contexts`` and ``doc_ids`` for a system that gives only its calls."""
    seen: set[tuple[str, str]] = set()
    ranked: list[str] = []
    contexts: list[str] = []
    doc_ids: list[str] = []
    with_ids = all(retrieval.ranked_ids for retrieval in retrievals)
    with_texts = all(retrieval.contexts for retrieval in retrievals)
    with_docs = all(retrieval.doc_ids for retrieval in retrievals)
    for retrieval in retrievals:
        size = max(len(retrieval.ranked_ids), len(retrieval.contexts))
        for position in range(size):
            item = retrieval.ranked_ids[position] if position < len(retrieval.ranked_ids) else ""
            text = retrieval.contexts[position] if position < len(retrieval.contexts) else ""
            key = (item, "" if item else text)
            if key in seen:
                continue
            seen.add(key)
            if with_ids:
                ranked.append(item)
            if with_texts:
                contexts.append(text)
            if with_docs:
                doc_ids.append(retrieval.doc_ids[position] if position < len(retrieval.doc_ids) else "")
    return ranked, contexts, doc_ids


def hop_fields(expressions: Mapping[str, Any]) -> set[str]:
    """The output fields a mapping gives for a multi-hop system: its retrieval calls, from
    ``response.retrievals`` or from an agent's calls of its retriever tool."""
    if "retrievals" in expressions or "tool_calls" in expressions:
        # A reply without a ranking of its own gets its calls' (with_merged).
        return {RETRIEVALS, "retrieved_ids", "retrieved_contexts"}
    return set()


def read_calls(
    found: Mapping[str, Any], mapping: Any, where: str
) -> tuple[list[dict[str, Any]] | None, list[HopRetrieval] | None]:
    """The tool calls and retrieval calls of one reply, from what ``response.tool_calls`` and
    ``response.retrievals`` found (None: not reported). Raises :class:`HopReadError` on what
    cannot be read."""
    calls: list[dict[str, Any]] | None = None
    retrievals: list[HopRetrieval] | None = None
    if found.get("tool_calls") is not None:
        calls, from_tool = agent_calls(found["tool_calls"], mapping.retriever_tool, f"tool_calls in {where}")
        retrievals = from_tool
    # Nothing found is no error here: the case reported no calls, which the per-hop metrics
    # count as an error for that case (never as a hop that retrieved nothing).
    if found.get("retrievals") is not None:
        retrievals = read_retrievals(found["retrievals"], "retrievals")
    return calls, retrievals


def with_merged(found: Mapping[str, Any], retrievals: list[HopRetrieval] | None) -> Mapping[str, Any]:
    """``found``, and for a reply that gives only its calls (no ranking of its own), their merged
    ranking as the case's ``ranked_ids``, ``contexts`` and ``doc_ids``."""
    if not retrievals or found.get("ranked_ids") is not None or found.get("contexts") is not None:
        return found
    ranked, contexts, doc_ids = merged(retrievals)
    return {**found, "ranked_ids": ranked or None, "contexts": contexts or None, "doc_ids": doc_ids or None}
