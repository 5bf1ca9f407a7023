"""Evidence anchored to documents (a case's ``relevant``): checked against the documents it names,
its offsets read, its identity fixed; and chunk-id gold turned into evidence (``validate --anchor``,
``ragexp draft``).

The documents are the rows of a corpus file (``dataset.corpus``, ``--corpus``): a row without
``doc`` is a whole document, a row with ``doc`` a chunk of that document. A span must be written
in its document as it is (in a chunk of it, for a document given only as chunks); offsets need the
document's whole text.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ragexp.datasets.audit import Corpus
from ragexp.datasets.loader import MAX_ERRORS, Dataset, dataset_hash, load_dataset
from ragexp.errors import DatasetError, DatasetErrors
from ragexp.metrics.evidence import DefaultRule, Rule
from ragexp.metrics.offline import normalize
from ragexp.records import Case, Evidence

SENTENCE = re.compile(r"(?:[^。！？!?；;\n.]|\.(?=\S))+(?:[。！？!?；;]+|\.|(?=\n)|$)")
"""A sentence: up to and including its end mark (a full stop before white space for Latin text)
or the end of its line."""


def match_view(rule: Rule) -> dict[str, Any]:
    """The match rule as it enters the dataset hash."""
    return {"min_chunk_chars": rule.min_chunk_chars, "min_overlap": rule.min_overlap, "same_doc": rule.same_doc}


def resolve_evidence(dataset: Dataset, corpus: Corpus | None, rule: Rule, *, corpus_key: str) -> Dataset:
    """``dataset`` with every case's evidence checked against ``corpus`` (when there is one), its
    offsets read into text, and hashes that cover the evidence and the match rule. Raises
    :class:`DatasetErrors` naming file, line and field of every piece that cannot be right;
    ``corpus_key`` names where the documents come from (``dataset.corpus``, ``--corpus``)."""
    if not dataset.has_evidence:
        return dataset
    problems: list[DatasetError] = []
    path = str(dataset.path)
    documents = _Documents(corpus) if corpus is not None else None
    cases: list[Case] = []
    for case in dataset.cases:
        if not case.relevant:
            cases.append(case)
            continue
        resolved: list[Evidence] = []
        for index, item in enumerate(case.relevant):
            at = f"relevant[{index}]"

            def refuse(field: str, reason: str, line: int = case.line) -> None:
                if len(problems) < MAX_ERRORS:
                    problems.append(DatasetError(path, line, field, reason))

            if documents is None:
                if item.start is not None:
                    refuse(f"{at}.start", f"offsets need the documents' text: set {corpus_key} to the documents file")
                resolved.append(item)
                continue
            reason = documents.unknown(item.doc)
            if reason is not None:
                refuse(f"{at}.doc", reason)
                continue
            if item.start is not None and item.end is not None:
                text = documents.whole.get(item.doc)
                if text is None:
                    refuse(
                        f"{at}.start",
                        f"document {item.doc!r} is only given as chunks in {documents.path}: "
                        "offsets need its whole text",
                    )
                elif item.end > len(text):
                    refuse(f"{at}.end", f"{item.end} is past the end of document {item.doc!r} ({len(text)} characters)")
                elif not text[item.start : item.end].strip():
                    refuse(at, f"characters {item.start}-{item.end} of document {item.doc!r} are only white space")
                else:
                    resolved.append(dataclasses.replace(item, span=text[item.start : item.end]))
                continue
            reason = documents.not_verbatim(item.doc, item.span)
            if reason is not None:
                refuse(f"{at}.span", reason)
            resolved.append(item)
        if case.hops and len(resolved) == len(case.relevant):
            read = dict(zip(case.relevant, resolved, strict=True))
            hops = [dataclasses.replace(hop, relevant=[read.get(e, e) for e in hop.relevant]) for hop in case.hops]
            cases.append(dataclasses.replace(case, relevant=resolved, hops=hops))
            continue
        cases.append(dataclasses.replace(case, relevant=resolved))
    if problems:
        raise DatasetErrors(problems)
    view = orjson.dumps(match_view(rule), option=orjson.OPT_SORT_KEYS)
    labelled = _with_rule(dataset_hash(cases), view)
    human = any(case.human for case in cases)
    return dataclasses.replace(
        dataset,
        cases=cases,
        dataset_hash=labelled,
        cases_hash=_with_rule(dataset_hash(cases, human=False), view) if human else labelled,
    )


def shares_documents(dataset: Dataset, corpus: Corpus) -> bool:
    """False when the dataset has evidence and the corpus holds none of the documents it names:
    the corpus of another set (a ``dataset.path`` override under a group that names its corpus)."""
    named = {item.doc for case in dataset.cases for item in case.relevant}
    if not named:
        return True
    held = set(corpus.texts.keys() - corpus.docs.keys())
    held.update(corpus.docs.values())
    return not named.isdisjoint(held)


def _with_rule(digest: str, rule: bytes) -> str:
    return hashlib.sha256(digest.encode("ascii") + b"\0match:" + rule).hexdigest()


class _Documents:
    """What a corpus says about documents: whole texts, and the chunks of each document."""

    def __init__(self, corpus: Corpus) -> None:
        self.path = corpus.path
        self.whole: dict[str, str] = {}
        self.chunks: dict[str, list[str]] = {}
        for chunk_id, text in corpus.texts.items():
            doc = corpus.docs.get(chunk_id)
            if doc is None:
                self.whole[chunk_id] = text
            else:
                self.chunks.setdefault(doc, []).append(text)
        self._known: list[str] | None = None
        self._joined: dict[str, str] = {}
        self._loose: dict[str, list[str]] = {}
        """Document -> its texts as a span is compared when not written in them (NFKC, case-folded,
        white space dropped): made once per document, however many spans name it."""

    def unknown(self, doc: str) -> str | None:
        if doc in self.whole or doc in self.chunks:
            return None
        if self._known is None:
            self._known = sorted({*self.whole, *self.chunks})
        close = difflib.get_close_matches(doc, self._known, n=1) if len(self._known) <= 10_000 else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown document {doc!r}: not in {self.path}{hint}"

    def not_verbatim(self, doc: str, span: str) -> str | None:
        texts = [self.whole[doc]] if doc in self.whole else self.chunks[doc]
        if any(span in text for text in texts):
            return None
        if len(texts) > 1:
            joined = self._joined.get(doc)
            if joined is None:
                joined = self._joined[doc] = "".join(texts)
            if span in joined:
                return None
        loose = self._loose.get(doc)
        if loose is None:
            loose = self._loose[doc] = ["".join(normalize(text).split()) for text in texts]
        wanted = "".join(normalize(span).split())
        if any(wanted in text for text in loose):
            return f"not written as in document {doc!r}: it differs in white space, width or case (spans are verbatim)"
        return f"not in the text of document {doc!r} (spans are verbatim text of their document)"


# -- from chunk ids to evidence ---------------------------------------------------------------


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text``, white space at either end left out."""
    found = []
    for match in SENTENCE.finditer(text):
        start, end = match.span()
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            found.append((start, end))
    return found


