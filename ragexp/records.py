"""The records that flow between packages: a case, what a system returned, a scored case."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import orjson


def graded_hash(answer: str, contexts: list[str]) -> str:
    """What a human label graded, as a dataset's ``human.graded`` names it: the sha256 (hex) of
    the compact, key-sorted UTF-8 JSON ``{"answer": ..., "contexts": [...]}`` of the output (the
    same bytes as Python's ``json.dumps(obj, ensure_ascii=False, sort_keys=True,
    separators=(",", ":"))``)."""
    payload = orjson.dumps({"answer": answer, "contexts": contexts}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()


@dataclass(slots=True)
class HopRetrieval:
    """One retrieval call of a system that retrieves in several steps (an agent's retriever tool
    call, a two-step pipeline's second search), in the order it was made."""

    query: str = ""
    """What the call searched for."""
    ranked_ids: list[str] = field(default_factory=list)
    """The chunk ids it retrieved, best first."""
    contexts: list[str] = field(default_factory=list)
    """Their texts, aligned with ``ranked_ids`` when both are given."""
    doc_ids: list[str] = field(default_factory=list)
    """The document each chunk comes from (empty: the system does not say)."""
    latency_seconds: float | None = None
    """Seconds the call took, where the system reports it."""
    tokens: int | None = None
    """Tokens the step used, where the system reports it."""
    cost: float | None = None
    """What the step cost, where the system reports it."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"query": self.query, "ranked_ids": self.ranked_ids, "contexts": self.contexts}
        if self.doc_ids:
            data["doc_ids"] = self.doc_ids
        for name in REPORTED:
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HopRetrieval:
        return cls(
            str(data.get("query", "")),
            list(data.get("ranked_ids", [])),
            list(data.get("contexts", [])),
            list(data.get("doc_ids", [])),
            *(data.get(name) for name in REPORTED),
        )


REPORTED = tuple(item.name for item in fields(HopRetrieval))[4:]
"""What a retrieval call may report besides its results: its seconds, tokens and cost."""


@dataclass(slots=True)
class SystemOutput:
    """What the system under test returned for one case."""

    ranked_ids: list[str] = field(default_factory=list)
    """Retrieved chunk ids, best first."""
    contexts: list[str] = field(default_factory=list)
    """Retrieved texts, aligned with ``ranked_ids`` when both are given."""
    answer: str = ""
    """The generated answer."""
    citations: list[int] = field(default_factory=list)
    """1-based indexes into ``ranked_ids``/``contexts`` that the answer cites."""
    latency_seconds: float | None = None
    """End-to-end latency of the successful call (recorded latency for replay)."""
    timings: dict[str, float] | None = None
    """Per-stage seconds reported by the system (embedding, vector, keyword, rerank, model)."""
    ttft_seconds: float | None = None
    """Time to the first non-empty piece of answer of a streamed reply (None: not streamed)."""
    doc_ids: list[str] = field(default_factory=list)
    """The document each retrieved chunk comes from, aligned with ``ranked_ids``/``contexts``
    (empty: the system does not say; an empty string: it does not say for that chunk)."""
    conversation_id: str | None = None
    """The service's id of the conversation this reply belongs to (``response.conversation_id``):
    sent with the conversation's next turn as ``{conversation_id}``."""
    stages: dict[str, dict[str, list[Any]]] | None = None
    """What each stage produced, by stage name (the names of ``timings``): ``ids`` (its order,
    best first), ``scores`` (aligned with ``ids``) and ``ids_in`` (the order it was given, for a
    reranker). Shown on the case's stage spans; None: the system reports none."""
    tokens: dict[str, int] | None = None
    """The tokens the system's model used for this reply, as it reported them (``prompt``,
    ``completion``); None: the reply reported no usage."""
    retrievals: list[HopRetrieval] | None = None
    """Each retrieval call the system made, in order (a multi-hop system's hops); None: the
    system reports a single ranking only."""
    tool_calls: list[dict[str, Any]] | None = None
    """The tool calls an agent made, in order, as ``{"name", "args"}``; None: not reported."""

    def graded_hash(self) -> str:
        """The hash a human label of this output names (:func:`graded_hash`)."""
        return graded_hash(self.answer, self.contexts)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ranked_ids": self.ranked_ids,
            "contexts": self.contexts,
            "answer": self.answer,
            "citations": self.citations,
        }
        if self.timings is not None:
            data["timings"] = self.timings
        if self.ttft_seconds is not None:
            data["ttft_seconds"] = self.ttft_seconds
        if self.doc_ids:
            data["doc_ids"] = self.doc_ids
        if self.stages is not None:
            data["stages"] = self.stages
        if self.conversation_id is not None:
            data["conversation_id"] = self.conversation_id
        if self.tokens is not None:
            data["tokens"] = self.tokens
        if self.retrievals is not None:
            data["retrievals"] = [retrieval.to_json() for retrieval in self.retrievals]
        if self.tool_calls is not None:
            data["tool_calls"] = self.tool_calls
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], latency_seconds: float | None = None) -> SystemOutput:
        """Inverse of :meth:`to_json` (for checkpoints written by this module)."""
        return cls(
            ranked_ids=list(data.get("ranked_ids", [])),
            contexts=list(data.get("contexts", [])),
            answer=str(data.get("answer", "")),
            citations=list(data.get("citations", [])),
            latency_seconds=latency_seconds,
            timings=data.get("timings"),
            ttft_seconds=data.get("ttft_seconds"),
            doc_ids=list(data.get("doc_ids", [])),
            stages=data.get("stages"),
            conversation_id=data.get("conversation_id"),
            tokens=data.get("tokens"),
            retrievals=[HopRetrieval.from_json(item) for item in data["retrievals"]] if "retrievals" in data else None,
            tool_calls=data.get("tool_calls"),
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """A piece of a document that answers a case: gold that names text, not a chunk id, so it
    survives re-chunking and re-indexing."""

    doc: str
    """The id of the document the text is in."""
    span: str
    """The text itself; for evidence given as offsets, the document's text between them (empty
    until the documents are read: see :mod:`ragexp.datasets.evidence`)."""
    start: int | None = None
    """Character offset of the span's start in the document's text, when given as offsets."""
    end: int | None = None
    """Character offset just past the span's end, when given as offsets."""

    def to_json(self) -> dict[str, Any]:
        """The form the dataset gave (``{"doc", "span"}`` or ``{"doc", "start", "end"}``), with
        the text once read for offsets: what the dataset hash covers."""
        if self.start is None:
            return {"doc": self.doc, "span": self.span}
        data: dict[str, Any] = {"doc": self.doc, "start": self.start, "end": self.end}
        if self.span:
            data["span"] = self.span
        return data


@dataclass(slots=True)
class Hop:
    """The gold of one hop of a multi-hop case: what its retrieval must find (ids or evidence,
    as a case's ``relevant_ids`` or ``relevant``), and the bridge entity it hands to the next hop."""

    relevant_ids: list[str] = field(default_factory=list)
    relevant: list[Evidence] = field(default_factory=list)
    bridge: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"relevant": self.relevant_ids or [evidence.to_json() for evidence in self.relevant]}
        if self.bridge is not None:
            data["bridge"] = self.bridge
        return data


