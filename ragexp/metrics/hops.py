"""Per-hop retrieval metrics of multi-hop cases: each hop's gold (``Case.hops``) against the
system's retrieval call of the same position (``SystemOutput.retrievals``).

One Python pass reduces every hop of every case to three counts (gold in the top K, gold
anywhere, the rank of the first); the scores are ratios of those counts, as for a whole case
(:mod:`ragexp.metrics.offline`): recall@K, reciprocal rank, evidence recall (uncut). A hop the
system made no call for retrieved nothing (scored 0, it missed); a case whose reply reported no
calls at all is an error for its per-hop metrics, never a 0. ``first_failing_hop`` is the first
hop whose gold is not all in the top K of its call (0 when none is); ``retrieval_calls`` and
``redundant_calls`` count the calls and those that repeat an earlier query or return nothing new.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.metrics.evidence import Matcher, Rule
from ragexp.metrics.registry import (
    FIRST_FAILING_HOP,
    HOP_BASES,
    HOP_COST,
    HOP_EVIDENCE,
    HOP_MRR,
    HOP_RECALL,
    HOP_SECONDS,
    HOP_TOKENS,
    REDUNDANT_CALLS,
    RETRIEVAL_CALLS,
    MetricSpec,
    hop_name,
)
from ragexp.phrases import PHRASES
from ragexp.records import Case, CaseResult, Hop, HopRetrieval, SystemOutput

QUOTED = 40
"""Characters of a hop's query a rationale quotes."""


@dataclass(slots=True)
class HopCounts:
    """Every hop of every case reduced to counts: (n, H) arrays, H the most hops of a case."""

    k: int
    gold: np.ndarray
    """(n, H) int: gold items of the hop (0: the case has no such hop)."""
    top: np.ndarray
    """(n, H) int: gold items in the top K of the hop's call."""
    anywhere: np.ndarray
    """(n, H) int: gold items anywhere in the hop's call."""
    first: np.ndarray
    """(n, H) int: 1-based rank of the first gold item in the hop's call; 0 if none."""
    called: np.ndarray
    """(n, H) bool: the system made a call for the hop."""
    scored: np.ndarray
    """(n,) bool: the case has hops and its reply reported its calls."""
    calls: np.ndarray
    """(n,) float: retrieval calls; NaN where the reply reported none."""
    redundant: np.ndarray
    """(n,) float: calls repeating an earlier query or returning nothing new; NaN as ``calls``."""
    reported: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-hop figure name (``hop_seconds.hop1``) -> (n,) what the system reported, NaN where not."""
    unreported: list[int] = field(default_factory=list)
    """Cases with hops whose reply reported no retrieval calls."""


def _query_key(query: str) -> str:
    return "".join(unicodedata.normalize("NFKC", query).casefold().split())


def count_hops(cases: Sequence[Case], results: Sequence[CaseResult], k: int, match: Rule | None = None) -> HopCounts:
    """Reduce each case's hops against its retrieval calls (no scoring here)."""
    n = len(cases)
    width = max((len(case.hops) for case in cases), default=0)
    gold = np.zeros((n, width), dtype=np.int64)
    top = np.zeros((n, width), dtype=np.int64)
    anywhere = np.zeros((n, width), dtype=np.int64)
    first = np.zeros((n, width), dtype=np.int64)
    called = np.zeros((n, width), dtype=bool)
    scored = np.zeros(n, dtype=bool)
    calls = np.full(n, np.nan)
    redundant = np.full(n, np.nan)
    reported: dict[str, list[float]] = {}
    unreported: list[int] = []
    matcher = Matcher(match) if any(hop.relevant for case in cases for hop in case.hops) else None
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        output = result.output
        if output is None or result.error is not None:
            continue
        retrievals = output.retrievals
        if retrievals is None:
            if case.hops:
                unreported.append(i)
            continue
        calls[i], redundant[i] = len(retrievals), _redundant(retrievals)
        for position, retrieval in enumerate(retrievals[:width]):
            for base, value in (
                (HOP_SECONDS, retrieval.latency_seconds),
                (HOP_TOKENS, retrieval.tokens),
                (HOP_COST, retrieval.cost),
            ):
                if value is not None:
                    reported.setdefault(hop_name(base, position + 1), [math.nan] * n)[i] = float(value)
        if not case.hops:
            continue
        scored[i] = True
        for h, hop in enumerate(case.hops):
            if h >= len(retrievals):
                gold[i, h] = len(hop.relevant_ids) or len(hop.relevant)
                continue
            called[i, h] = True
            gold[i, h], top[i, h], anywhere[i, h], first[i, h] = _reduce(hop, retrievals[h], k, matcher)
    return HopCounts(
        k,
        gold,
        top,
        anywhere,
        first,
        called,
        scored,
        calls,
        redundant,
        {name: np.array(values, dtype=np.float64) for name, values in reported.items()},
        unreported,
    )