def fact_span(text: str, facts: Iterable[str]) -> str | None:
    """From the first to the last sentence of ``text`` that holds part of an expected fact, so
    the span holds every fact found in ``text``. A fact is found where it is written verbatim (it
    may run over several sentences), else in a single sentence as ``answer_accuracy`` finds facts
    (NFKC, case-folded); None when none is found."""
    bounds = sentences(text)
    wanted = [fact.strip() for fact in facts if fact.strip()]
    covered: list[tuple[int, int]] = []
    loose: list[str] = []
    for fact in wanted:
        at = text.find(fact)
        if at < 0:
            loose.append(normalize(fact))
        else:
            covered.append((at, at + len(fact)))
    holding = [
        (start, end)
        for start, end in bounds
        if any(start < stop and at < end for at, stop in covered)
        or any(fact in normalize(text[start:end]) for fact in loose)
    ]
    if not holding and not covered:
        return None
    first = min([start for start, _ in holding] + [at for at, _ in covered])
    last = max([end for _, end in holding] + [stop for _, stop in covered])
    return text[first:last]


def anchor_span(text: str, facts: Iterable[str]) -> str:
    """The evidence a chunk holds for a case: :func:`fact_span`, else the chunk's whole text. One
    span per chunk, so that on whole-document chunks evidence scores exactly as the ids did."""
    return fact_span(text, facts) or text.strip()


