"""What each case's MLflow trace shows, built from a scored run (plain data, no mlflow).

This module decides the content: which cases get a trace (all of them up to
``tracking.traces_max_cases``, beyond it the errored and imperfect ones), which assessments each
carries, so that the MLflow UI's per-metric averages over a run's traces equal ragexp's summary,
and each trace's plan (:func:`plan_trace`: its spans, previews and assessments), which
:mod:`ragexp.tracking.traces` writes into a store.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp import limits
from ragexp.metrics.population import covered
from ragexp.metrics.registry import MetricSpec, hop_of
from ragexp.records import SPAN_TEXT_CHARS, Case, CaseResult, SystemOutput, case_expectations, cut

TRACE_NAME = "rag_case"
SOURCE_ID = "ragexp"
CASE_METADATA = "ragexp.case_id"
"""Trace metadata key holding the whole case id."""
SESSION_METADATA = "mlflow.trace.session"
"""Trace metadata key MLflow groups a session's traces by: the run and the turn's conversation
(:func:`session_id`)."""
OUTSIDE_METADATA = "ragexp.outside_mean"
"""Trace metadata key of an unanswerable case: its own row's scores on the metrics whose run mean
leaves it out, and the rule that scored them (no assessment carries them: the UI's mean of a
metric's assessments is the run's)."""


def session_id(run_id: str, conversation: str) -> str:
    """A conversation's MLflow session in one run: the same conversation run twice in one
    experiment is two sessions, each showing that run's turns only."""
    return f"{conversation}@{run_id}"


PREVIEW_CHARS = limits.PREVIEW.chars
"""Request/response previews (the text the UI lists and pairs rows by) are cut to this."""
SPAN_ITEMS = 100
"""Ids a stage span lists (the rest are in cases.jsonl)."""
HISTORY_CHARS = SPAN_TEXT_CHARS
"""Characters of a turn's history its trace shows, the latest messages first (see :func:`_history`)."""
RETRIEVE = "retrieve"
"""The retriever span, and the stage detail whose scores its documents carry."""


@dataclass(slots=True)
class FeedbackRecord:
    """One metric of one case: a value, or the reason there is none."""

    name: str
    value: float | None
    error: str | None = None
    judge: str | None = None
    """Judge identity for LLM-judge metrics (None: computed by code)."""
    rationale: str | None = None


@dataclass(slots=True)
class CaseTrace:
    """Everything a case's trace shows, as plain data."""

    case_id: str
    question: str
    answer: str | None
    error: str | None
    latency_seconds: float | None
    ranked_ids: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    expectations: dict[str, Any] = field(default_factory=dict)
    feedback: list[FeedbackRecord] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    """The document of each retrieved chunk, when the system named it (the documents' ``doc_uri``)."""
    stages: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    """What each stage produced (``SystemOutput.stages``), shown on its span."""
    language: str = "en"
    """The run's ``report.language``: the words of the response preview a reviewer reads."""
    session: str | None = None
    """The conversation the case is a turn of: the trace's ``mlflow.trace.session``, so MLflow's
    session view groups a conversation's turns (None: a single question)."""
    history: list[dict[str, str]] | None = None
    """The turns before this one as ``{"role", "content"}`` messages, shown on the root span."""
    outside: dict[str, float] = field(default_factory=dict)
    """An unanswerable case's own row scores on metrics whose run mean leaves it out (the trace's
    ``ragexp.outside_mean`` metadata, never an assessment)."""
    hops: list[dict[str, Any]] = field(default_factory=list)
    """Each retrieval call of a multi-hop system, in order: ``query``, ``ranked_ids``,
    ``contexts``, ``doc_ids``, the hop's ``gold`` and its ``assessments`` (per-hop metric ->
    ``{"value", "rationale"}``), shown as a span per hop."""


def request_preview(case_id: str, question: str) -> str:
    """The trace's request as the UI shows it. The Evaluation-runs comparison pairs the rows of
    two runs by this exact string, so it starts with the case id (unique, and kept whole)."""
    return fit_json({"case_id": cut(case_id, 200)}, "question", question)


def fit_json(fixed: dict[str, str], key: str, text: str, limit: int = PREVIEW_CHARS) -> str:
    """``{**fixed, key: text}`` as JSON of at most ``limit`` characters (the store's preview
    columns hold 1,000), ``text`` cut as needed, then the ``fixed`` values if they alone are too
    long; always valid JSON: what is cut is the text, never its escaped form."""

    def encoded(values: dict[str, str], chars: int) -> str:
        return json.dumps({**values, key: cut(text, chars)}, ensure_ascii=False)

    whole = encoded(fixed, len(text))
    if len(whole) <= limit:
        return whole
    chars = _most(len(text), lambda n: len(encoded(fixed, n)) <= limit)
    if chars is not None:
        return encoded(fixed, chars)
    longest = max((len(v) for v in fixed.values()), default=0)
    each = _most(longest, lambda n: len(encoded({k: cut(v, n) for k, v in fixed.items()}, 0)) <= limit) or 0
    return encoded({k: cut(v, each) for k, v in fixed.items()}, 0)


