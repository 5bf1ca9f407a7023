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
    return "".join(query.casefold().split())


def count_hops(cases: Sequence[Case], results: Sequence[CaseResult], k: int, match: Rule | None = None) -> HopCounts:
    """Reduce each case's hops against its retrieval calls (no scoring here)."""
    n = len(cases)
    width = max((len(case.hops) for case in cases), default=0)
    # Plain lists filled per case, turned into arrays once (as build_inputs does): setting numpy
    # items one at a time costs more than the loop's own work.
    size = n * width  # flat, row i at i * width: one array conversion per count, no nested lists
    gold, top, anywhere, first = [0] * size, [0] * size, [0] * size, [0] * size
    called = [False] * size
    scored = [False] * n
    calls = [math.nan] * n
    redundant = [math.nan] * n
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
        made = len(retrievals)
        calls[i] = made
        redundant[i] = _redundant(retrievals) if made > 1 else 0
        for position, retrieval in enumerate(retrievals):
            if position < width and (
                retrieval.latency_seconds is not None or retrieval.tokens is not None or retrieval.cost is not None
            ):
                _report(reported, n, i, position + 1, retrieval)
        hops = case.hops
        if not hops:
            continue
        scored[i] = True
        at = i * width
        for h, hop in enumerate(hops):
            if h >= made:
                gold[at + h] = len(hop.relevant_ids) or len(hop.relevant)
                continue
            called[at + h] = True
            gold[at + h], top[at + h], anywhere[at + h], first[at + h] = _reduce(hop, retrievals[h], k, matcher)
    shape = (n, width)
    return HopCounts(
        k,
        np.array(gold, dtype=np.int64).reshape(shape),
        np.array(top, dtype=np.int64).reshape(shape),
        np.array(anywhere, dtype=np.int64).reshape(shape),
        np.array(first, dtype=np.int64).reshape(shape),
        np.array(called, dtype=bool).reshape(shape),
        np.array(scored, dtype=bool),
        np.array(calls, dtype=np.float64),
        np.array(redundant, dtype=np.float64),
        {name: np.array(values, dtype=np.float64) for name, values in reported.items()},
        unreported,
    )


def _report(reported: dict[str, list[float]], n: int, i: int, hop: int, retrieval: HopRetrieval) -> None:
    for base, value in (
        (HOP_SECONDS, retrieval.latency_seconds),
        (HOP_TOKENS, retrieval.tokens),
        (HOP_COST, retrieval.cost),
    ):
        if value is not None:
            reported.setdefault(hop_name(base, hop), [math.nan] * n)[i] = float(value)


