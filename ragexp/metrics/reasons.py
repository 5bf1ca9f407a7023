"""Why each offline score is what it is: one sentence per case and metric, in the run's language.

Pure functions of a case, its system output and its score, beside the kernels of
:mod:`ragexp.metrics.offline` that computed the score. The runner's scoring step calls
:func:`fill_rationales`, which writes them into ``CaseResult.rationale``: ``cases.jsonl``, the
trace assessments' ``rationale``, ``diff`` and the report read them from there. Plain string
building only: they run on every case of a run, so they cost a few microseconds each. What the
scoring step already reduced (:class:`ragexp.metrics.offline.OfflineInputs`: the first relevant
rank, the top-K hits) is read from there rather than walked again, and the words that depend only
on a few counts are built once per run.

Each builder sits in :data:`BUILDERS` under the metric it explains; a metric without one keeps the
rationale its own scorer gave (custom and judge metrics).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.metrics.evidence import Matcher, Rule
from ragexp.metrics.offline import OfflineInputs
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
    """One case as its rationales read it, with what the run's scoring step already reduced."""

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
    first_rank: Sequence[int]
    """Per case: :attr:`OfflineInputs.first_rank` (1-based, 0 for none)."""
    gains: Sequence[bytes]
    """Per case: its row of :attr:`OfflineInputs.hits` packed to bytes (equal rows, equal bytes)."""
    hits: np.ndarray
    """:attr:`OfflineInputs.hits`, read for a row whose words are not yet in :attr:`memo`."""
    index: int = 0
    """The case's position in the run."""
    sep: str = ", "
    """Between listed items: ``, `` (``、`` in Chinese)."""
    join: str = "; "
    """Between the parts of one rationale: ``; `` (``；`` in Chinese)."""
    around: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A phrase with one ``{items}`` slot split around it once per run: filling it is a concatenation."""

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
    rest = len(items) - LISTED
    if rest <= 0:
        return facts.sep.join(items)
    return facts.sep.join(items[:LISTED]) + facts.words["reason_more"].format(n=rest)


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
    case, k = facts.case, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        return _spans_reason(facts, score)
    ranked = facts.output.ranked_ids
    memo = facts.memo
    found: list[str] = []
    missed: list[str] = []
    for item in dict.fromkeys(case.relevant_ids):
        # The first appearance of each relevant id, searched in C: rankings are walked in
        # Python once per run, by the scoring step.
        if item not in ranked:
            missed.append(f"{item} ({facts.words['reason_not_retrieved']})")
            continue
        rank = ranked.index(item) + 1
        if rank > k:
            below = memo.get(("below", rank))
            if below is None:
                below = memo["below", rank] = facts.words["reason_below_k"].format(rank=rank, k=k)
            missed.append(f"{item} ({below})")
        else:
            found.append(f"{item} (#{rank})")
    n = len(found) + len(missed)
    said = memo.get(("recall", len(found), n))
    if said is None:
        said = memo["recall", len(found), n] = facts.words["reason_recall"].format(found=len(found), n=n, k=k)
    if found:
        before, after = facts.around["reason_found"]
        listed = facts.sep.join(found) if len(found) <= LISTED else _listed(found, facts)
        said = f"{said}{facts.join}{before}{listed}{after}"
    if missed:
        before, after = facts.around["reason_missed"]
        listed = facts.sep.join(missed) if len(missed) <= LISTED else _listed(missed, facts)
        said = f"{said}{facts.join}{before}{listed}{after}"
    return said


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
    rank = facts.first_rank[facts.index]
    if not rank:
        return facts.words["reason_no_relevant"].format(n=len(facts.output.ranked_ids))
    return facts.words["reason_first"].format(item=facts.output.ranked_ids[rank - 1], rank=rank)


def ndcg_reason(facts: Facts, score: float) -> str:
    """The ranks in the top K that gained, against the ideal ranking's."""
    case, k = facts.case, facts.k
    if case.unanswerable:
        return _retrieved(facts)
    if case.relevant and facts.matcher is not None:
        gained = sorted({rank for rank in facts.span_ranks() if rank})
        return _ndcg_words(facts, min(len(case.relevant), k), gained)
    # The ranks that gained are the hits the scoring step kept: the case's packed row is the key.
    ideal = min(len(set(case.relevant_ids)), k)
    said = facts.memo.get(("ndcg-row", ideal, facts.gains[facts.index]))
    if said is None:
        gained = [int(rank) + 1 for rank in np.flatnonzero(facts.hits[facts.index])]
        said = facts.memo["ndcg-row", ideal, facts.gains[facts.index]] = _ndcg_words(facts, ideal, gained)
    return said


