"""Why each offline score is what it is: one sentence per case and metric, in the run's language.

Pure functions of a case, its system output and its score, beside the kernels of
:mod:`ragexp.metrics.offline` that computed the score. The runner's scoring step calls
:func:`fill_rationales`, which writes them into ``CaseResult.rationale``: ``cases.jsonl``, the
trace assessments' ``rationale``, ``diff`` and the report read them from there. Plain string
building only: they run on every case of a run, so they cost a few microseconds each.

Each builder sits in :data:`BUILDERS` under the metric it explains; a metric without one keeps the
rationale its own scorer gave (custom and judge metrics).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.metrics.evidence import Matcher, Rule
from ragexp.metrics.population import covered
from ragexp.metrics.registry import MetricSpec
from ragexp.phrases import t
from ragexp.records import Case, CaseResult, SystemOutput

LISTED = 8
"""Ids, facts or citations a rationale names before it says how many more there are."""
QUOTED = 40
"""Characters of a fact, a refusal phrase or a span a rationale quotes."""


@dataclass(slots=True)
class Facts:
    """One case as its rationales read it: the ranking reduced once, shared by recall, MRR and nDCG."""

    case: Case
    output: SystemOutput
    k: int
    language: str
    refusals: Sequence[tuple[str, str]]
    """The refusal phrases as configured, each with its folded form (the one matched)."""
    matcher: Matcher | None
    _ranks: dict[str, int] | None = field(default=None)

    def ranks(self) -> dict[str, int]:
        """Relevant id -> 1-based rank of its first appearance in the whole ranking (uncut)."""
        if self._ranks is None:
            relevant = set(self.case.relevant_ids)
            found: dict[str, int] = {}
            if relevant:
                for rank, item in enumerate(self.output.ranked_ids, 1):
                    if item in relevant and item not in found:
                        found[item] = rank
                        if len(found) == len(relevant):
                            break
            self._ranks = found
        return self._ranks

    def span_ranks(self) -> list[int]:
        """Per evidence span: the 1-based rank of the first top-K chunk covering it, 0 if none."""
        evidence = self.case.relevant
        if self.matcher is None:
            return [0] * len(evidence)
        texts = self.output.contexts
        docs = self.output.doc_ids if self.matcher.same_doc else []
        first = [0] * len(evidence)
        for rank in range(min(self.k, len(texts))):
            mask = self.matcher.mask(evidence, texts[rank], docs[rank] if rank < len(docs) else "")
            for j in range(len(evidence)):
                if mask >> j & 1 and not first[j]:
                    first[j] = rank + 1
        return first


def _listed(items: Sequence[str], language: str) -> str:
    """``a, b, c`` (``a、b、c`` in Chinese), the first :data:`LISTED`, then how many more."""
    shown = ("、" if language == "zh" else ", ").join(items[:LISTED])
    rest = len(items) - LISTED
    return shown + t("reason_more", language, n=rest) if rest > 0 else shown


def _quoted(text: str, language: str) -> str:
    cut = text if len(text) <= QUOTED else text[: QUOTED - 1] + "…"
    return f"「{cut}」" if language == "zh" else f'"{cut}"'


def _retrieved(facts: Facts) -> str:
    """What an unanswerable case retrieved: the article's rule scores it on that alone."""
    n = len(facts.output.ranked_ids) or len(facts.output.contexts)
    if not n:
        return t("reason_retrieved_nothing", facts.language)
    return t("reason_retrieved_some", facts.language, n=n)


def recall_reason(facts: Facts, score: float) -> str:
    """The relevant ids found in the top K and those missed (with the rank of a missed one
    returned below K); for evidence, the spans covered and not, by document."""
    case, language, k = facts.case, facts.language, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        return _spans_reason(facts, score)
    ranks = facts.ranks()
    relevant = list(dict.fromkeys(case.relevant_ids))
    found = [f"{item} (#{ranks[item]})" for item in relevant if item in ranks and ranks[item] <= k]
    missed = []
    for item in relevant:
        rank = ranks.get(item)
        if rank is None:
            missed.append(f"{item} ({t('reason_not_retrieved', language)})")
        elif rank > k:
            missed.append(f"{item} ({t('reason_below_k', language, rank=rank, k=k)})")
    head = t("reason_recall", language, found=len(found), n=len(relevant), k=k)
    parts = [head]
    if found:
        parts.append(t("reason_found", language, items=_listed(found, language)))
    if missed:
        parts.append(t("reason_missed", language, items=_listed(missed, language)))
    return ("；" if language == "zh" else "; ").join(parts)


def _spans_reason(facts: Facts, score: float) -> str:
    """Evidence-anchored recall: per document, how many of its spans a top-K chunk covered."""
    language = facts.language
    first = facts.span_ranks()
    docs: dict[str, list[int]] = {}
    for item, rank in zip(facts.case.relevant, first, strict=True):
        docs.setdefault(item.doc, []).append(rank)
    covered_docs = [
        t("reason_doc_spans", language, doc=doc, covered=sum(1 for r in ranks if r), n=len(ranks))
        for doc, ranks in docs.items()
        if any(ranks)
    ]
    missed = [
        f"{item.doc} {_quoted(item.span, language)}"
        for item, rank in zip(facts.case.relevant, first, strict=True)
        if not rank
    ]
    parts = [t("reason_spans", language, found=sum(1 for r in first if r), n=len(first), k=facts.k)]
    if covered_docs:
        parts.append(t("reason_covered", language, items=_listed(covered_docs, language)))
    if missed:
        parts.append(t("reason_not_covered", language, items=_listed(missed, language)))
    return ("；" if language == "zh" else "; ").join(parts)