@dataclass(slots=True)
class Case:
    """One evaluation case: inputs and labels, plus a recorded output for replay."""

    id: str
    question: str
    relevant_ids: list[str]
    expected_facts: list[str]
    reference: str | None
    unanswerable: bool
    line: int
    """1-based line of the case in its file (the first line for the column format)."""
    recorded: SystemOutput | None = None
    recorded_fields: frozenset[str] = frozenset()
    """Which recorded output fields the file gave for this case."""
    human: dict[str, float] = field(default_factory=dict)
    """Human scores of this case's answer, by canonical metric name (judge calibration)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The case's free-form ``metadata`` object: its fields fill request templates."""
    draft: str | None = None
    """``draft.status`` of a drafted case (``draft`` or ``screened``); None for a case not drafted."""
    relevant: list[Evidence] = field(default_factory=list)
    """Gold anchored to documents (the ``relevant`` field), for a case that gives it instead of
    ``relevant_ids``: retrieved chunks are matched to it by document and text."""
    conversation: str | None = None
    """The id of the conversation this case is a turn of (``conv-7`` for ``conv-7#2``); None for a
    single question."""
    turn: int = 0
    """The turn's 1-based position in its conversation (0 for a single question)."""
    history: list[dict[str, str]] | None = None
    """The earlier turns as ``{"role", "content"}`` messages, set when the turn is asked (see
    :mod:`ragexp.conversations`); None for a single question."""
    conversation_ref: str | None = None
    """The service's own id of the conversation, read from the previous turn's reply
    (``response.conversation_id``); None on a first turn or for a service that gives none."""
    graded: str | None = None
    """What the ``human`` scores graded: the :func:`graded_hash` of that output (``human.graded``,
    else the case's recorded output); None when the case says not, so its scores grade nothing
    a run can be shown to have answered."""
    graded_given: bool = False
    """``human.graded`` was written in the file (it then enters the dataset hash with the scores)."""
    hops: list[Hop] = field(default_factory=list)
    """The gold of each hop, in order, for a multi-hop case (``hops``); the case's own gold is
    their union. Empty for a single-hop case."""

    def labels(self, *, human: bool = True) -> dict[str, Any]:
        """Inputs and labels only: what the dataset hash covers (human scores when present, so
        a set without them keeps the hash it had before they existed)."""
        labels: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "relevant_ids": self.relevant_ids,
            "expected_facts": self.expected_facts,
            "reference": self.reference,
            "unanswerable": self.unanswerable,
        }
        if human and self.human:
            labels["human"] = {**self.human, "graded": self.graded} if self.graded_given else self.human
        if self.relevant:
            labels["relevant"] = [evidence.to_json() for evidence in self.relevant]
        if self.conversation is not None:
            labels["conversation"] = self.conversation
            labels["turn"] = self.turn
        if self.hops:
            labels["hops"] = [hop.to_json() for hop in self.hops]
        return labels


