"""Offline metrics: one Python pass reduces each case to a few numbers, numpy does the rest.

Strings cannot be compared in numpy cheaply (converting them costs more than the comparison), so
:func:`build_inputs` walks each ranking once and keeps only a top-K hit matrix, the rank of the
first relevant id and a few counts. A case whose gold is evidence anchored to documents
(``relevant``) is reduced to the same arrays by :mod:`ragexp.metrics.evidence`. The kernels below
are pure: arrays in, one score per case out, ``NaN`` where a case has no score.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.metrics.evidence import Matcher, Rule
from ragexp.records import Case, CaseResult


@dataclass(slots=True)
class OfflineInputs:
    """Per-case arrays (length n) that the offline kernels read."""

    k: int
    hits: np.ndarray
    """(n, w) bool, w = min(K, longest ranking): position i of the ranking holds a relevant id
    seen there for the first time (for evidence: a chunk covering a span no earlier chunk
    covered; int, the number of such spans, when a chunk covers several). Positions past the
    longest ranking can hold no hit, so memory follows what was retrieved, not K."""
    n_relevant: np.ndarray
    """(n,) int: number of distinct relevant ids (for evidence: of spans)."""
    first_rank: np.ndarray
    """(n,) int: 1-based rank of the first relevant id (for evidence: of the first chunk matching
    any span) anywhere in the ranking; 0 if none."""
    empty_ranking: np.ndarray
    """(n,) bool: the system retrieved nothing."""
    unanswerable: np.ndarray
    """(n,) bool."""
    cited: np.ndarray
    """(n,) int: number of citations."""
    supported: np.ndarray
    """(n,) int: citations pointing at a relevant id (for evidence: at a chunk matching it)."""
    answer_correct: np.ndarray
    """(n,) bool: all expected facts present (a refusal phrase for unanswerable cases)."""
    ok: np.ndarray
    """(n,) bool: the system call succeeded."""
    latency: np.ndarray
    """(n,) float seconds, NaN where unknown."""
    ttft: np.ndarray
    """(n,) float seconds to the first piece of a streamed answer, NaN where not streamed or failed."""
    unsupported: dict[int, list[int]] = field(default_factory=dict)
    """Case index -> its cited numbers that point at no relevant id (past the ranking included),
    in citation order; only cases with such a citation, and only where gold is ids (evidence is
    matched by text when a rationale names them)."""
    missing_facts: dict[int, list[int]] = field(default_factory=dict)
    """Case index -> the positions in ``expected_facts`` of the facts its answer lacks; only
    answerable cases missing one."""
    refusal_found: dict[int, int] = field(default_factory=dict)
    """Case index -> the position in the refusal phrases of the first one its answer holds; only
    unanswerable cases holding one."""


def normalize(text: str) -> str:
    """NFKC and case folding, so full-width digits and letter case do not fail a fact match."""
    return unicodedata.normalize("NFKC", text).casefold()


def build_inputs(
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    k: int,
    refusal_phrases: Sequence[str],
    match: Rule | None = None,
) -> OfflineInputs:
    """Reduce cases and system outputs to arrays; no scoring happens here. ``match``: the rule
    matching chunks to evidence (``dataset.match``; its defaults when None)."""
    n = len(cases)
    longest = max((len(r.output.ranked_ids) for r in results if r.output is not None), default=0)
    matcher = Matcher(match) if any(case.relevant for case in cases) else None
    if matcher is not None:  # evidence is matched by text: a ranking may be texts without ids
        longest = max(longest, max((len(r.output.contexts) for r in results if r.output is not None), default=0))
    width = min(k, longest)
    # Plain lists filled per case, turned into arrays once: setting numpy items one at a time
    # costs more than the work of the loop itself.
    n_relevant = [0] * n
    first_rank = [0] * n
    empty = [False] * n
    unanswerable = [False] * n
    cited = [0] * n
    supported = [0] * n
    correct = [False] * n
    ok = [False] * n
    latency = [math.nan] * n
    ttft = [math.nan] * n
    hit_rows: list[int] = []
    hit_cols: list[int] = []
    several: list[tuple[int, int, int]] = []  # (row, column, spans) of chunks covering several spans
    unsupported: dict[int, list[int]] = {}
    missing_facts: dict[int, list[int]] = {}
    refusal_found: dict[int, int] = {}
    refusals = [normalize(phrase) for phrase in refusal_phrases]
    # normalize() inlined with its two calls bound locally: it runs on every answer and fact.
    nfkc, fold = unicodedata.normalize, str.casefold
    normals: dict[str, str] = {}  # per distinct fact: a dataset's facts repeat across its cases
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        unanswerable[i] = case.unanswerable
        relevant = set(case.relevant_ids)
        n_relevant[i] = len(relevant) or len(case.relevant)
        output = result.output
        if result.error is not None or output is None:
            continue
        ok[i] = True
        if output.latency_seconds is not None:
            latency[i] = output.latency_seconds
        if output.ttft_seconds is not None:
            ttft[i] = output.ttft_seconds
        ranked = output.ranked_ids
        if case.relevant and matcher is not None:
            cited[i] = len(output.citations)
            if not ranked and not output.contexts:
                empty[i] = True
            else:
                ranks, gains, first_rank[i], supported[i] = matcher.reduce(case.relevant, output, k)
                if ranks:
                    hit_rows.extend([i] * len(ranks))
                    hit_cols.extend(ranks)
                    if gains is not None:  # a chunk covered several spans at once
                        several.extend((i, rank, gain) for rank, gain in zip(ranks, gains, strict=True) if gain > 1)
        elif not ranked:
            # Where gold is evidence, a system may retrieve texts without ids.
            empty[i] = matcher is None or not output.contexts
        elif relevant:
            seen: set[str] = set()
            first = 0
            for rank, item in enumerate(ranked):
                if rank >= k and first:
                    break
                if item in seen:
                    continue  # a repeated id earns nothing: counting it twice lifts nDCG above 1
                seen.add(item)
                if item in relevant:
                    if not first:
                        first = rank + 1
                    if rank < width:
                        hit_rows.append(i)
                        hit_cols.append(rank)
            first_rank[i] = first
        citations = output.citations
        if citations and not case.relevant:
            cited[i] = len(citations)
            size = len(ranked)
            bad = [c for c in citations if not (0 < c <= size and ranked[c - 1] in relevant)]
            supported[i] = len(citations) - len(bad)
            if bad:  # what the rationale names: recorded here rather than found again there
                unsupported[i] = bad
        answer = fold(nfkc("NFKC", output.answer))
        if case.unanswerable:
            for j, phrase in enumerate(refusals):
                if phrase in answer:
                    correct[i] = True
                    refusal_found[i] = j
                    break
        else:
            facts = case.expected_facts
            lacking: list[int] = []
            for j, fact in enumerate(facts):
                normal = normals.get(fact)
                if normal is None:
                    normal = normals[fact] = fold(nfkc("NFKC", fact))
                if normal not in answer:
                    lacking.append(j)
            correct[i] = bool(facts) and not lacking
            if lacking:
                missing_facts[i] = lacking
    hits = np.zeros((n, width), dtype=bool)
    hits[hit_rows, hit_cols] = True
    if several:
        hits = hits.astype(np.int64)
        hits[[row for row, _, _ in several], [col for _, col, _ in several]] = [gain for _, _, gain in several]
    return OfflineInputs(
        k,
        hits,
        np.array(n_relevant, dtype=np.int64),
        np.array(first_rank, dtype=np.int64),
        np.array(empty, dtype=bool),
        np.array(unanswerable, dtype=bool),
        np.array(cited, dtype=np.int64),
        np.array(supported, dtype=np.int64),
        np.array(correct, dtype=bool),
        np.array(ok, dtype=bool),
        np.array(latency, dtype=np.float64),
        np.array(ttft, dtype=np.float64),
        unsupported,
        missing_facts,
        refusal_found,
    )


# --- pure kernels -------------------------------------------------------------------------------


def recall_at_k(hits: np.ndarray, n_relevant: np.ndarray) -> np.ndarray:
    """Relevant ids in the top K over all relevant ids; NaN when there are none."""
    found = hits.sum(axis=1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n_relevant > 0, found / np.maximum(n_relevant, 1), np.nan)


def reciprocal_rank(first_rank: np.ndarray) -> np.ndarray:
    """1 / rank of the first relevant id (uncut); 0 when none was retrieved."""
    return np.where(first_rank > 0, 1.0 / np.maximum(first_rank, 1), 0.0)


def ndcg_at_k(hits: np.ndarray, n_relevant: np.ndarray, k: int | None = None) -> np.ndarray:
    """Binary nDCG@K: DCG of the hits over the DCG of an ideal top K (at most 1); NaN without
    relevant ids. Integer ``hits`` are gains (spans a chunk covers first).

    ``hits`` may be narrower than K (no ranking reached K); the ideal ranking still has K places.
    """
    k = hits.shape[1] if k is None else k
    deepest = min(k, int(n_relevant.max(initial=0)))
    discounts = 1.0 / np.log2(np.arange(2, max(hits.shape[1], deepest) + 2, dtype=np.float64))
    ideal_prefix = np.concatenate(([0.0], np.cumsum(discounts[:deepest])))
    dcg = hits @ discounts[: hits.shape[1]]
    ideal = ideal_prefix[np.minimum(n_relevant, deepest)]
    with np.errstate(divide="ignore", invalid="ignore"):
        # A chunk covering several spans at once gains for each, filling several ideal places
        # from one rank: such a ranking is as good as the ideal, never better.
        return np.where(ideal > 0, np.minimum(dcg / np.where(ideal > 0, ideal, 1.0), 1.0), np.nan)


def ratio_or(numerator: np.ndarray, denominator: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """numerator / denominator where the denominator is positive, else the fallback."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.maximum(denominator, 1), fallback)