def _most(top: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in 0..top with ``fits(n)`` (which holds up to some n, then no more); None if
    not even 0 fits."""
    if not fits(0):
        return None
    low, high = 0, top
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


REVIEW_ANSWER_CHARS = 400
REVIEW_EXPECTED_CHARS = 200
REVIEW_CONTEXT_CHARS = 160


def review_preview(case: CaseTrace, limit: int = PREVIEW_CHARS) -> str:
    """The trace's response as the MLflow UI shows it, in its Review page above all: the answer,
    then what the case expected (its facts, its reference, or a refusal) and the contexts the
    system retrieved, as Markdown, which the page renders (JSON it shows raw). Every value from
    data is escaped (:func:`ragexp.escape.markdown`); at most ``limit`` characters (the store's
    preview column): the answer first, then the expectations, then as many contexts as fit."""
    from ragexp.escape import markdown
    from ragexp.phrases import t

    language = case.language
    parts = [markdown(cut(case.answer or "", REVIEW_ANSWER_CHARS)) or f"*({t('review_no_answer', language)})*"]
    expected = case.expectations
    if expected.get("unanswerable"):
        parts.append(f"**{t('review_expected', language)}**: {t('review_refusal', language)}")
    if expected.get("expected_facts"):
        facts = " · ".join(markdown(str(fact)) for fact in expected["expected_facts"])
        parts.append(f"**{t('review_facts', language)}**: {cut(facts, REVIEW_EXPECTED_CHARS)}")
    if expected.get("expected_response"):
        reference = markdown(cut(str(expected["expected_response"]), REVIEW_EXPECTED_CHARS))
        parts.append(f"**{t('review_reference', language)}**: {reference}")
    text = "\n\n---\n\n".join([parts[0], "\n\n".join(parts[1:])]) if len(parts) > 1 else parts[0]
    if case.ranked_ids:
        heading = f"\n\n**{t('review_contexts', language, n=len(case.ranked_ids))}**\n"
        if len(text) + len(heading) < limit:
            text += heading
            for rank, doc_id in enumerate(case.ranked_ids, 1):
                context = case.contexts[rank - 1] if rank - 1 < len(case.contexts) else ""
                item = f"\n{rank}. {markdown(doc_id, code=True)} {markdown(cut(context, REVIEW_CONTEXT_CHARS))}"
                if len(text) + len(item) > limit:
                    break
                text += item
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(slots=True)
class PlannedSpan:
    name: str
    kind: str
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    inputs: Any
    outputs: Any
    error: str | None


@dataclass(slots=True)
class Mark:
    """An assessment before it becomes an MLflow entity or a row."""

    kind: str
    """``feedback`` or ``expectation``."""
    name: str
    value: Any
    error: str | None
    source_type: str
    source_id: str
    rationale: str | None = None
    assessment_id: str = field(default_factory=lambda: f"a-{uuid.uuid4().hex}")
    """Chosen here, not by the store: a request sent again after a lost answer then updates the
    same assessments instead of adding copies."""


@dataclass(slots=True)
class PlannedTrace:
    trace_id: str
    otel_trace_id: int
    case: CaseTrace
    start_ns: int
    duration_ns: int
    request_preview: str
    response_preview: str
    spans: list[PlannedSpan]
    marks: list[Mark]


@dataclass
class TracePlan:
    traces: list[CaseTrace]
    case_count: int
    capped: bool
    """True when only the errored and imperfect cases got a trace."""


def outside_mean(scores: dict[str, float], language: str) -> str:
    """The ``ragexp.outside_mean`` metadata of an unanswerable case: its row's scores on the
    metrics averaged over the answerable cases, then the rule that scored them."""
    from ragexp.phrases import t

    rule = t("unanswerable_row", language if language in ("en", "zh") else "en")
    values = ", ".join(f"{name} {value:g}" for name, value in scores.items())
    return f"{values}: {rule}"


def select_cases(
    specs: Sequence[MetricSpec], scores: dict[str, np.ndarray], errored: np.ndarray, cap: int
) -> tuple[np.ndarray, bool]:
    """Indexes of the cases that get a trace, and whether the cap cut them down.

    Within the cap every case is traced. Beyond it, the cases a user looks at when something
    regressed: errored ones first, then those with any metric short of its best value.
    """
    n = errored.size
    if n <= cap:
        return np.arange(n), False
    imperfect = np.zeros(n, dtype=bool)
    for spec in specs:
        values = scores.get(spec.name)
        if values is None:
            continue
        best = spec.high if spec.direction == "higher" else spec.low
        if best is None:
            continue
        finite = np.isfinite(values)
        imperfect |= finite & (values < best if spec.direction == "higher" else values > best)
    chosen = np.concatenate([np.flatnonzero(errored), np.flatnonzero(imperfect & ~errored)])
    return np.sort(chosen[:cap]), True


def build_traces(
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    specs: Sequence[MetricSpec],
    scores: dict[str, np.ndarray],
    latency: np.ndarray,
    errored: np.ndarray,
    *,
    judge: str,
    cap: int,
    language: str = "en",
    histories: Sequence[list[dict[str, str]] | None] | None = None,
) -> TracePlan:
    """One :class:`CaseTrace` per selected case.

    A metric with a score is a feedback value; a metric that could not be computed (the case's
    system call failed, or the metric itself failed) is a feedback carrying the error, never a
    value. An unanswerable case has no assessment of a metric averaged over the answerable cases
    (:mod:`ragexp.metrics.population`), so the mean of a metric's assessments is the run's value;
    its own row's score stays in ``cases.jsonl`` and the trace's ``ragexp.outside_mean`` metadata.
    """
    unanswerable = np.fromiter((case.unanswerable for case in cases), dtype=bool, count=len(cases))
    per_case = [spec for spec in specs if spec.per_case and spec.name in scores]
    outside = {spec.name: ~covered(spec, unanswerable) for spec in per_case}
    chosen, capped = select_cases(specs, scores, errored, cap)
    traces: list[CaseTrace] = []
    for index in chosen.tolist():
        case, result = cases[index], results[index]
        output = result.output
        feedback: list[FeedbackRecord] = []
        left_out: dict[str, float] = {}
        for spec in per_case:
            value = float(scores[spec.name][index])
            source = judge if spec.judge else None
            if value == value and outside[spec.name][index]:
                # Outside the metric's run mean: no assessment (the UI averages every assessment
                # of a name), the row's score on the trace's metadata instead.
                left_out[spec.name] = value
                continue
            if value == value:
                said = result.rationale.get(spec.name)
                feedback.append(FeedbackRecord(spec.name, value, judge=source, rationale=said))
                continue
            reason = result.metric_errors.get(spec.name) or (f"case error: {result.error}" if result.error else None)
            if reason is not None:
                feedback.append(FeedbackRecord(spec.name, None, error=reason, judge=source))
        seconds = float(latency[index]) if latency[index] == latency[index] else None
        traces.append(
            CaseTrace(
                case_id=case.id,
                question=case.question,
                answer=output.answer if output is not None else None,
                error=result.error if not result.ok else None,
                latency_seconds=seconds,
                ranked_ids=list(output.ranked_ids) if output is not None else [],
                contexts=list(output.contexts) if output is not None else [],
                timings=dict(output.timings or {}) if output is not None else {},
                expectations=case_expectations(case),
                feedback=feedback,
                doc_ids=list(output.doc_ids) if output is not None else [],
                stages=dict(output.stages or {}) if output is not None else {},
                language=language,
                session=case.conversation,
                history=histories[index] if histories is not None else None,
                outside=left_out,
                hops=_hops(case, output, feedback),
            )
        )
    return TracePlan(traces, len(cases), capped)


def _hops(case: Case, output: SystemOutput | None, feedback: Sequence[FeedbackRecord]) -> list[dict[str, Any]]:
    """What each hop's span shows: its call, its gold, and its metrics' assessments."""
    if output is None or not output.retrievals:
        return []
    hops = []
    for position, retrieval in enumerate(output.retrievals, start=1):
        gold = case.hops[position - 1] if position <= len(case.hops) else None
        marks = {
            record.name: {"value": record.value, "rationale": record.rationale, "error": record.error}
            for record in feedback
            if (found := hop_of(record.name)) is not None and found[1] == position
        }
        hops.append(
            {
                **retrieval.to_json(),
                "gold": gold.to_json() if gold is not None else None,
                "assessments": marks,
            }
        )
    return hops


def plan_traces(cases: Sequence[CaseTrace], sessions: dict[str, int]) -> list[PlannedTrace]:
    """The traces of ``cases``, in order. MLflow lists a session's traces by their millisecond
    timestamp, so each turn of a conversation starts at least a millisecond after the turn
    before it (``sessions``: each session's last start, in ms, kept across batches)."""
    planned = []
    for case in cases:
        start_ns = time.time_ns()
        if case.session is not None:
            start_ns = max(start_ns, (sessions.get(case.session, -1) + 1) * 1_000_000)
            sessions[case.session] = start_ns // 1_000_000
        planned.append(plan_trace(case, start_ns))
    return planned


def plan_trace(case: CaseTrace, start_ns: int | None = None) -> PlannedTrace:
    otel_trace_id = uuid.uuid4().int
    start_ns = time.time_ns() if start_ns is None else start_ns
    duration_ns = int((case.latency_seconds or 0.0) * 1e9) or sum(int(s * 1e9) for s in case.timings.values())
    marks = [Mark("expectation", name, value, None, "HUMAN", "dataset") for name, value in case.expectations.items()]
    for item in case.feedback:
        source_type, source_id = ("LLM_JUDGE", item.judge) if item.judge is not None else ("CODE", SOURCE_ID)
        source_id = limits.shortened(limits.ASSESSMENT_SOURCE_ID, source_id)
        error = cut(item.error, 2000) if item.error is not None else None
        # A judge's text goes into a text column as it is: PostgreSQL refuses a NUL in it.
        rationale = limits.fit(limits.TEXT, item.rationale) if item.rationale is not None else None
        marks.append(Mark("feedback", item.name, item.value, error, source_type, source_id, rationale))
    response = fit_json({}, "error", case.error) if case.error is not None else review_preview(case)
    return PlannedTrace(
        trace_id=f"tr-{otel_trace_id:032x}",
        otel_trace_id=otel_trace_id,
        case=case,
        start_ns=start_ns,
        duration_ns=duration_ns,
        request_preview=request_preview(case.case_id, case.question),
        response_preview=response,
        spans=_case_spans(case, start_ns, duration_ns),
        marks=marks,
    )


def _history(messages: Sequence[dict[str, str]]) -> dict[str, Any]:
    """A turn's history as its trace shows it: the latest messages within ``HISTORY_CHARS`` (the
    newest one cut to fit when it alone is longer), and how many earlier ones are left out.
    The earlier turns are traces of their own in the conversation's session, so a trace need
    not repeat them all: a conversation's traces grow with its turns, not with their square."""
    kept: list[dict[str, str]] = []
    left = HISTORY_CHARS
    for message in reversed(messages[-SPAN_ITEMS:]):
        if left <= 0:
            break
        content = cut(message["content"], min(left, SPAN_TEXT_CHARS))
        kept.append({"role": message["role"], "content": content})
        left -= len(content)
    found: dict[str, Any] = {"history": kept[::-1]}
    if len(kept) < len(messages):
        found["history_left_out"] = len(messages) - len(kept)
    return found


def _case_spans(case: CaseTrace, start_ns: int, duration_ns: int) -> list[PlannedSpan]:
    """Root span (request -> answer), a retriever span with the ranked documents (and their
    retrieval scores when the system gave them), and one span per stage the system timed or
    described, laid end to end so the timeline shows where the time went; a stage span carries
    what the stage produced (its ranked ids with their scores; a reranker's order in, too)."""
    root_id = _span_id()
    error = case.error
    root_inputs: dict[str, Any] = {"case_id": case.case_id, "question": cut(case.question, SPAN_TEXT_CHARS)}
    if case.history is not None:
        root_inputs.update(_history(case.history))
    root_outputs: Any = {"error": cut(error, SPAN_TEXT_CHARS)} if error else cut(case.answer or "", SPAN_TEXT_CHARS)
    end_ns = start_ns + max(duration_ns, 1)
    spans = [PlannedSpan(TRACE_NAME, "CHAIN", root_id, None, start_ns, end_ns, root_inputs, root_outputs, error)]
    if error is not None:
        return spans
    scores = _retrieval_scores(case)
    # A system that returns texts without ids (evidence is matched by text) still shows them.
    ids = case.ranked_ids or [""] * len(case.contexts)
    documents = [
        {
            "id": doc_id,
            "page_content": cut(case.contexts[i], SPAN_TEXT_CHARS) if i < len(case.contexts) else "",
            "metadata": {
                "doc_uri": case.doc_ids[i] if i < len(case.doc_ids) and case.doc_ids[i] else doc_id,
                "chunk_id": doc_id,
                "rank": i + 1,
                **({"score": scores[i]} if scores is not None and i < len(scores) else {}),
            },
        }
        for i, doc_id in enumerate(ids)
    ]
    described = [stage for stage in case.stages if stage != RETRIEVE and stage not in case.timings]
    stages = [*case.timings, *described]
    retrieval_stages = [stage for stage in stages if stage != "model"]
    retrieve_ns = sum(int(case.timings.get(s, 0.0) * 1e9) for s in retrieval_stages) or max(duration_ns // 2, 1)
    retriever_id = _span_id()
    query = {"query": cut(case.question, SPAN_TEXT_CHARS)}
    spans.append(
        PlannedSpan(
            RETRIEVE, "RETRIEVER", retriever_id, root_id, start_ns, start_ns + retrieve_ns, query, documents, None
        )
    )
    cursor = start_ns
    for stage in stages:
        seconds = case.timings.get(stage)
        stage_ns = max(int((seconds or 0.0) * 1e9), 1)
        parent = retriever_id if stage in retrieval_stages else root_id
        kind = "LLM" if stage == "model" else ("EMBEDDING" if "embed" in stage else "UNKNOWN")
        inputs, outputs = _stage_detail(case.stages.get(stage), seconds)
        spans.append(PlannedSpan(stage, kind, _span_id(), parent, cursor, cursor + stage_ns, inputs, outputs, None))
        cursor += stage_ns
    spans.extend(_hop_spans(case, root_id, start_ns, retrieve_ns))
    return spans


def _hop_spans(case: CaseTrace, root_id: int, start_ns: int, retrieve_ns: int) -> list[PlannedSpan]:
    """A span per hop of a multi-hop system (its query and gold in, its metrics' assessments
    out), each with a retriever span of the documents the call returned, laid one after another
    over the retrieval's time."""
    spans: list[PlannedSpan] = []
    if not case.hops:
        return spans
    step = max(retrieve_ns // len(case.hops), 1)
    for position, hop in enumerate(case.hops, start=1):
        begin = start_ns + (position - 1) * step
        seconds = hop.get("latency_seconds")
        end = begin + (max(int(seconds * 1e9), 1) if seconds is not None else step)
        hop_id = _span_id()
        inputs = {"hop": position, "query": cut(hop["query"], SPAN_TEXT_CHARS), "gold": hop["gold"]}
        spans.append(
            PlannedSpan(f"hop {position}", "CHAIN", hop_id, root_id, begin, end, inputs, hop["assessments"], None)
        )
        ids = hop["ranked_ids"] or [""] * len(hop["contexts"])
        docs = hop.get("doc_ids") or []
        documents = [
            {
                "id": doc_id,
                "page_content": cut(hop["contexts"][i], SPAN_TEXT_CHARS) if i < len(hop["contexts"]) else "",
                "metadata": {
                    "doc_uri": docs[i] if i < len(docs) and docs[i] else doc_id,
                    "rank": i + 1,
                },
            }
            for i, doc_id in enumerate(ids[:SPAN_ITEMS])
        ]
        query = {"query": cut(hop["query"], SPAN_TEXT_CHARS)}
        spans.append(
            PlannedSpan(
                f"{RETRIEVE} (hop {position})", "RETRIEVER", _span_id(), hop_id, begin, end, query, documents, None
            )
        )
    return spans


def _retrieval_scores(case: CaseTrace) -> list[Any] | None:
    """The scores of the ranked documents, when the ``retrieve`` stage gave them for these ids."""
    detail = case.stages.get(RETRIEVE) or {}
    scores, ids = detail.get("scores"), detail.get("ids")
    if scores is None or ids != case.ranked_ids:
        return None
    return scores


def _stage_detail(detail: dict[str, list[Any]] | None, seconds: float | None) -> tuple[Any, dict[str, Any]]:
    """A stage span's inputs (the order it was given) and outputs (its seconds, and what it
    ranked: each id with its rank and score), the lists cut to :data:`SPAN_ITEMS`."""
    outputs: dict[str, Any] = {} if seconds is None else {"seconds": seconds}
    if not detail:
        return None, outputs
    ids, scores = detail.get("ids") or [], detail.get("scores")
    if ids:
        outputs["ranked"] = [
            {"rank": rank, "id": doc_id, **({"score": scores[rank - 1]} if scores is not None else {})}
            for rank, doc_id in enumerate(ids[:SPAN_ITEMS], start=1)
        ]
        if len(ids) > SPAN_ITEMS:
            outputs["more"] = f"{len(ids) - SPAN_ITEMS} more in cases.jsonl"
    given = detail.get("ids_in")
    inputs = {"ids": given[:SPAN_ITEMS]} if given else None
    return inputs, outputs


def _span_id() -> int:
    return int.from_bytes(os.urandom(8), "big") or 1
