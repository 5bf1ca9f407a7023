"""Label audit: check a dataset's labels against the corpus they point at.

When a system fails a case, the label may be what is wrong (the RAG evaluation article's example: "退款多久到账"
labelled with the fact "七天", the application deadline, not the arrival time). These checks find
the labels that cannot be right as written, with file and line, so a person looks at them:

- ``missing_id``: a relevant id that is not in the corpus;
- ``fact_not_in_relevant``: an expected fact written in none of the case's relevant chunks (for
  evidence: in none of its spans);
- ``conflicting_labels``: the same question (after normalisation) labelled differently;
- ``empty_relevant``: an answerable case whose relevant chunks have no text.

Findings are warnings: the labels may be deliberate (a fact paraphrased in the chunk). Facts are
matched like ``answer_accuracy`` matches them: NFKC, case-folded, as substrings.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import orjson

from ragexp.datasets.loader import Dataset
from ragexp.errors import DatasetError, DatasetErrors
from ragexp.metrics.offline import normalize

MAX_ERRORS = 50


@dataclass(frozen=True)
class Finding:
    """One label that looks wrong."""

    path: str
    line: int
    case_id: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: case '{self.case_id}': {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "id": self.case_id, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Corpus:
    """A chunk file: ``{"id", "text", "doc"?}`` per line. A row with ``doc`` is a chunk of that
    document; a row without it is a whole document (its id is the document's)."""

    path: Path
    texts: dict[str, str]
    """Chunk id -> text, in file order."""
    docs: dict[str, str]
    """Chunk id -> document id, for the rows that give ``doc``."""

    def doc_of(self, chunk_id: str) -> str:
        return self.docs.get(chunk_id, chunk_id)


def load_corpus(path: Path) -> dict[str, str]:
    """``{"id", "text"}`` per line (other keys such as ``title`` are allowed) -> id: text."""
    return load_chunks(path).texts


def load_chunks(path: Path) -> Corpus:
    """The corpus with each chunk's document; bad input is a DatasetErrors naming line and field."""
    name = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetErrors([DatasetError(name, None, None, f"cannot read corpus: {exc.strerror}")]) from None
    errors: list[DatasetError] = []
    corpus: dict[str, str] = {}
    docs: dict[str, str] = {}
    first: dict[str, int] = {}
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetErrors([DatasetError(name, line, None, "not valid UTF-8")]) from None
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip() or len(errors) >= MAX_ERRORS:
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            errors.append(DatasetError(name, number, None, f"invalid JSON ({str(exc).split(':')[0]})"))
            continue
        if not isinstance(row, dict):
            errors.append(DatasetError(name, number, None, "expected a JSON object with 'id' and 'text'"))
            continue
        chunk_id, body, doc = row.get("id"), row.get("text"), row.get("doc")
        if not isinstance(chunk_id, str) or not chunk_id.strip():
            errors.append(DatasetError(name, number, "id", "required: a non-empty string"))
        elif not isinstance(body, str):
            errors.append(DatasetError(name, number, "text", "required: a string"))
        elif doc is not None and (not isinstance(doc, str) or not doc.strip()):
            errors.append(DatasetError(name, number, "doc", "the chunk's document id: a non-empty string"))
        elif chunk_id in first:
            errors.append(
                DatasetError(name, number, "id", f"duplicate id {chunk_id!r} (first on line {first[chunk_id]})")
            )
        else:
            first[chunk_id] = number
            corpus[chunk_id] = body
            if doc is not None:
                docs[chunk_id] = doc
    if not corpus and not errors:
        errors.append(DatasetError(name, None, None, "empty corpus: no chunks"))
    if errors:
        raise DatasetErrors(errors)
    return Corpus(path, corpus, docs)


def shares_ids(dataset: Dataset, corpus: dict[str, str]) -> bool:
    """False when the dataset has relevant ids and not one of them is in the corpus: a corpus
    of another dataset (e.g. a ``dataset.path`` override under a group that names a corpus)."""
    # Looked up one by one in C, stopping at the first shared id, rather than first building a
    # set of every relevant id of the dataset (hundreds of thousands in a large set).
    relevant = list(map(_RELEVANT, dataset.cases))
    return not any(relevant) or not corpus.keys().isdisjoint(chain.from_iterable(relevant))


_RELEVANT = attrgetter("relevant_ids")


def audit(dataset: Dataset, corpus: dict[str, str]) -> list[Finding]:
    """Every finding, in file order."""
    path = str(dataset.path)
    findings: list[Finding] = []
    normalized = {chunk_id: normalize(text) for chunk_id, text in corpus.items()}
    for case in dataset.cases:

        def add(kind: str, message: str, case_id: str = case.id, line: int = case.line) -> None:
            findings.append(Finding(path, line, case_id, kind, message))

        if case.relevant:  # evidence: its facts should be in its spans, whatever the corpus
            spans = [normalize(item.span) for item in case.relevant]
            for fact in case.expected_facts:
                if not any(normalize(fact) in span for span in spans):
                    add(
                        "fact_not_in_relevant",
                        f"expected fact '{fact}' appears in none of its evidence spans: is the fact, or the span, "
                        "the right one?",
                    )
            continue
        present = [chunk_id for chunk_id in case.relevant_ids if chunk_id in corpus]
        for chunk_id in case.relevant_ids:
            if chunk_id not in corpus:
                add("missing_id", f"relevant id '{chunk_id}' is not in the corpus")
        if not case.unanswerable and case.relevant_ids and present and not any(corpus[c].strip() for c in present):
            add("empty_relevant", f"answerable, but its relevant chunks ({', '.join(present)}) have no text")
            continue
        if not present:
            continue
        for fact in case.expected_facts:
            needle = normalize(fact)
            if not any(needle in normalized[chunk_id] for chunk_id in present):
                add(
                    "fact_not_in_relevant",
                    f"expected fact '{fact}' appears in none of its relevant chunks ({', '.join(present)}): "
                    "is the fact, or the chunk, the right one?",
                )
    findings.extend(_conflicts(dataset, path))
    findings.sort(key=lambda finding: finding.line)
    return findings


def _conflicts(dataset: Dataset, path: str) -> list[Finding]:
    """Cases asking the same question with different labels (each after the first is reported)."""
    first: dict[str, Any] = {}
    found = []
    for case in dataset.cases:
        key = "".join(normalize(case.question).split())
        evidence = tuple(sorted((item.doc, item.span) for item in case.relevant))
        labels = (case.unanswerable, tuple(sorted(case.relevant_ids)), tuple(sorted(case.expected_facts)), evidence)
        if key not in first:
            first[key] = (case, labels)
            continue
        earlier, earlier_labels = first[key]
        if labels != earlier_labels:
            what = [
                name
                for name, a, b in zip(
                    ("unanswerable", "relevant_ids", "expected_facts", "relevant"), labels, earlier_labels, strict=True
                )
                if a != b
            ]
            found.append(
                Finding(
                    path,
                    case.line,
                    case.id,
                    "conflicting_labels",
                    f"same question as case '{earlier.id}' (line {earlier.line}) but different {', '.join(what)}",
                )
            )
    return found
