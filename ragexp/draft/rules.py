"""The pure rules of drafting: which chunks, which pairs, which facts and questions are kept."""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ragexp.metrics.offline import normalize
from ragexp.sample.system import Index, tokens

NGRAM = 3
"""Questions are compared as sets of character trigrams (NFKC, case-folded, letters and digits only)."""
DUPLICATE_JACCARD = 0.8
"""A question whose trigram Jaccard similarity with an earlier kept question is above this is a
near-duplicate and dropped. It is set to catch repeats: the same question up to case, width,
spacing and punctuation, or a long one differing in a character or two. Character n-grams cannot
tell a rewording from a question about another subject (a short question reworded by one word
scores lower than "生鲜商品…" vs "预售商品…"), so rewordings are left for people to screen."""
INDEX_STEP = 100
"""Chunks indexed between two hand-backs to the event loop while drafting (:meth:`Retriever.build`)."""
RETRIEVE_K = 10
"""Chunks the bundled BM25 retriever returns for an unanswerable question's check."""


def stratified(total: int, n: int, rng: random.Random) -> list[int]:
    """``n`` indices in ``range(total)`` spread over it: one drawn at random from each of ``n``
    equal strata (all of them when ``n >= total``), in corpus order."""
    if n >= total:
        return list(range(total))
    picked = []
    for stratum in range(n):
        low, high = stratum * total // n, (stratum + 1) * total // n
        picked.append(rng.randrange(low, max(high, low + 1)))
    return picked


class Retriever:
    """The bundled sample system's BM25 (:class:`ragexp.sample.system.Index`, one chunk per
    corpus entry), scored through postings so a long query costs only the chunks it touches."""

    def __init__(self, texts: Sequence[str]) -> None:
        for _ in self.fill(texts):
            pass

    @classmethod
    async def build(cls, texts: Sequence[str], step: int = INDEX_STEP) -> Retriever:
        """The retriever, built ``step`` chunks at a time on the running event loop, handing it
        back between slices: calls in flight are answered while it builds (from a thread, the
        build would hold the interpreter lock against the loop in long stretches instead)."""
        retriever = cls.__new__(cls)
        for _ in retriever.fill(texts, step):
            await asyncio.sleep(0)
        return retriever

    def fill(self, texts: Sequence[str], step: int = 0) -> Iterator[None]:
        """Index ``texts``, pausing after every ``step`` of them (never when 0); see :meth:`build`."""
        self.index = Index.__new__(Index)
        self.postings: dict[str, list[int]] = defaultdict(list)
        """Term -> the corpus positions holding it (its frequency is in ``index.terms``)."""
        self.normalized: list[str] = []
        """Each chunk's text as :func:`found_in` compares it, normalised once for every check."""
        with _collector_paused():
            yield from self.index.fill([{"id": str(i), "text": text} for i, text in enumerate(texts)], "doc", step=step)
            for start in range(0, len(texts), step or len(texts) or 1):
                stop = start + step if step else len(texts)
                for position in range(start, min(stop, len(texts))):
                    for term in self.index.terms[position]:
                        self.postings[term].append(position)
                    self.normalized.append(normalize(texts[position]))
                if step:
                    yield

    def holds(self, candidates: Sequence[str]) -> str | None:
        """The first answer candidate written anywhere in the corpus (as :func:`found_in`)."""
        return _first_in(candidates, self.normalized)

    def search(self, query: str, k: int) -> list[int]:
        """The ``k`` best chunks for ``query`` by the Index's BM25 score (those sharing a term)."""
        index = self.index
        scores: dict[int, float] = defaultdict(float)
        for term in tokens(query):
            idf = index.idf.get(term)
            if idf is None:
                continue
            for position in self.postings[term]:
                f = index.terms[position][term]
                norm = index.k1 * (1 - index.b + index.b * index.lengths[position] / index.avg)
                scores[position] += idf * f * (index.k1 + 1) / (f + norm)
        return [position for _, position in heapq.nlargest(k, ((s, p) for p, s in scores.items()))]

    def related(self, position: int, exclude: frozenset[int] = frozenset()) -> int | None:
        """The chunk most related to chunk ``position``: the one BM25 ranks first when the chunk's
        own text is the query (itself and ``exclude`` left out); None when none shares a term."""
        for hit in self.search(self.index.chunks[position][1], len(exclude) + 2):
            if hit != position and hit not in exclude:
                return hit
        return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The index is hundreds of thousands of small containers without reference cycles: the
    cyclic collector's passes over them, triggered by the allocations themselves, would cost
    more than building them. Paused for the build, then restored as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def missing_facts(facts: Sequence[str], sources: Sequence[str]) -> list[str]:
    """The facts that are not verbatim spans (character for character) of any of the source
    texts: a drafted fact is text a person finds in its chunk as it is written."""
    return [fact for fact in facts if not fact.strip() or not any(fact in text for text in sources)]


def loosely_written(facts: Sequence[str], sources: Sequence[str]) -> list[str]:
    """Those of ``facts`` that are in a source text only up to width, case or white space (NFKC,
    case-folded, white space dropped): a fact the model rewrote, such as "," for "，"."""
    texts = ["".join(normalize(text).split()) for text in sources]
    return [fact for fact in facts if fact.strip() and any("".join(normalize(fact).split()) in t for t in texts)]


def found_in(candidates: Sequence[str], texts: Sequence[str]) -> str | None:
    """The first answer candidate written in one of ``texts`` (normalised substring), if any."""
    return _first_in(candidates, [normalize(text) for text in texts])


def _first_in(candidates: Sequence[str], normalized: Sequence[str]) -> str | None:
    for candidate in candidates:
        needle = normalize(candidate).strip()
        if needle and any(needle in text for text in normalized):
            return candidate
    return None


def ngrams(text: str) -> frozenset[str]:
    compact = "".join(ch for ch in normalize(text) if ch.isalnum())
    if len(compact) <= NGRAM:
        return frozenset([compact])
    return frozenset(compact[i : i + NGRAM] for i in range(len(compact) - NGRAM + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def near_duplicates(questions: Sequence[str], threshold: float = DUPLICATE_JACCARD) -> dict[int, int]:
    """Index of each dropped question -> index of the earliest kept question it nearly repeats.

    Candidates are found by prefix filtering (as in similarity joins): with every question's
    grams ordered rarest first over the whole list, two sets whose Jaccard similarity reaches
    ``threshold`` share at least one gram among the first ``len - ceil(threshold * len) + 1`` of
    each, so only those prefixes are indexed and probed. Grams every question shares (a question
    template's words) then never make each pair a candidate; each candidate is confirmed with
    the full Jaccard similarity."""
    grams = [ngrams(question) for question in questions]
    frequency: Counter[str] = Counter(gram for each in grams for gram in each)
    kept: list[tuple[int, frozenset[str]]] = []
    postings: dict[str, list[int]] = defaultdict(list)
    dropped: dict[int, int] = {}
    for position, own in enumerate(grams):
        prefix = sorted(own, key=lambda gram: (frequency[gram], gram))[: len(own) - math.ceil(threshold * len(own)) + 1]
        candidates = sorted({slot for gram in prefix for slot in postings.get(gram, ())})
        match = next((kept[slot][0] for slot in candidates if jaccard(own, kept[slot][1]) > threshold), None)
        if match is None and not own:  # an empty question repeats any earlier empty one
            match = next((earlier for earlier, seen in kept if not seen), None)
        if match is None:
            for gram in prefix:
                postings[gram].append(len(kept))
            kept.append((position, own))
        else:
            dropped[position] = match
    return dropped
