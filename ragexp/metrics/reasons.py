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
from ragexp.metrics.registry import REASON_KINDS, MetricSpec
from ragexp.phrases import PHRASES
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
    words: dict[str, str]
    """The run language's phrases, looked up once per run (:data:`ragexp.phrases.PHRASES`)."""
    memo: dict[tuple[object, ...], str]
    """Rationales that depend only on a few counts, built once per run and shared by the cases."""
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


def _listed(items: Sequence[str], facts: Facts) -> str:
    """``a, b, c`` (``a、b、c`` in Chinese), the first :data:`LISTED`, then how many more."""
    shown = ("、" if facts.language == "zh" else ", ").join(items[:LISTED])
    rest = len(items) - LISTED
    return shown + facts.words["reason_more"].format(n=rest) if rest > 0 else shown


def _quoted(text: str, language: str) -> str:
    cut = text if len(text) <= QUOTED else text[: QUOTED - 1] + "…"
    return f"「{cut}」" if language == "zh" else f'"{cut}"'


def _retrieved(facts: Facts) -> str:
    """What an unanswerable case retrieved: the article's rule scores it on that alone."""
    n = len(facts.output.ranked_ids) or len(facts.output.contexts)
    if not n:
        return facts.words["reason_retrieved_nothing"]
    return facts.words["reason_retrieved_some"].format(n=n)


def recall_reason(facts: Facts, score: float) -> str:
    """The relevant ids found in the top K and those missed (with the rank of a missed one
    returned below K); for evidence, the spans covered and not, by document."""
    case, language, k = facts.case, facts.language, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        return _spans_reason(facts, score)
    ranks = facts.ranks()
    words = facts.words
    found: list[str] = []
    missed: list[str] = []
    for item in dict.fromkeys(case.relevant_ids):
        rank = ranks.get(item)
        if rank is None:
            missed.append(f"{item} ({words['reason_not_retrieved']})")
        elif rank > k:
            missed.append(f"{item} ({words['reason_below_k'].format(rank=rank, k=k)})")
        else:
            found.append(f"{item} (#{rank})")
    parts = [words["reason_recall"].format(found=len(found), n=len(found) + len(missed), k=k)]
    if found:
        parts.append(facts.words["reason_found"].format(items=_listed(found, facts)))
    if missed:
        parts.append(facts.words["reason_missed"].format(items=_listed(missed, facts)))
    return ("；" if language == "zh" else "; ").join(parts)


def _spans_reason(facts: Facts, score: float) -> str:
    """Evidence-anchored recall: per document, how many of its spans a top-K chunk covered."""
    language = facts.language
    first = facts.span_ranks()
    docs: dict[str, list[int]] = {}
    for item, rank in zip(facts.case.relevant, first, strict=True):
        docs.setdefault(item.doc, []).append(rank)
    covered_docs = [
        facts.words["reason_doc_spans"].format(doc=doc, covered=sum(1 for r in ranks if r), n=len(ranks))
        for doc, ranks in docs.items()
        if any(ranks)
    ]
    missed = [
        f"{item.doc} {_quoted(item.span, language)}"
        for item, rank in zip(facts.case.relevant, first, strict=True)
        if not rank
    ]
    parts = [facts.words["reason_spans"].format(found=sum(1 for r in first if r), n=len(first), k=facts.k)]
    if covered_docs:
        parts.append(facts.words["reason_covered"].format(items=_listed(covered_docs, facts)))
    if missed:
        parts.append(facts.words["reason_not_covered"].format(items=_listed(missed, facts)))
    return ("；" if language == "zh" else "; ").join(parts)


def mrr_reason(facts: Facts, score: float) -> str:
    """The rank of the first relevant id (for evidence: of the first chunk matching a span), or
    that the ranking holds none."""
    case = facts.case
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        if score > 0:
            return facts.words["reason_first_chunk"].format(rank=round(1 / score))
        return facts.words["reason_no_relevant"].format(n=len(facts.output.contexts))
    ranks = facts.ranks()
    if not ranks:
        return facts.words["reason_no_relevant"].format(n=len(facts.output.ranked_ids))
    item, rank = min(ranks.items(), key=lambda pair: pair[1])
    return facts.words["reason_first"].format(item=item, rank=rank)


