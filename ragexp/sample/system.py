"""A small, real RAG system over a JSONL knowledge base (``{"id", "text", "title"?}`` per line).

Retrieval is BM25 over character bigrams (Chinese works without a tokenizer or a model download),
optionally reranked by how much of the question a chunk covers; the answer is the sentence of the
top document that covers the question best, cited as ``[1]``, or a refusal when the BM25 score
of the chunk ranked first is below a threshold. Every step is deterministic: the same question and settings give the
same ranking and answer on any machine.

Chunking: ``doc`` indexes each document whole (title and text) and ``sentence`` each sentence,
returning documents (a document's best chunk stands for it); ``window`` cuts each document's text
into windows of ``chunk_chars`` characters, each sharing ``overlap`` with the one before, and
returns the windows themselves, with ids ``<doc>#<n>`` (n counting from 1).

:meth:`SampleSystem.answer` returns ragexp's HTTP service contract as a dict
(``ranked_ids``, ``contexts``, ``answer``, ``citations``, ``timings``, ``doc_ids``, and
``stages``: what BM25 and the reranker each produced, shown on the case's stage spans), so the
in-process provider and the HTTP wrapper hand out exactly the same thing.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSAL = "知识库中没有足够证据回答这个问题。"
SENTENCE = re.compile(r"[^。！？；;]+[。！？；;]?")
CHUNKINGS = ("doc", "sentence", "window")
CITATION_POLICIES = ("source", "all", "none")
RERANK_POOL = 10
"""The reranker sees at least this many BM25 candidates (or 3 x the documents asked for)."""


@dataclass(frozen=True)
class Settings:
    """The system's knobs. ``provider.system.sample`` in the config mirrors them."""

    top_k: int | None = None
    """Documents returned and handed to the answerer; None: as many as the caller asks for."""
    rerank: bool = True
    """Rerank BM25's candidates by question coverage; False: BM25 order alone."""
    citations: str = "source"
    """``source``: cite the document the answer was taken from; ``all``: cite every returned
    document; ``none``: cite nothing."""
    chunking: str = "doc"
    """``doc``: one chunk per document (title + text); ``sentence``: one chunk per sentence;
    ``window``: windows of ``chunk_chars`` characters of each document's text."""
    threshold: float = 3.0
    """Refuse to answer when the BM25 score of the chunk ranked first is below this."""
    chunk_chars: int = 120
    """Characters per window (``chunking="window"`` only)."""
    overlap: int = 0
    """Characters a window shares with the one before it (``chunking="window"`` only)."""
    hops: int = 1
    """Retrieval steps: 1 searches once; 2 searches, takes the bridge from the first evidence
    (the top chunk's text) and searches again for the question with it, leaving out the
    document the bridge came from (each search is reported in ``retrievals``)."""

    def __post_init__(self) -> None:
        if self.chunking not in CHUNKINGS:
            raise ValueError(f"chunking: expected one of {', '.join(CHUNKINGS)}, got {self.chunking!r}")
        if self.citations not in CITATION_POLICIES:
            raise ValueError(f"citations: expected one of {', '.join(CITATION_POLICIES)}, got {self.citations!r}")
        if self.hops not in (1, 2):
            raise ValueError(f"hops: expected 1 or 2, got {self.hops}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k: must be at least 1, got {self.top_k}")
        if self.chunk_chars < 1 or not 0 <= self.overlap < self.chunk_chars:
            raise ValueError(
                f"chunk_chars and overlap: need 0 <= overlap < chunk_chars, got {self.chunk_chars} and {self.overlap}"
            )


class DocsError(ValueError):
    """The knowledge-base file is missing or malformed; the message names file and line."""