@dataclass(frozen=True)
class Anchored:
    """What ``validate --anchor`` wrote."""

    out: Path
    cases: int
    """Cases written."""
    anchored: int
    """Cases whose relevant ids became evidence."""
    spans_from_facts: int
    """Spans that are the sentences holding expected facts."""
    spans_whole_chunk: int
    """Spans that are a chunk's whole text (no expected fact found in it by sentence)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "cases": self.cases,
            "anchored": self.anchored,
            "spans_from_facts": self.spans_from_facts,
            "spans_whole_chunk": self.spans_whole_chunk,
        }


def anchor_file(dataset: Dataset, corpus: Corpus, out: Path, *, force: bool = False) -> Anchored:
    """Write ``dataset`` to ``out`` with each case's ``relevant_ids`` replaced by evidence in
    ``relevant`` (see :func:`anchor_span`), every other field as the file has it: a conversation
    is one row, each of its turns anchored in place. The new file is written beside ``out`` and
    read back and checked against the corpus first; only a file that passes replaces ``out``,
    and an existing ``out`` only with ``force``."""
    if dataset.format != "jsonl":
        raise DatasetErrors(
            [DatasetError(str(dataset.path), None, None, "the column format has no relevant_ids to anchor")]
        )
    if out.resolve() == dataset.path.resolve():
        raise DatasetErrors([DatasetError(str(out), None, None, "--out is the dataset itself: write elsewhere")])
    if out.exists() and not force:
        raise DatasetErrors([DatasetError(str(out), None, None, "--out exists: give --force to replace it")])
    lines = dataset.path.read_bytes().decode("utf-8-sig").split("\n")
    problems: list[DatasetError] = []
    rows: list[bytes] = []
    counts = {"anchored": 0, "facts": 0, "whole": 0}

    def anchored_row(item: dict[str, Any], case: Case, at: str) -> dict[str, Any]:
        ids = item.get("relevant_ids") or []
        if not ids:
            return item
        evidence: list[dict[str, str]] = []
        for index, chunk_id in enumerate(ids):
            text = corpus.texts.get(chunk_id)
            if text is None or not text.strip():
                what = "is not in" if text is None else "has no text in"
                problems.append(
                    DatasetError(
                        str(dataset.path),
                        case.line,
                        f"{at}relevant_ids[{index}]",
                        f"chunk {chunk_id!r} {what} {corpus.path}",
                    )
                )
                continue
            span = fact_span(text, case.expected_facts)
            found = {"doc": corpus.doc_of(chunk_id), "span": span or text.strip()}
            if found not in evidence:
                evidence.append(found)
                counts["facts"] += span is not None
                counts["whole"] += span is None
        counts["anchored"] += 1
        renamed = {("relevant" if key == "relevant_ids" else key): value for key, value in item.items()}
        renamed["relevant"] = evidence
        return renamed

    chats: dict[int, list[Case]] = {}
    for case in dataset.cases:
        if case.conversation is not None:
            chats.setdefault(case.line, []).append(case)
    for case in dataset.cases:
        row = orjson.loads(lines[case.line - 1])
        if case.conversation is None:
            row = anchored_row(row, case, "")
        elif case.turn == 1:  # a conversation is one row, written once with every turn anchored
            chat = sorted(chats[case.line], key=lambda turn: turn.turn)
            row["turns"] = [anchored_row(item, chat[i], f"turns[{i}].") for i, item in enumerate(row["turns"])]
        else:
            continue
        rows.append(orjson.dumps(row))
    if problems:
        raise DatasetErrors(problems[:MAX_ERRORS])
    written = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        written.write_bytes(b"\n".join(rows) + b"\n")
        # What was written is read back as any dataset is: a case it breaks is a bug here, and
        # nothing reaches --out until the whole file passes.
        resolve_evidence(load_dataset(written, "jsonl"), corpus, DefaultRule(), corpus_key="--corpus")
        os.replace(written, out)
    except OSError as exc:
        raise DatasetErrors([DatasetError(str(out), None, None, f"cannot write: {exc.strerror}")]) from None
    finally:
        written.unlink(missing_ok=True)
    return Anchored(out, len(dataset.cases), counts["anchored"], counts["facts"], counts["whole"])