def _reduce(hop: Hop, retrieval: HopRetrieval, k: int, matcher: Matcher | None) -> tuple[int, int, int, int]:
    """(gold items, in the top K, anywhere, rank of the first) of one hop's call."""
    ids = hop.relevant_ids
    if len(ids) == 1:  # the usual hop: one gold item, found by a scan in C
        try:
            position = retrieval.ranked_ids.index(ids[0])
        except ValueError:
            return 1, 0, 0, 0
        return 1, int(position < k), 1, position + 1
    if ids:
        relevant = set(ids)
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
    if len(retrievals) < 2:
        return 0
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
    gets the error instead (``metric_errors``), never a score.

    They run on every case: a sentence is cut around its query once per run for each set of
    counts (hop, found, gold) and filled in by concatenation, as :mod:`ragexp.metrics.reasons` does."""
    language = language if language in ("en", "zh") else "en"
    words = {key: text[language] for key, text in PHRASES.items() if key.startswith("hop_")}
    chosen = {spec.name for spec in specs}
    k = counts.k
    for i in counts.unreported:
        for name in chosen:
            if name.startswith(tuple(HOP_BASES)) or name in (RETRIEVAL_CALLS, REDUNDANT_CALLS):
                results[i].metric_errors[name] = words["hop_unreported"]
    cuts: dict[tuple[object, ...], tuple[str, str]] = {}
    said: dict[tuple[object, ...], str] = {}

    def cut(key: tuple[object, ...], **values: object) -> tuple[str, str]:
        before, _, after = words[str(key[0])].format(query="\0", **values).partition("\0")
        cuts[key] = before, after
        return before, after

    width = counts.gold.shape[1]
    names = [
        tuple(
            hop_name(base, h + 1) if hop_name(base, h + 1) in chosen else None
            for base in (HOP_RECALL, HOP_MRR, HOP_EVIDENCE)
        )
        for h in range(width)
    ]
    with_calls = RETRIEVAL_CALLS in chosen or REDUNDANT_CALLS in chosen
    gold_rows, top_rows, any_rows = counts.gold.tolist(), counts.top.tolist(), counts.anywhere.tolist()
    first_rows, called_rows = counts.first.tolist(), counts.called.tolist()
    calls, redundant = counts.calls.tolist(), counts.redundant.tolist()
    for i in np.flatnonzero(counts.scored).tolist():
        case, output = cases[i], results[i].output
        retrievals = output.retrievals if output is not None else None
        if retrievals is None:  # pragma: no cover - a scored case reported its calls
            continue
        rationale = results[i].rationale
        gold, top, anywhere, first, called = gold_rows[i], top_rows[i], any_rows[i], first_rows[i], called_rows[i]
        failing = 0
        for h in range(len(case.hops)):
            hop = h + 1
            recall_name, rank_name, evidence_name = names[h]
            if not called[h]:
                key: tuple[object, ...] = ("hop_no_call", hop, len(retrievals))
                text = said.get(key) or said.setdefault(
                    key, words["hop_no_call"].format(hop=hop, calls=len(retrievals))
                )
                recall_said = rank_said = evidence_said = text
                query = "-"
            else:
                retrieval = retrievals[h]
                query = _quoted(retrieval.query)
                key = ("hop_recall", hop, top[h], gold[h])
                before, after = cuts.get(key) or cut(key, hop=hop, found=top[h], gold=gold[h], k=k)
                recall_said = before + query + after
                if rank_name is not None:
                    key = ("hop_rank", hop, first[h]) if first[h] else ("hop_rank_none", hop, len(retrieval.ranked_ids))
                    before, after = cuts.get(key) or cut(key, hop=hop, rank=first[h], n=len(retrieval.ranked_ids))
                    rank_said = before + query + after
                if evidence_name is not None:
                    size = max(len(retrieval.ranked_ids), len(retrieval.contexts))
                    key = ("hop_evidence", hop, anywhere[h], gold[h], size)
                    before, after = cuts.get(key) or cut(key, hop=hop, found=anywhere[h], gold=gold[h], n=size)
                    evidence_said = before + query + after
            if recall_name is not None:
                rationale[recall_name] = recall_said
            if rank_name is not None:
                rationale[rank_name] = rank_said
            if evidence_name is not None:
                rationale[evidence_name] = evidence_said
            if not failing and top[h] < gold[h]:
                failing = hop
                key = ("hop_first_failing", hop, top[h], gold[h])
                before, after = cuts.get(key) or cut(key, hop=hop, k=k, found=top[h], gold=gold[h])
                rationale[FIRST_FAILING_HOP] = before + query + after
        if not failing:
            key = ("hop_none_failing", len(case.hops))
            rationale[FIRST_FAILING_HOP] = said.get(key) or said.setdefault(
                key, words["hop_none_failing"].format(k=k, hops=len(case.hops))
            )
        if with_calls:
            key = ("hop_calls", calls[i], redundant[i])
            text = said.get(key) or said.setdefault(
                key, words["hop_calls"].format(calls=int(calls[i]), redundant=int(redundant[i]))
            )
            if RETRIEVAL_CALLS in chosen:
                rationale[RETRIEVAL_CALLS] = text
            if REDUNDANT_CALLS in chosen:
                rationale[REDUNDANT_CALLS] = text


def _quoted(query: str) -> str:
    text = query if len(query) <= QUOTED and query.isprintable() and "  " not in query else " ".join(query.split())
    return repr(text if len(text) <= QUOTED else text[: QUOTED - 1] + "…")
