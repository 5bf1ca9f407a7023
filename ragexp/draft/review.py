"""Screening drafted cases in an MLflow review queue: ``ragexp draft review`` and ``ragexp draft accept``.

``draft review`` logs a run in the experiment :data:`EXPERIMENT` holding the draft file as an
artifact and one trace per case still ``draft.status: draft`` (the question, the source chunks as
retrieved documents, the reference as the answer, the facts, reference and kind as expectations,
the case id in the trace metadata), and a review queue over those traces asking two questions:
keep this case? (pass/fail) and what is wrong? (free text), in the draft's language.

``draft accept`` reads the reviewers' answers (HUMAN feedback named after the questions, newest
first): a kept case becomes ``draft.status: screened`` with ``draft.reviewer`` and
``draft.reviewed_at``, a rejected one is dropped, and a case nobody answered yet stays
``draft.status: draft`` in the output, so a later ``draft accept`` after more reviewing finishes it
and nothing drafted is lost (``ragexp run`` refuses those until they are screened).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexp import artifacts
from ragexp.errors import ConfigError, DatasetError, DatasetErrors, TrackingError
from ragexp.labels import answers as reviewed
from ragexp.labels.queue import PASS_FAIL, check_queue_name
from ragexp.tracking import review_queues as review
from ragexp.tracking.store import TAG_PREFIX, tag_filter

if TYPE_CHECKING:
    from ragexp.draft.corpus import Chunk
    from ragexp.tracking.store import Store

EXPERIMENT = "ragexp-draft-review"
"""The experiment holding every review of drafted cases (apart from the runs' own experiments)."""
ARTIFACT = artifacts.DRAFT
"""The draft file as it was queued, kept on the review run: ``draft accept`` rebuilds the cases from it."""
KEEP = "draft_keep"
"""Label schema: keep this case? (pass/fail)."""
PROBLEM = "draft_problem"
"""Label schema: what is wrong? (free text)."""
QUEUE_TAG = TAG_PREFIX + review.LABEL_TAG
INSTRUCTIONS = {
    KEEP: {
        "zh": "这条起草的样本能否进入评测集？问题清楚、期望事实确实出现在来源片段中、参考答案正确"
        "（不可回答样本：语料确实没有答案）时选通过。",
        "en": "Keep this drafted case in the evaluation set? Pass when the question is clear, every expected fact "
        "is in the source chunks and the reference is right (unanswerable: the corpus really has no answer).",
    },
    PROBLEM: {
        "zh": "有什么问题？（可选：写明哪条事实或问题不对）",
        "en": "What is wrong? (optional: which fact or part of the question is wrong)",
    },
}
CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass
class ReviewQueue:
    """What ``ragexp draft review`` made."""

    experiment_id: str
    run_id: str
    queue_id: str
    queue: str
    traces: int
    passed_through: int
    """Cases of the file not queued (already screened, or not drafted)."""
    language: str

    def url(self, base: str | None) -> str | None:
        """The queue on the MLflow UI's Review page (None without a known UI address)."""
        return reviewed.queue_url(base, self.experiment_id, self.queue_id)

    def to_json(self, base: str | None) -> dict[str, Any]:
        return {
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "queue_id": self.queue_id,
            "queue": self.queue,
            "traces": self.traces,
            "passed_through": self.passed_through,
            "language": self.language,
            "url": self.url(base),
        }


@dataclass
class Accepted:
    """What ``ragexp draft accept`` decided."""

    cases: list[dict[str, Any]]
    """The output: accepted (screened), not yet reviewed (still draft) and passed-through cases, in file order."""
    accepted: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    """``{"id", "problem"}`` of each dropped case."""
    pending: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": len(self.rejected),
            "not_reviewed": self.pending,
            "written": len(self.cases),
            "rejected_cases": self.rejected,
        }