def ndcg_reason(facts: Facts, score: float) -> str:
    """The ranks in the top K that gained, against the ideal ranking's."""
    case, k = facts.case, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        gained = sorted({rank for rank in facts.span_ranks() if rank})
        n = len(case.relevant)
    else:
        gained = sorted(rank for rank in facts.ranks().values() if rank <= k)
        n = len(set(case.relevant_ids))
    ideal = min(n, k)
    key = ("ndcg", ideal, *gained)
    said = facts.memo.get(key)
    if said is None:
        ranks = ", ".join(str(rank) for rank in gained) if gained else facts.words["none"]
        said = facts.memo[key] = facts.words["reason_ndcg"].format(ranks=ranks, k=k, ideal=ideal)
    return said


def citation_reason(facts: Facts, score: float) -> str:
    """The cited numbers that do not point at a relevant id (or a chunk matching the evidence)."""
    case, output = facts.case, facts.output
    citations = output.citations
    if not citations:
        key = "reason_no_citation_unanswerable" if case.unanswerable else "reason_no_citation"
        return facts.words[key]
    if score == 1.0:  # every citation supports (the score says so): the words depend on the count alone
        said = facts.memo.get(("citations", len(citations)))
        if said is None:
            said = facts.memo["citations", len(citations)] = facts.words["reason_citations_all"].format(
                n=len(citations)
            )
        return said
    size = len(output.contexts) if case.relevant else len(output.ranked_ids)
    relevant = set(case.relevant_ids)
    docs = output.doc_ids if facts.matcher is not None and facts.matcher.same_doc else []
    bad = []
    for cited in citations:
        if not 0 < cited <= size:
            bad.append(f"[{cited}] ({facts.words['reason_no_such_rank']})")
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
        return facts.words["reason_citations_all"].format(n=len(citations))
    return facts.words["reason_citations_bad"].format(bad=len(bad), n=len(citations), items=_listed(bad, facts))


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def accuracy_reason(facts: Facts, score: float) -> str:
    """The expected facts missing from the answer; for an unanswerable case, the refusal phrase found."""
    case, language = facts.case, facts.language
    if score == 1.0 and not case.unanswerable:  # every fact found (the score says so)
        n = len(case.expected_facts)
        said = facts.memo.get(("facts", n))
        if said is None:
            said = facts.memo["facts", n] = facts.words["reason_facts_all"].format(n=n)
        return said
    answer = _fold(facts.output.answer)
    if case.unanswerable:
        for phrase, folded in facts.refusals:
            if folded in answer:
                return facts.words["reason_refusal_found"].format(phrase=_quoted(phrase, language))
        return facts.words["reason_refusal_missing"]
    expected = case.expected_facts
    if not expected:
        return facts.words["reason_no_facts"]
    missing = [_quoted(fact, language) for fact in expected if _fold(fact) not in answer]
    if not missing:
        return facts.words["reason_facts_all"].format(n=len(expected))
    return facts.words["reason_facts_missing"].format(
        missing=len(missing), n=len(expected), items=_listed(missing, facts)
    )


_BY_KIND: dict[str, Callable[[Facts, float], str]] = {
    "recall": recall_reason,
    "rank": mrr_reason,
    "ndcg": ndcg_reason,
    "citation": citation_reason,
    "accuracy": accuracy_reason,
}
BUILDERS: dict[str, Callable[[Facts, float], str]] = {name: _BY_KIND[kind] for name, kind in REASON_KINDS.items()}
"""Metric name -> the builder of its per-case rationale (the names are the registry's)."""


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
    words = {key: text[language] for key, text in PHRASES.items()}
    rule = words["unanswerable_row"]
    join = "；" if language == "zh" else "; "
    outside = {spec.name: ~covered(spec, unanswerable) for spec, _ in chosen}
    columns = [(spec.name, build, scores[spec.name].tolist(), outside[spec.name].tolist()) for spec, build in chosen]
    refusals = [(phrase, _fold(phrase)) for phrase in refusal_phrases]
    matcher = Matcher(match) if any(case.relevant for case in cases) else None
    facts: Facts | None = None
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        output = result.output
        if output is None:
            continue
        if facts is None:
            facts = Facts(case, output, k, language, refusals, matcher, words, {})
        else:  # one object reused: building one per case costs as much as a rationale
            facts.case, facts.output, facts._ranks = case, output, None
        rationale = result.rationale
        errors = result.metric_errors
        for name, build, values, apart in columns:
            score = values[i]
            if score != score or (errors and name in errors):
                continue
            said = build(facts, score)
            rationale[name] = f"{said}{join}{rule}" if apart[i] else said