def mrr_reason(facts: Facts, score: float) -> str:
    """The rank of the first relevant id (for evidence: of the first chunk matching a span), or
    that the ranking holds none."""
    case, language = facts.case, facts.language
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        if score > 0:
            return t("reason_first_chunk", language, rank=round(1 / score))
        return t("reason_no_relevant", language, n=len(facts.output.contexts))
    ranks = facts.ranks()
    if not ranks:
        return t("reason_no_relevant", language, n=len(facts.output.ranked_ids))
    item, rank = min(ranks.items(), key=lambda pair: pair[1])
    return t("reason_first", language, item=item, rank=rank)


def ndcg_reason(facts: Facts, score: float) -> str:
    """The ranks in the top K that gained, against the ideal ranking's."""
    case, language, k = facts.case, facts.language, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        gained = sorted({rank for rank in facts.span_ranks() if rank})
        n = len(case.relevant)
    else:
        gained = sorted(rank for rank in facts.ranks().values() if rank <= k)
        n = len(set(case.relevant_ids))
    ideal = min(n, k)
    ranks = ", ".join(str(rank) for rank in gained) if gained else t("none", language)
    return t("reason_ndcg", language, ranks=ranks, k=k, ideal=ideal)


def citation_reason(facts: Facts, score: float) -> str:
    """The cited numbers that do not point at a relevant id (or a chunk matching the evidence)."""
    case, output, language = facts.case, facts.output, facts.language
    citations = output.citations
    if not citations:
        key = "reason_no_citation_unanswerable" if case.unanswerable else "reason_no_citation"
        return t(key, language)
    size = len(output.contexts) if case.relevant else len(output.ranked_ids)
    relevant = set(case.relevant_ids)
    docs = output.doc_ids if facts.matcher is not None and facts.matcher.same_doc else []
    bad = []
    for cited in citations:
        if not 0 < cited <= size:
            bad.append(f"[{cited}] ({t('reason_no_such_rank', language)})")
            continue
        if case.relevant and facts.matcher is not None:
            position = cited - 1
            doc = docs[position] if position < len(docs) else ""
            ok = facts.matcher.mask(case.relevant, output.contexts[position], doc) > 0
            if not ok:
                bad.append(f"[{cited}]")
        elif output.ranked_ids[cited - 1] not in relevant:
            bad.append(f"[{cited}] {output.ranked_ids[cited - 1]}")
    if not bad:
        return t("reason_citations_all", language, n=len(citations))
    return t("reason_citations_bad", language, bad=len(bad), n=len(citations), items=_listed(bad, language))


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def accuracy_reason(facts: Facts, score: float) -> str:
    """The expected facts missing from the answer; for an unanswerable case, the refusal phrase found."""
    case, language = facts.case, facts.language
    answer = _fold(facts.output.answer)
    if case.unanswerable:
        for phrase, folded in facts.refusals:
            if folded in answer:
                return t("reason_refusal_found", language, phrase=_quoted(phrase, language))
        return t("reason_refusal_missing", language)
    expected = case.expected_facts
    if not expected:
        return t("reason_no_facts", language)
    missing = [_quoted(fact, language) for fact in expected if _fold(fact) not in answer]
    if not missing:
        return t("reason_facts_all", language, n=len(expected))
    return t("reason_facts_missing", language, missing=len(missing), n=len(expected), items=_listed(missing, language))


BUILDERS: dict[str, Callable[[Facts, float], str]] = {
    "recall_at_k": recall_reason,
    "mrr": mrr_reason,
    "ndcg_at_k": ndcg_reason,
    "citation_precision": citation_reason,
    "answer_accuracy": accuracy_reason,
}
"""Metric name -> the builder of its per-case rationale."""


def fill_rationales(
    specs: Sequence[MetricSpec],
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    scores: dict[str, np.ndarray],
    *,
    k: int,
    refusal_phrases: Sequence[str],
    language: str,
    match: Rule | None = None,
) -> None:
    """Write each scored case's rationale of every offline metric with a builder into
    ``results[i].rationale``; an unanswerable case on a metric whose mean leaves it out also names
    the rule that scored it. A case without a score (an error) gets none: its error says why."""
    chosen = [(spec, BUILDERS[spec.name]) for spec in specs if spec.name in BUILDERS and spec.name in scores]
    if not chosen:
        return
    language = language if language in ("en", "zh") else "en"
    unanswerable = np.fromiter((case.unanswerable for case in cases), dtype=bool, count=len(cases))
    rule = t("unanswerable_row", language)
    join = "；" if language == "zh" else "; "
    outside = {spec.name: ~covered(spec, unanswerable) for spec, _ in chosen}
    columns = [(spec.name, build, scores[spec.name].tolist(), outside[spec.name].tolist()) for spec, build in chosen]
    refusals = [(phrase, _fold(phrase)) for phrase in refusal_phrases]
    matcher = Matcher(match) if any(case.relevant for case in cases) else None
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        output = result.output
        if output is None:
            continue
        facts = Facts(case, output, k, language, refusals, matcher)
        rationale = result.rationale
        for name, build, values, apart in columns:
            score = values[i]
            if score != score or name in result.metric_errors:
                continue
            said = build(facts, score)
            rationale[name] = f"{said}{join}{rule}" if apart[i] else said