def read_draft(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, case) of every case of a draft file the loader accepts (its errors, one line each)."""
    from ragexp.datasets.loader import load_dataset

    load_dataset(path)
    rows = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text.strip():
            rows.append((number, json.loads(text)))
    return rows


def language_of(cases: list[dict[str, Any]]) -> str:
    """``zh`` when the questions are written in Chinese characters, else ``en``."""
    text = "".join(str(case.get("question", "")) for case in cases)
    return "zh" if len(CJK.findall(text)) * 4 >= len(text) > 0 else "en"


def _pending(case: dict[str, Any]) -> bool:
    draft = case.get("draft")
    return isinstance(draft, dict) and draft.get("status") == "draft"


def case_trace(case: dict[str, Any], chunks: dict[str, Chunk]) -> Any:
    from ragexp.case_traces import CaseTrace

    draft = case["draft"]
    sources = [str(source) for source in draft.get("source_ids") or case.get("relevant_ids") or []]
    expectations: dict[str, Any] = {"draft_kind": draft.get("kind", "")}
    if case.get("expected_facts"):
        expectations["expected_facts"] = case["expected_facts"]
    if case.get("reference"):
        expectations["reference"] = case["reference"]
    if case.get("unanswerable"):
        expectations["unanswerable"] = True
    return CaseTrace(
        case_id=str(case["id"]),
        question=str(case["question"]),
        answer=str(case.get("reference") or ""),
        error=None,
        latency_seconds=None,
        ranked_ids=sources,
        contexts=[chunks[source].text for source in sources],
        expectations=expectations,
    )


def create_review(store: Store, path: Path, corpus: list[Chunk], queue: str | None = None) -> ReviewQueue:
    """A review run with the draft file and one trace per unscreened case, and a review queue over them."""
    from ragexp.tracking.traces import TraceWriter

    rows = read_draft(path)
    chunks = {chunk.id: chunk for chunk in corpus}
    pending = [(line, case) for line, case in rows if _pending(case)]
    if not pending:
        raise ConfigError(f"draft review {path}: no case is still draft.status 'draft': nothing to screen")
    problems = []
    for line, case in pending:
        sources = case["draft"].get("source_ids") or case.get("relevant_ids") or []
        for source in sources:
            if str(source) not in chunks:
                problems.append(
                    DatasetError(str(path), line, "draft.source_ids", f"chunk {source!r} is not in --corpus")
                )
    if problems:
        raise DatasetErrors(problems)
    if queue is not None:
        check_queue_name(queue)
    label_schemas, review_queues = review.api()
    cases = [case for _, case in pending]
    language = language_of(cases)
    experiment_id = store.experiment_id(EXPERIMENT, create=True)
    assert experiment_id is not None  # create=True always returns an id
    if queue is not None:
        with review.calls(store, f"reading the review queues of {EXPERIMENT}"):
            if _queue_named(review_queues, experiment_id, queue) is not None:
                raise ConfigError(
                    f"--queue {queue!r}: a review queue of that name exists in {EXPERIMENT}: give another"
                )
    run_id = store.create_run(EXPERIMENT, f"review {path.name}", {TAG_PREFIX + "draft_file": str(path)}, {})
    name = queue if queue is not None else f"draft {path.name[:200]} {run_id[:8]}"
    try:
        store.log_files(run_id, {ARTIFACT: path.read_bytes()})
        writer = TraceWriter(store, experiment_id, run_id)
        writer.write([case_trace(case, chunks) for case in cases])
        order = {str(case["id"]): i for i, case in enumerate(cases)}
        infos = writer.infos()
        infos.sort(key=lambda info: order.get(reviewed.case_id(info) or "", len(order)))
        ids = [info.trace_id for info in infos]
        with review.calls(store, f"creating the review queue of {path}"):
            schema_ids = _ensure_schemas(label_schemas, experiment_id, language)
            made = review_queues.create_review_queue(
                name, queue_type="custom", schema_ids=schema_ids, experiment_id=experiment_id
            )
            for start in range(0, len(ids), 100):
                review_queues.add_items_to_review_queue(made.queue_id, item_ids=ids[start : start + 100])
        store.set_tags(run_id, {QUEUE_TAG: made.queue_id})
    except BaseException:
        # An unfinished review is marked so in the UI; ``draft accept`` never finds it (no queue tag).
        store.end_run(run_id, "FAILED")
        raise
    store.end_run(run_id, "FINISHED")
    return ReviewQueue(experiment_id, run_id, made.queue_id, name, len(ids), len(rows) - len(pending), language)


def _ensure_schemas(label_schemas: Any, experiment_id: str, language: str) -> list[str]:
    found = {schema.name: schema for schema in review.label_schemas_of(label_schemas, experiment_id)}
    ids = []
    for name in (KEEP, PROBLEM):
        schema = found.get(name)
        if schema is None:
            if name == KEEP:
                positive, negative = PASS_FAIL[language]
                given = label_schemas.InputPassFail(positive_label=positive, negative_label=negative)
            else:
                given = label_schemas.InputText()
            schema = label_schemas.create_label_schema(
                name,
                type="feedback",
                input=given,
                instruction=INSTRUCTIONS[name][language],
                enable_comment=name == KEEP,
                experiment_id=experiment_id,
            )
        ids.append(schema.schema_id)
    return ids


def _queue_named(review_queues: Any, experiment_id: str, name: str) -> Any:
    token = None
    while True:
        page = review_queues.list_review_queues(experiment_id=experiment_id, max_results=100, page_token=token)
        for item in page:
            if name in (item.name, item.queue_id):
                return item
        token = page.token
        if not token or not page:
            return None


def accept(store: Store, queue: str) -> Accepted:
    """The draft file of the review behind ``queue`` (its name or id) with the reviewers' decisions applied."""
    from ragexp.tracking.store import RunRecord

    experiment_id = store.experiment_id(EXPERIMENT, create=False)
    if experiment_id is None:
        raise TrackingError(f"draft accept {queue!r}: no draft review in {store.uri} (run ragexp draft review first)")
    _, review_queues = review.api()
    with review.calls(store, f"reading review queue {queue!r}"):
        found = _queue_named(review_queues, experiment_id, queue)
    if found is None:
        raise TrackingError(f"draft accept {queue!r}: no review queue of that name or id in experiment {EXPERIMENT}")
    with store.calling(f"finding the review run of queue {queue!r}"):
        runs = store.client.search_runs([experiment_id], filter_string=tag_filter(QUEUE_TAG, found.queue_id))
    if not runs:
        raise TrackingError(f"draft accept {queue!r}: the queue was not made by ragexp draft review (no review run)")
    run_id = runs[0].info.run_id
    record: RunRecord = store.get_run(run_id)
    text = store.read_artifact(run_id, ARTIFACT).decode("utf-8")
    cases = [json.loads(line) for line in text.splitlines() if line.strip()]
    answers = {reviewed.case_id(info): reviewed.human_feedback(info) for info in review.run_traces(store, record)}
    result = Accepted(cases=[])
    for case in cases:
        if not _pending(case) or str(case["id"]) not in answers:
            result.cases.append(case)
            continue
        labels = answers[str(case["id"])]
        decision = _decision(labels.get(KEEP, []))
        if decision is None:
            result.pending += 1
            result.cases.append(case)
            continue
        keep, label = decision
        problem = next((str(item.value) for item in labels.get(PROBLEM, []) if str(item.value).strip()), None)
        if not keep:
            result.rejected.append({"id": str(case["id"]), "problem": problem or ""})
            continue
        result.accepted += 1
        when = datetime.fromtimestamp(label.time_ms / 1000, UTC).isoformat(timespec="seconds")
        screened = {**case["draft"], "status": "screened", "reviewer": label.source_id, "reviewed_at": when}
        if problem is not None:
            screened["review_note"] = problem
        result.cases.append({**case, "draft": screened})
    return result


def _decision(labels: list[reviewed.HumanLabel]) -> tuple[bool, reviewed.HumanLabel] | None:
    """The newest pass/fail answer (a changed answer, or a later reviewer, decides)."""
    for label in labels:
        score = reviewed.as_score(label.value)
        if score in (0.0, 1.0):
            return score == 1.0, label
    return None
