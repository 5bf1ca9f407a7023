"""Matching retrieved chunks to evidence anchored to documents (a case's ``relevant``).

A chunk matches a span when it comes from the span's document (when the system names documents,
``SystemOutput.doc_ids``, and the rule's ``same_doc`` holds) and its text overlaps the span:

- the chunk contains the span;
- or the span contains the chunk, for a chunk of at least ``min_chunk_chars`` characters;
- or the two overlap (the end of one is the start of the other) by at least ``min_overlap`` of
  the span's characters.

Texts are compared as written first and, failing that, after NFKC, case folding and removing
white space (chunkers strip, collapse and re-wrap it). :meth:`Matcher.reduce` turns one case
into what :func:`ragexp.metrics.offline.build_inputs` keeps for an id case: the ranks where a
chunk covers spans no earlier chunk covered (with how many), the rank of the first chunk that
matches any span, and how many citations point at a matching chunk. Every kernel downstream reads
those as it reads ids.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragexp.records import Case, CaseResult, Evidence, SystemOutput

CACHE_LIMIT = 200_000
"""Normalised chunk texts kept at most; chunks repeat across cases (one corpus), but a run whose
chunks are all distinct would only fill memory."""


class Rule(Protocol):
    """The match rule's knobs (``dataset.match``: :class:`ragexp.config.models.MatchConfig`)."""

    @property
    def min_overlap(self) -> float: ...
    @property
    def min_chunk_chars(self) -> int: ...
    @property
    def same_doc(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class DefaultRule:
    """The rule's defaults, for callers without a config (they equal ``MatchConfig``'s)."""

    min_overlap: float = 0.5
    min_chunk_chars: int = 20
    same_doc: bool = True


def normalize(text: str) -> str:
    """NFKC, case folding and no white space: how texts compare when they differ as written."""
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


@dataclass(frozen=True, slots=True)
class _Span:
    raw: str
    text: str
    """The span normalised."""
    need: int
    """Characters of the (normalised) span a chunk must overlap to match by overlap."""
    head: str
    tail: str


class Matcher:
    """The match rule, with the normalised texts it has seen (a matcher serves one run)."""

    def __init__(self, rule: Rule | None = None) -> None:
        rule = rule or DefaultRule()
        self.min_overlap = rule.min_overlap
        self.min_chunk_chars = rule.min_chunk_chars
        self.same_doc = rule.same_doc
        self._chunks: dict[str, str] = {}
        self._spans: dict[str, _Span] = {}

    def span(self, text: str) -> _Span:
        """The span normalised, with what overlap needs of it (computed once per span text, and
        only for a span some chunk does not hold as written)."""
        found = self._spans.get(text)
        if found is None:
            norm = normalize(text)
            need = max(1, math.ceil(self.min_overlap * len(norm)))
            found = _Span(text, norm, need, norm[:need], norm[len(norm) - need :])
            self._spans[text] = found
        return found

    def covers(self, chunk: str, span: str) -> bool:
        """The chunk's text matches the span's by text (documents aside)."""
        return span in chunk or self._matches(chunk, self.span(span))

    def _matches(self, chunk: str, s: _Span) -> bool:
        """The texts match after normalisation (the caller found the span not written in the chunk)."""
        norm = self._chunks.get(chunk)
        if norm is None:
            if len(self._chunks) >= CACHE_LIMIT:
                self._chunks.clear()
            norm = self._chunks[chunk] = normalize(chunk)
        text = s.text
        if not text or not norm:
            return False
        if text in norm:
            return True
        size, length = len(norm), len(text)
        if size < length:
            if norm in text:
                return size >= self.min_chunk_chars or size >= s.need
        elif s.head not in norm and s.tail not in norm:
            return False  # an overlap at either end holds the span's head or its tail
        return self._overlaps(norm, s)

    def _overlaps(self, chunk: str, s: _Span) -> bool:
        """The end of one is the start of the other, by at least ``need`` of the span's characters
        (both normalised; containment either way already ruled out)."""
        text = s.text
        size, length, need = len(chunk), len(text), s.need
        if need >= length or size <= need:
            return False  # only containment could match, and it did not
        # The chunk's end is the span's start: chunk[p:] == text[:size - p], size - p >= need.
        last = size - need
        p = chunk.find(s.head, max(0, size - length + 1))
        while p != -1 and p <= last:
            if text.startswith(chunk[p:]):
                return True
            p = chunk.find(s.head, p + 1)
        # The chunk's start is the span's end: chunk[:q + need] == text[-(q + need):].
        limit = min(size, length) - 1
        q = chunk.find(s.tail, 0, limit)
        while q != -1:
            if text.endswith(chunk[: q + need]):
                return True
            q = chunk.find(s.tail, q + 1, limit)
        return False

    def mask(self, evidence: Sequence[Evidence], text: str, doc: str, spans: list[_Span] | None = None) -> int:
        """Bit j set: the chunk (its text, its document or "") matches span j (``spans``: the
        evidence's spans normalised, when the caller has them)."""
        found = 0
        bit = 1
        for j, item in enumerate(evidence):
            if not doc or item.doc == doc:
                raw = item.span
                if raw in text or self._matches(text, spans[j] if spans is not None else self.span(raw)):
                    found |= bit
            bit <<= 1
        return found

    def reduce(
        self, evidence: Sequence[Evidence], output: SystemOutput, k: int
    ) -> tuple[list[int], list[int] | None, int, int]:
        """One case: (ranks in the top K where a chunk covers spans not covered before it; how many
        each covers, None when one each; 1-based rank of the first matching chunk anywhere, or 0;
        citations of a matching chunk)."""
        texts = output.contexts
        docs: list[str] = output.doc_ids if self.same_doc else []
        known = len(docs)
        # Every chunk's document named: only the chunks of the evidence's documents can match, and
        # they are found by the list's own scans; the others are let go unread. Otherwise (text
        # alone, or some chunk's document unknown) every chunk is compared with every span.
        named = known == len(texts) and "" not in docs
        if named and len(evidence) == 1:
            return self._reduce_one(evidence[0], texts, docs, output.citations, k)
        wanted = {item.doc for item in evidence}
        positions: Iterable[int] = _positions(docs, wanted) if named else range(len(texts))
        spans = None if named else [self.span(item.span) for item in evidence]
        masks: dict[int, int] = {}
        ranks: list[int] = []
        gains: list[int] | None = None
        covered = first = 0
        for rank in positions:
            if rank >= k and first:
                break
            found = masks[rank] = self.mask(evidence, texts[rank], docs[rank] if rank < known else "", spans)
            if not found:
                continue
            if not first:
                first = rank + 1
            fresh = found & ~covered
            if fresh and rank < k:
                covered |= fresh
                ranks.append(rank)
                count = fresh.bit_count()
                if count > 1 and gains is None:
                    gains = [1] * (len(ranks) - 1)
                if gains is not None:
                    gains.append(count)
        supported = 0
        for cited in output.citations:
            if 0 < cited <= len(texts):
                position = cited - 1
                memo = masks.get(position)
                if memo is None:
                    doc = docs[position] if position < known else ""
                    memo = 0 if doc and doc not in wanted else self.mask(evidence, texts[position], doc)
                    masks[position] = memo
                supported += memo > 0
        return ranks, gains, first, supported

    def _reduce_one(
        self, item: Evidence, texts: list[str], docs: list[str], citations: list[int], k: int
    ) -> tuple[list[int], None, int, int]:
        """:meth:`reduce` for the commonest case, written out: one span, every chunk's document
        named. Only the chunks of the span's document are read, found by the list's own scans."""
        doc, raw = item.doc, item.span
        first = 0
        hit: list[int] = []
        matched: dict[int, bool] = {}
        start = 0
        for _ in range(docs.count(doc)):
            rank = docs.index(doc, start)
            start = rank + 1
            if rank >= k and first:
                break
            text = texts[rank]
            found = matched[rank] = raw in text or self._matches(text, self.span(raw))
            if found and not first:
                first = rank + 1
                if rank < k:
                    hit.append(rank)
        supported = 0
        for cited in citations:
            position = cited - 1
            if 0 <= position < len(texts) and docs[position] == doc:
                memo = matched.get(position)
                if memo is None:
                    text = texts[position]
                    memo = raw in text or self._matches(text, self.span(raw))
                supported += memo
        return hit, None, first, supported


def _positions(docs: list[str], wanted: set[str]) -> list[int]:
    """Where in ``docs`` the ``wanted`` documents are, in rank order (C-level scans of the list)."""
    found = []
    for doc in wanted:
        start = 0
        for _ in range(docs.count(doc)):
            start = docs.index(doc, start) + 1
            found.append(start - 1)
    if len(wanted) > 1:
        found.sort()
    return found


def returned_documents(evidence_docs: set[str], outputs: Sequence[SystemOutput | None]) -> tuple[int, bool]:
    """(how many outputs named documents, whether any named one of ``evidence_docs``): a system
    whose document ids are of another kind than the evidence's (Dify's UUIDs against file names)
    would otherwise match nothing, silently."""
    named = 0
    for output in outputs:
        if output is None or not output.doc_ids:
            continue
        named += 1
        if not evidence_docs.isdisjoint(output.doc_ids):
            return named, True
    return named, False


def textless(cases: Sequence[Case], results: Sequence[CaseResult]) -> list[int]:
    """Indexes of the evidence cases whose reply named retrieved chunks without their texts."""
    return [
        index
        for index, (case, result) in enumerate(zip(cases, results, strict=True))
        if case.relevant and result.ok and result.output is not None
        if result.output.ranked_ids and not result.output.contexts
    ]


CHUNK_SEPARATORS = ("#", ":", "/", "::")
"""How a chunk id commonly names its document (``doc#3``, ``doc:3``, ``doc/3``)."""


@dataclass(frozen=True, slots=True)
class Unmatchable:
    """Chunk-id gold a run's rankings cannot match: chunks of the gold documents came back under
    other ids, so every retrieval metric would be 0 whatever was retrieved."""

    cases: int
    """Answerable cases with gold ids and a reply."""
    hits: int
    """Of those, the cases whose ranking holds a gold id."""
    named: int
    """Of those, the cases whose ranking holds no gold id but a chunk of a gold document."""
    example: str
    """One returned chunk id of a gold document (for the message)."""

    def message(self, dataset: str) -> str:
        return (
            f"the gold of {dataset} names chunk ids; the system's rankings hold a gold id in {self.hits} of "
            f"{self.cases} cases, and in {self.named} they return chunks of the gold documents under other ids "
            f"(e.g. {self.example!r}): every retrieval metric would score about 0 whatever was retrieved, so "
            "nothing was scored. Use evidence gold (text spans of documents, which survive re-chunking): "
            "`ragexp validate --corpus CHUNKS --anchor --out FILE` turns chunk-id gold into evidence "
            "(docs/datasets.md), or return the gold's chunk ids"
        )


def unmatchable_gold(cases: Sequence[Case], results: Sequence[CaseResult], k: int) -> Unmatchable | None:
    """Chunk-id gold no ranking can match, or None when the gold is matched often enough (a gold id
    in more than one case in twenty) or the rankings do not name the gold documents (in fewer than
    half the cases): then a low score is the system's, not the ids'."""
    total = hits = named = 0
    example = ""
    for case, result in zip(cases, results, strict=True):
        if case.unanswerable or not case.relevant_ids or not result.ok or result.output is None:
            continue
        total += 1
        gold = set(case.relevant_ids)
        ranked = result.output.ranked_ids[:k]
        if not gold.isdisjoint(ranked):
            hits += 1
            continue
        docs = set(result.output.doc_ids[:k]) if result.output.doc_ids else set()
        for chunk in ranked:
            owners = {chunk.split(sep, 1)[0] for sep in CHUNK_SEPARATORS if sep in chunk} | (docs & gold)
            if owners & gold:
                named += 1
                example = example or chunk
                break
    if not total or hits * 20 > total or named * 2 < total:
        return None
    return Unmatchable(total, hits, named, example)