def _reduce(hop: Hop, retrieval: HopRetrieval, k: int, matcher: Matcher | None) -> tuple[int, int, int, int]:
    """(gold items, in the top K, anywhere, rank of the first) of one hop's call."""
    if hop.relevant_ids:
        relevant = set(hop.relevant_ids)
        seen: set[str] = set()
        in_top = found = first = 0
        for rank, item in enumerate(retrieval.ranked_ids):
            if item in seen or item not in relevant:
                continue
            seen.add(item)
            found += 1
            if rank < k:
                in_top += 1
            if not first:
                first = rank + 1
        return len(relevant), in_top, found, first
    if matcher is None:  # pragma: no cover - a matcher is built whenever a hop gives evidence
        raise RuntimeError("evidence without a matcher")
    output = SystemOutput(retrieval.ranked_ids, retrieval.contexts, doc_ids=retrieval.doc_ids)
    size = max(len(retrieval.ranked_ids), len(retrieval.contexts))
    ranks, gains, first, _ = matcher.reduce(hop.relevant, output, k)
    every, every_gains, _, _ = matcher.reduce(hop.relevant, output, max(size, 1)) if size > k else (ranks, gains, 0, 0)
    in_top = sum(gains) if gains is not None else len(ranks)
    found = sum(every_gains) if every_gains is not None else len(every)
    return len(hop.relevant), in_top, found, first


def _redundant(retrievals: Sequence[HopRetrieval]) -> int:
    """Calls that repeat an earlier call's query, or whose every result an earlier call returned."""
    queries: set[str] = set()
    returned: set[str] = set()
    count = 0
    for retrieval in retrievals:
        key = _query_key(retrieval.query)
        items = retrieval.ranked_ids or retrieval.contexts
        if (key and key in queries) or (items and returned.issuperset(items)):
            count += 1
        queries.add(key)
        returned.update(items)
    return count


# --- pure kernels -------------------------------------------------------------------------------