def _ndcg_words(facts: Facts, ideal: int, gained: list[int]) -> str:
    key = ("ndcg", ideal, *gained)
    said = facts.memo.get(key)
    if said is None:
        ranks = ", ".join(str(rank) for rank in gained) if gained else facts.words["none"]
        said = facts.memo[key] = facts.words["reason_ndcg"].format(ranks=ranks, k=facts.k, ideal=ideal)
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
    expected = case.expected_facts
    if score == 1.0 and not case.unanswerable:  # every fact found (the score says so)
        return _facts_all(facts, len(expected))
    nfkc, fold = unicodedata.normalize, str.casefold  # _fold inlined: it runs on every answer and fact
    answer = fold(nfkc("NFKC", facts.output.answer))
    if case.unanswerable:
        for phrase, folded in facts.refusals:
            if folded in answer:
                return facts.words["reason_refusal_found"].format(phrase=_quoted(phrase, language))
        return facts.words["reason_refusal_missing"]
    if not expected:
        return facts.words["reason_no_facts"]
    missing = [_quoted(fact, language) for fact in expected if fold(nfkc("NFKC", fact)) not in answer]
    if not missing:
        return _facts_all(facts, len(expected))
    return facts.words["reason_facts_missing"].format(
        missing=len(missing), n=len(expected), items=_listed(missing, facts)
    )


def _facts_all(facts: Facts, n: int) -> str:
    said = facts.memo.get(("facts", n))
    if said is None:
        said = facts.memo["facts", n] = facts.words["reason_facts_all"].format(n=n)
    return said


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
    inputs: OfflineInputs,
    *,
    refusal_phrases: Sequence[str],
    language: str,
    match: Rule | None = None,
) -> None:
    """Write each scored case's rationale of every offline metric with a builder into
    ``results[i].rationale``; an unanswerable case on a metric whose mean leaves it out also names
    the rule that scored it. A case without a score (an error) gets none: its error says why.
    ``inputs``: what :func:`ragexp.metrics.offline.build_inputs` reduced these cases to (its K is
    the run's)."""
    chosen = [(spec, BUILDERS[spec.name]) for spec in specs if spec.name in BUILDERS and spec.name in scores]
    if not chosen:
        return
    language = language if language in ("en", "zh") else "en"
    words = {key: text[language] for key, text in PHRASES.items()}
    rule = words["unanswerable_row"]
    join = "；" if language == "zh" else "; "
    columns = [
        (spec.name, build, scores[spec.name].tolist(), (~covered(spec, inputs.unanswerable)).tolist())
        for spec, build in chosen
    ]
    refusals = [(phrase, _fold(phrase)) for phrase in refusal_phrases]
    matcher = Matcher(match) if any(case.relevant for case in cases) else None
    first_rank, gains = inputs.first_rank.tolist(), _packed_rows(inputs.hits)
    around = {key: _around(words[key]) for key in ("reason_found", "reason_missed")}
    sep = "、" if language == "zh" else ", "
    facts: Facts | None = None
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        output = result.output
        if output is None:
            continue
        if facts is None:
            facts = Facts(
                case,
                output,
                inputs.k,
                language,
                refusals,
                matcher,
                words,
                {},
                first_rank,
                gains,
                inputs.hits,
                i,
                sep,
                join,
                around,
            )
        else:  # one object reused: building one per case costs as much as a rationale
            facts.case, facts.output, facts.index = case, output, i
        rationale = result.rationale
        errors = result.metric_errors
        for name, build, values, apart in columns:
            score = values[i]
            if score != score or (errors and name in errors):
                continue
            said = build(facts, score)
            rationale[name] = f"{said}{join}{rule}" if apart[i] else said


def _packed_rows(hits: np.ndarray) -> list[bytes]:
    """Each row of the hit matrix as bytes, in one pass over the array."""
    if hits.shape[1] == 0:
        return [b""] * hits.shape[0]
    packed = np.ascontiguousarray(np.packbits(hits != 0, axis=1))
    rows: list[bytes] = packed.view(np.dtype((np.void, packed.shape[1]))).ravel().tolist()  # type: ignore[assignment]
    return rows


def _around(phrase: str) -> tuple[str, str]:
    before, _, after = phrase.partition("{items}")
    return before, after