def nearest_rank(values: np.ndarray, q: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least q% of values at or below it)."""
    finite = np.sort(values[np.isfinite(values)])
    if finite.size == 0:
        return None
    index = max(0, math.ceil(finite.size * q / 100.0) - 1)
    return float(finite[index])


# --- scorers: the article's rules for unanswerable cases and failed calls on top of the kernels ---


def _retrieval(inputs: OfflineInputs, scores: np.ndarray) -> np.ndarray:
    # An unanswerable case that retrieved nothing behaved correctly: 1.0 for its own row.
    scores = np.where(inputs.unanswerable, np.where(inputs.empty_ranking, 1.0, 0.0), scores)
    return np.where(inputs.ok, scores, np.nan)


def score_recall(inputs: OfflineInputs) -> np.ndarray:
    return _retrieval(inputs, recall_at_k(inputs.hits, inputs.n_relevant))


def score_mrr(inputs: OfflineInputs) -> np.ndarray:
    return _retrieval(inputs, reciprocal_rank(inputs.first_rank))


def score_ndcg(inputs: OfflineInputs) -> np.ndarray:
    return _retrieval(inputs, ndcg_at_k(inputs.hits, inputs.n_relevant, inputs.k))


def score_citation_precision(inputs: OfflineInputs) -> np.ndarray:
    # No citation: wrong for an answerable case, right for an unanswerable one (it should refuse).
    fallback = np.where(inputs.unanswerable, 1.0, 0.0)
    scores = ratio_or(inputs.supported.astype(np.float64), inputs.cited, fallback)
    return np.where(inputs.ok, scores, np.nan)


def score_answer_accuracy(inputs: OfflineInputs) -> np.ndarray:
    return np.where(inputs.ok, inputs.answer_correct.astype(np.float64), np.nan)


def run_p95(inputs: OfflineInputs, errored: np.ndarray) -> float | None:
    return nearest_rank(inputs.latency[inputs.ok], 95)


def run_ttft_p50(inputs: OfflineInputs, errored: np.ndarray) -> float | None:
    return nearest_rank(inputs.ttft[inputs.ok & np.isfinite(inputs.ttft)], 50)


def run_ttft_p95(inputs: OfflineInputs, errored: np.ndarray) -> float | None:
    return nearest_rank(inputs.ttft[inputs.ok & np.isfinite(inputs.ttft)], 95)


def run_error_rate(inputs: OfflineInputs, errored: np.ndarray) -> float | None:
    return float(errored.mean()) if errored.size else None