def hop_scores(counts: HopCounts) -> dict[str, np.ndarray]:
    """Every per-hop score and the call counts, by logged name: NaN where a case has no such hop
    or no reported calls."""
    scores: dict[str, np.ndarray] = {}
    has = counts.scored[:, None] & (counts.gold > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = np.where(has, counts.top / np.maximum(counts.gold, 1), np.nan)
        evidence = np.where(has, counts.anywhere / np.maximum(counts.gold, 1), np.nan)
        rank = np.where(has, np.where(counts.first > 0, 1.0 / np.maximum(counts.first, 1), 0.0), np.nan)
    for h in range(counts.gold.shape[1]):
        scores[hop_name(HOP_RECALL, h + 1)] = recall[:, h]
        scores[hop_name(HOP_MRR, h + 1)] = rank[:, h]
        scores[hop_name(HOP_EVIDENCE, h + 1)] = evidence[:, h]
    scores[RETRIEVAL_CALLS] = counts.calls
    scores[REDUNDANT_CALLS] = counts.redundant
    return scores


def hop_columns(counts: HopCounts) -> dict[str, np.ndarray]:
    """What a run keeps case by case beside its scores, never averaged: ``first_failing_hop``
    and the figures the system reported per hop (``hop_seconds.hop1``...)."""
    return {FIRST_FAILING_HOP: first_failing(counts.top, counts.gold, counts.scored), **counts.reported}


def first_failing(top: np.ndarray, gold: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """(n,) the 1-based first hop whose gold is not all in its top K; 0 when every hop's is;
    NaN where the case is not scored."""
    failing = (gold > 0) & (top < gold)
    hop = np.where(failing.any(axis=1), failing.argmax(axis=1) + 1, 0).astype(np.float64)
    return np.where(scored, hop, np.nan)


# --- rationales ---------------------------------------------------------------------------------


def fill_hop_rationales(
    specs: Sequence[MetricSpec],
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    counts: HopCounts,
    language: str,
) -> None:
    """Write each scored case's rationale of every per-hop metric in ``specs`` (and of
    ``first_failing_hop``) into ``results[i].rationale``; a case whose reply reported no calls
    gets the error instead (``metric_errors``), never a score."""
    language = language if language in ("en", "zh") else "en"
    words = {key: text[language] for key, text in PHRASES.items() if key.startswith("hop_")}
    chosen = {spec.name for spec in specs}
    k = counts.k
    for i in counts.unreported:
        for name in chosen:
            if name.startswith(tuple(HOP_BASES)) or name in (RETRIEVAL_CALLS, REDUNDANT_CALLS):
                results[i].metric_errors[name] = words["hop_unreported"]
    for i in np.flatnonzero(counts.scored).tolist():
        case, output = cases[i], results[i].output
        retrievals = output.retrievals if output is not None else None
        if retrievals is None:  # pragma: no cover - a scored case reported its calls
            continue
        rationale = results[i].rationale
        failing = 0
        for h in range(len(case.hops)):
            hop = h + 1
            gold, top, anywhere, rank = (int(a[i, h]) for a in (counts.gold, counts.top, counts.anywhere, counts.first))
            if not counts.called[i, h]:
                said = words["hop_no_call"].format(hop=hop, calls=len(retrievals))
                recall_said = rank_said = evidence_said = said
            else:
                query = _quoted(retrievals[h].query)
                size = max(len(retrievals[h].ranked_ids), len(retrievals[h].contexts))
                recall_said = words["hop_recall"].format(hop=hop, query=query, found=top, gold=gold, k=k)
                rank_said = (
                    words["hop_rank"].format(hop=hop, query=query, rank=rank)
                    if rank
                    else words["hop_rank_none"].format(hop=hop, query=query, n=size)
                )
                evidence_said = words["hop_evidence"].format(hop=hop, query=query, found=anywhere, gold=gold, n=size)
            for base, said in ((HOP_RECALL, recall_said), (HOP_MRR, rank_said), (HOP_EVIDENCE, evidence_said)):
                name = hop_name(base, hop)
                if name in chosen:
                    rationale[name] = said
            if not failing and top < gold:
                failing = hop
                query = _quoted(retrievals[h].query) if counts.called[i, h] else "-"
                rationale[FIRST_FAILING_HOP] = words["hop_first_failing"].format(
                    hop=hop, k=k, found=top, gold=gold, query=query
                )
        if not failing:
            rationale[FIRST_FAILING_HOP] = words["hop_none_failing"].format(k=k, hops=len(case.hops))
        if RETRIEVAL_CALLS in chosen or REDUNDANT_CALLS in chosen:
            said = words["hop_calls"].format(calls=int(counts.calls[i]), redundant=int(counts.redundant[i]))
            for name in (RETRIEVAL_CALLS, REDUNDANT_CALLS):
                if name in chosen:
                    rationale[name] = said


def _quoted(query: str) -> str:
    text = " ".join(query.split())
    return repr(text if len(text) <= QUOTED else text[: QUOTED - 1] + "…")