@dataclass(slots=True)
class CaseResult:
    """A case after the system call: its output or the reason it failed."""

    case_id: str
    output: SystemOutput | None
    error: str | None = None
    metric_errors: dict[str, str] = field(default_factory=dict)
    """Metric name -> why that metric could not be computed for this case."""
    retryable: bool = False
    """The system call failed at the transport level (refused, timed out, 5xx after retries):
    the failure says nothing about the case, and ``--resume`` asks again."""
    rationale: dict[str, str] = field(default_factory=dict)
    """Metric name -> why the case got its score, where the metric says (a rubric's judge, a
    function of the user's returning ``{"score", "rationale"}``)."""
    rationale_codes: Mapping[str, Any] | None = None
    """Metric name -> the code its offline rationale was written from
    (:mod:`ragexp.metrics.wording`), which renders it in another language; None: no offline rationale."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.output is not None


SPAN_TEXT_CHARS = 20_000
"""Answers, questions and contexts are cut to this inside spans: a 1 MB answer stays in
cases.jsonl, never in the trace store."""


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit} more characters in cases.jsonl]"


def case_expectations(case: Case) -> dict[str, Any]:
    """The case's labels under MLflow's expectation names: its trace's expectations, and what an
    MLflow scorer used as a metric of the user's gets as ``expectations``."""
    expected: dict[str, Any] = {}
    if case.expected_facts:
        expected["expected_facts"] = list(case.expected_facts)
    if case.reference:
        expected["expected_response"] = case.reference
    if case.relevant_ids:
        expected["relevant_ids"] = list(case.relevant_ids)
    if case.relevant:
        expected["relevant"] = [{"doc": item.doc, "span": cut(item.span, SPAN_TEXT_CHARS)} for item in case.relevant]
    expected["unanswerable"] = case.unanswerable
    return expected
