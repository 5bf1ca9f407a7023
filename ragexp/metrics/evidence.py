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
from collections.abc import Sequence
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
        found = self._spans.get(text)
        if found is None:
            norm = normalize(text)
            need = max(1, math.ceil(self.min_overlap * len(norm)))
            found = _Span(text, norm, need, norm[:need], norm[len(norm) - need :])
            self._spans[text] = found
        return found

    def covers(self, chunk: str, span: str | _Span) -> bool:
        """The chunk's text matches the span's by text (documents aside)."""
        s = self.span(span) if isinstance(span, str) else span
        if s.raw in chunk:
            return True
        norm = self._chunks.get(chunk)
        if norm is None:
            if len(self._chunks) >= CACHE_LIMIT:
                self._chunks.clear()
            norm = self._chunks[chunk] = normalize(chunk)
        return self._overlaps(norm, s)

    def _overlaps(self, chunk: str, s: _Span) -> bool:
        text = s.text
        if not text or not chunk:
            return False
        if text in chunk:
            return True
        size, length, need = len(chunk), len(text), s.need
        if size < length and chunk in text:
            return size >= self.min_chunk_chars or size >= need
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

    def mask(self, evidence: Sequence[Evidence], spans: Sequence[_Span], text: str, doc: str) -> int:
        """Bit j set: the chunk (its text, its document or "") matches span j."""
        found = 0
        for j, item in enumerate(evidence):
            if doc and item.doc != doc:
                continue
            if self.covers(text, spans[j]):
                found |= 1 << j
        return found

    def reduce(
        self, evidence: Sequence[Evidence], output: SystemOutput, k: int
    ) -> tuple[list[int], list[int], int, int]:
        """One case: (ranks in the top K where a chunk covers spans not covered before it, how many
        each covers, 1-based rank of the first matching chunk anywhere or 0, supported citations)."""
        texts = output.contexts
        docs = output.doc_ids if self.same_doc else ()
        known = len(docs)
        spans = [self.span(item.span) for item in evidence]
        masks: dict[int, int] = {}
        ranks: list[int] = []
        gains: list[int] = []
        covered = first = 0
        for rank, text in enumerate(texts):
            if rank >= k and first:
                break
            found = masks[rank] = self.mask(evidence, spans, text, docs[rank] if rank < known else "")
            if not found:
                continue
            if not first:
                first = rank + 1
            fresh = found & ~covered
            if fresh and rank < k:
                covered |= fresh
                ranks.append(rank)
                gains.append(fresh.bit_count())
        supported = 0
        for cited in output.citations:
            if 0 < cited <= len(texts):
                position = cited - 1
                memo = masks.get(position)
                if memo is None:
                    memo = masks[position] = self.mask(
                        evidence, spans, texts[position], docs[position] if position < known else ""
                    )
                if memo:
                    supported += 1
        return ranks, gains, first, supported


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