def load_docs(path: Path) -> list[dict[str, str]]:
    """Read a JSONL knowledge base; every problem is a :class:`DocsError` naming file and line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DocsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DocsError(f"{path}: cannot read ({exc})") from None
    docs: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DocsError(f"{path}:{number}: invalid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise DocsError(f"{path}:{number}: expected a JSON object")
        for key in ("id", "text"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise DocsError(f"{path}:{number}: field '{key}': must be a non-empty string")
        if not isinstance(row.get("title", ""), str):
            raise DocsError(f"{path}:{number}: field 'title': must be a string")
        if row["id"] in seen:
            raise DocsError(
                f"{path}:{number}: field 'id': duplicate id '{row['id']}' (first on line {seen[row['id']]})"
            )
        seen[row["id"]] = number
        docs.append({"id": row["id"], "title": row.get("title", ""), "text": row["text"]})
    if not docs:
        raise DocsError(f"{path}: no documents")
    return docs


def tokens(text: str) -> list[str]:
    """Character bigrams of CJK runs plus lower-cased words and numbers."""
    out: list[str] = []
    for run in re.findall(r"[\u4e00-\u9fff]+|[A-Za-z]+|\d+", text):
        if run[0].isascii():
            out.append(run.lower())
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


def windows(text: str, size: int, overlap: int = 0) -> list[str]:
    """``text`` cut into pieces of ``size`` characters, each starting ``size - overlap`` after the
    one before; the last one ends with the text. Pieces of white space alone are left out."""
    pieces = []
    start = 0
    while True:
        piece = text[start : start + size]
        if piece.strip():
            pieces.append(piece)
        if start + size >= len(text):
            return pieces
        start += size - overlap


def coverage(query: str, text: str) -> float:
    """Share of the question's distinct tokens that appear in ``text``."""
    q = set(tokens(query))
    return len(q & set(tokens(text))) / len(q) if q else 0.0


class Index:
    """BM25 (Okapi) over the chunks of a knowledge base."""

    def __init__(
        self,
        docs: Sequence[dict[str, str]],
        chunking: str,
        k1: float = 1.2,
        b: float = 0.75,
        *,
        chunk_chars: int = 120,
        overlap: int = 0,
    ) -> None:
        for _ in self.fill(docs, chunking, k1, b, chunk_chars=chunk_chars, overlap=overlap):
            pass

    def fill(
        self,
        docs: Sequence[dict[str, str]],
        chunking: str,
        k1: float = 1.2,
        b: float = 0.75,
        step: int = 0,
        *,
        chunk_chars: int = 120,
        overlap: int = 0,
    ) -> Iterator[None]:
        """Build the index, pausing (yielding) after every ``step`` chunks counted and once before
        the weights (never when ``step`` is 0): a caller on an event loop hands the loop back in
        those pauses, so a large corpus is indexed between the loop's other work."""
        self.chunks: list[tuple[str, str]] = []  # (doc id, text)
        self.chunk_ids: list[str] = []
        """What a ``window`` chunk is returned as (``<doc>#<n>``)."""
        for doc in docs:
            text = doc["text"]
            if chunking == "sentence":
                self.chunks.extend((doc["id"], s.strip()) for s in SENTENCE.findall(text) if s.strip())
            elif chunking == "window":
                pieces = windows(text, chunk_chars, overlap)
                self.chunks.extend((doc["id"], piece) for piece in pieces)
                self.chunk_ids.extend(f"{doc['id']}#{n}" for n in range(1, len(pieces) + 1))
            else:
                self.chunks.append((doc["id"], f"{doc.get('title', '')}：{text}"))
        self.terms: list[Counter[str]] = []
        df: Counter[str] = Counter()
        for start in range(0, len(self.chunks), step or len(self.chunks) or 1):
            for _, text in self.chunks[start : start + step] if step else self.chunks:
                terms = Counter(tokens(text))
                self.terms.append(terms)
                df.update(terms.keys())
            if step:
                yield
        self.lengths = [sum(t.values()) for t in self.terms]
        self.avg = sum(self.lengths) / max(len(self.lengths), 1)
        n = len(self.chunks)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def search(self, query: str) -> list[tuple[float, int]]:
        """(score, chunk index) of every chunk sharing a token with ``query``, best first."""
        q = tokens(query)
        scored = []
        for i, terms in enumerate(self.terms):
            score = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
            for t in q:
                f = terms.get(t)
                if f:
                    score += self.idf[t] * f * (self.k1 + 1) / (f + norm)
            if score > 0:
                scored.append((score, i))
        scored.sort(reverse=True)  # equal scores: the later chunk first (a fixed, input-only order)
        return scored


FOLLOW_UP_SCORE = 3.5
"""A question of a conversation whose best match scores below this by itself is a follow-up that
leans on the question before it ("那运费呢？"): it is searched for after that question."""


class SampleSystem:
    """Retriever, reranker and extractive answerer over one knowledge base."""

    def __init__(self, docs: Sequence[dict[str, str]], settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        knobs = self.settings
        self.index = Index(docs, knobs.chunking, chunk_chars=knobs.chunk_chars, overlap=knobs.overlap)
        self.doc_ids = frozenset(doc["id"] for doc in docs)

    def in_context(self, question: str, history: Sequence[dict[str, str]] | None) -> str:
        """What to search for: the question, or for a follow-up that finds little by itself, the
        previous question and the follow-up twice (its own words still weigh most)."""
        earlier = [message["content"] for message in history or () if message.get("role") == "user"]
        if not earlier:
            return question
        hits = self.index.search(question)
        if hits and hits[0][0] >= FOLLOW_UP_SCORE:
            return question
        return " ".join([earlier[-1], question, question])

    def answer(self, question: str, k: int) -> dict[str, Any]:
        """Answer ``question`` with up to ``k`` documents (``top_k`` overrides ``k``): the answer
        stage (:meth:`generate`) over what the retrieval stage (:meth:`retrieve`) found."""
        if self.settings.hops == 2:
            return self.two_step(question, k)
        found = self.retrieve(question, k)
        return self.generate(question, found)

    def two_step(self, question: str, k: int) -> dict[str, Any]:
        """Retrieve; take the bridge from the first evidence: the sentence of the top chunk that
        covers the question least (what the chunk adds to it); retrieve again for the question
        and the bridge, ranked by how much of the question each chunk covers, without the
        bridge's document; answer from the second search. The case's ranking is the second
        search's, then the bridge's document."""
        first = self.retrieve(question, k)
        if not first["ranked_ids"]:
            reply = self.generate(question, first)
            reply["retrievals"] = [_step(question, first)]
            return reply
        bridge_doc, evidence = first["doc_ids"][0], first["contexts"][0]
        sentences = [s.strip() for s in SENTENCE.findall(evidence) if s.strip()] or [evidence]
        bridge = min(sentences, key=lambda s: coverage(question, s))
        query = f"{question} {bridge}"
        second = self.retrieve(query, k, exclude=frozenset({bridge_doc}), focus=question)
        wanted = self.settings.top_k or max(k, 1)
        found = dict(second)
        found["ranked_ids"] = [*second["ranked_ids"][: wanted - 1], first["ranked_ids"][0]]
        found["contexts"] = [*second["contexts"][: wanted - 1], evidence]
        found["doc_ids"] = [*second["doc_ids"][: wanted - 1], bridge_doc]
        found["timings"] = {
            name: first["timings"].get(name, 0.0) + seconds for name, seconds in second["timings"].items()
        }
        reply = self.generate(question, found)
        reply["retrievals"] = [_step(question, first), _step(query, second)]
        return reply

    def retrieve(
        self, question: str, k: int, exclude: frozenset[str] = frozenset(), focus: str | None = None
    ) -> dict[str, Any]:
        """The retrieval stage: up to ``k`` documents (``top_k`` overrides ``k``) as ``ranked_ids``,
        ``contexts`` and ``doc_ids``, with ``score`` (the BM25 score of the chunk ranked first,
        which the answer stage's threshold reads), ``timings`` and ``stages``. ``exclude``: documents
        left out; ``focus``: what the reranker measures coverage of (the question by default)."""
        settings = self.settings
        wanted = settings.top_k or max(k, 1)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        hits = self.index.search(question)
        if exclude:
            hits = [hit for hit in hits if self.index.chunks[hit[1]][0] not in exclude]
        timings["keyword"] = time.perf_counter() - started
        candidates = hits[: max(wanted * 3, RERANK_POOL)]
        chunks = self.index.chunks
        # The ids the system returns: documents, or the windows themselves.
        window = settings.chunking == "window"
        named = [self.index.chunk_ids[i] if window else chunks[i][0] for _, i in candidates]
        bm25_order = list(named)
        name_of = {i: named[n] for n, (_, i) in enumerate(candidates)}
        stages: dict[str, dict[str, list[Any]]] = {
            "keyword": {"ids": bm25_order, "scores": [round(score, 6) for score, _ in candidates]}
        }
        if settings.rerank:
            started = time.perf_counter()
            covered = {i: coverage(focus or question, chunks[i][1]) for _, i in candidates}
            candidates.sort(key=lambda hit: (covered[hit[1]], hit[0]), reverse=True)
            timings["rerank"] = time.perf_counter() - started
            stages["rerank"] = {
                "ids_in": bm25_order,
                "ids": [name_of[i] for _, i in candidates],
                "scores": [round(covered[i], 6) for _, i in candidates],
            }
        started = time.perf_counter()
        ranked_ids: list[str] = []
        contexts: list[str] = []
        doc_ids: list[str] = []
        whole = settings.chunking != "window"
        for _, i in candidates:
            doc_id, text = self.index.chunks[i]
            if not whole:  # windows are returned as themselves
                ranked_ids.append(self.index.chunk_ids[i])
            elif doc_id in ranked_ids:  # several chunks of one document count once
                continue
            else:
                ranked_ids.append(doc_id)
            contexts.append(text)
            doc_ids.append(doc_id)
            if len(ranked_ids) == wanted:
                break
        timings["model"] = time.perf_counter() - started
        return {
            "ranked_ids": ranked_ids,
            "contexts": contexts,
            "doc_ids": doc_ids,
            "score": candidates[0][0] if candidates else 0.0,  # BM25 score of the chunk ranked first
            "timings": timings,
            "stages": stages,
        }

    def generate(self, question: str, found: dict[str, Any]) -> dict[str, Any]:
        """The answer stage over given contexts (``found``: ``ranked_ids``, ``contexts``, and
        ``score``, the retrieval score its threshold reads; None or absent: no threshold applies).
        Below the threshold, or with nothing retrieved, it refuses and returns no context."""
        settings = self.settings
        started = time.perf_counter()
        ranked_ids, contexts = list(found["ranked_ids"]), list(found["contexts"])
        doc_ids = list(found.get("doc_ids") or [])
        best = found.get("score")
        citations: list[int]
        if (best is not None and best < settings.threshold) or not ranked_ids or not contexts:
            answer, citations, ranked_ids, contexts, doc_ids = REFUSAL, [], [], [], []
        else:
            sentences = [s for s in SENTENCE.findall(contexts[0]) if s.strip()] or [contexts[0]]
            answer = max(sentences, key=lambda s: coverage(question, s)).strip()
            if settings.citations == "source":
                citations = [1]
            elif settings.citations == "all":
                citations = list(range(1, len(ranked_ids) + 1))
            else:
                citations = []
            answer += "".join(f"[{c}]" for c in citations)
        timings = dict(found.get("timings") or {})
        timings["model"] = timings.get("model", 0.0) + time.perf_counter() - started
        return {
            "ranked_ids": ranked_ids,
            "contexts": contexts,
            "answer": answer,
            "citations": citations,
            "timings": timings,
            "doc_ids": doc_ids,
            "stages": found.get("stages") or {},
        }


def _step(query: str, found: dict[str, Any]) -> dict[str, Any]:
    """One search as a hop of ``retrievals``: what it searched for and what it found."""
    return {
        "query": query,
        "ranked_ids": list(found["ranked_ids"]),
        "contexts": list(found["contexts"]),
        "doc_ids": list(found["doc_ids"]),
    }
