"""Why each offline score is what it is: one sentence per case and metric, in the run's language.

Pure functions of the cases, their system outputs and their scores, beside the kernels of
:mod:`ragexp.metrics.offline` that computed the scores. The runner's scoring step calls
:func:`fill_rationales`, which writes them into ``CaseResult.rationale``: ``cases.jsonl``, the
trace assessments' ``rationale``, ``diff`` and the report read them from there.

They run on every case of a run, so each metric's rationales are built a column at a time, with
the run's words bound once: what the scoring step already found
(:class:`ragexp.metrics.offline.OfflineInputs`: the first relevant rank, the top-K hits, the
unsupported citations, the missing facts, the refusal phrase) is read from there rather than
searched for again, and a sentence that depends only on a few counts is built once per run and
shared by the cases.

Each rationale is also kept as a code (:mod:`ragexp.metrics.wording`): the phrases it is made of
and what fills them, which ``report --language`` and ``diff`` render in their own language. A
builder makes both at once, the code's parts shared by the cases whose sentence is shared.

Each builder sits in :data:`BUILDERS` under the metric it explains; a metric without one keeps the
rationale its own scorer gave (custom and judge metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp.metrics.evidence import Matcher, Rule
from ragexp.metrics.offline import OfflineInputs
from ragexp.metrics.population import covered
from ragexp.metrics.registry import REASON_KINDS, MetricSpec
from ragexp.metrics.wording import FIELDS, JOIN, SEP, CaseCodes, Code
from ragexp.phrases import PHRASES
from ragexp.records import Case, CaseResult, SystemOutput

LISTED = 8
"""Ids, facts or citations a rationale names before it says how many more there are."""
QUOTED = 40
"""Characters of a fact, a refusal phrase or a span a rationale quotes."""


@dataclass(slots=True)
class Run:
    """What the rationales of one run read: its cases, their outputs, what the scoring step
    reduced them to, and the run's words."""

    cases: Sequence[Case]
    outputs: Sequence[SystemOutput | None]
    """Per case: the system's output (None for a failed call: such a case gets no rationale)."""
    inputs: OfflineInputs
    language: str
    """``en`` or ``zh``."""
    words: dict[str, str]
    """The run language's phrases (:data:`ragexp.phrases.PHRASES`)."""
    refusals: Sequence[str]
    """The refusal phrases as configured, in the order :func:`ragexp.metrics.offline.build_inputs` matched them."""
    matcher: Matcher | None
    """Matches chunks to evidence spans; None when no case's gold is evidence."""
    sep: str
    """Between listed items: ``, `` (``、`` in Chinese)."""
    join: str
    """Between the parts of one rationale: ``; `` (``；`` in Chinese)."""
    memo: dict[tuple[object, ...], str] = field(default_factory=dict)
    """Sentences that depend only on a few counts, built once per run and shared by the cases."""
    cuts: dict[tuple[object, ...], tuple[str, str]] = field(default_factory=dict)
    """Phrases filled but for the one slot that differs by case, cut around it (see :meth:`cut`)."""
    codes: dict[tuple[object, ...], Code] = field(default_factory=dict)
    """The code of each sentence in :attr:`memo`, under the same key: one list the cases share."""

    def once(self, memo_key: tuple[object, ...], **values: object) -> str:
        """``words[memo_key[0]]`` filled with ``values``, kept under ``memo_key`` (the phrase and
        the counts the words depend on), its code (``[[key, *values]]``) under the same key in
        :attr:`codes`. The callers look in :attr:`memo` first: building the keyword arguments
        costs more than the lookup."""
        key = str(memo_key[0])
        said = self.memo[memo_key] = self.words[key].format(**values)
        self.codes[memo_key] = [[key, *(values[name] for name in FIELDS[key])]]
        return said

    def cut(self, memo_key: tuple[object, ...], slot: str, **values: object) -> tuple[str, str]:
        """``words[memo_key[0]]`` filled with ``values`` and cut around ``{slot}``, kept under
        ``memo_key``: filling in the case's own part is then an f-string, not a ``format``."""
        marked = self.words[str(memo_key[0])].format(**values, **{slot: "\0"})
        before, _, after = marked.partition("\0")
        self.cuts[memo_key] = before, after
        return before, after

    def listed(self, items: Sequence[str]) -> str:
        """``a, b, c`` (``a、b、c`` in Chinese), the first :data:`LISTED`, then how many more."""
        rest = len(items) - LISTED
        if rest <= 0:
            return self.sep.join(items)
        return self.sep.join(items[:LISTED]) + self.words["reason_more"].format(n=rest)

    def quoted(self, text: str) -> str:
        cut = text if len(text) <= QUOTED else text[: QUOTED - 1] + "…"
        return f"「{cut}」" if self.language == "zh" else f'"{cut}"'

    def retrieved(self, output: SystemOutput) -> tuple[str, Code]:
        """What an unanswerable case retrieved: the article's rule scores it on that alone."""
        n = len(output.ranked_ids) or len(output.contexts)
        key: tuple[object, ...] = ("reason_retrieved_some", n) if n else ("reason_retrieved_nothing",)
        said = self.memo.get(key) or (self.once(key, n=n) if n else self.once(key))
        return said, self.codes[key]

    def said(self, memo_key: tuple[object, ...], **values: object) -> tuple[str, Code]:
        """:meth:`once`'s sentence and code, from the memo when it holds them."""
        said = self.memo.get(memo_key) or self.once(memo_key, **values)
        return said, self.codes[memo_key]

    def span_ranks(self, case: Case, output: SystemOutput) -> list[int]:
        """Per evidence span: the 1-based rank of the first top-K chunk covering it, 0 if none."""
        assert self.matcher is not None  # called only where gold is evidence
        evidence = case.relevant
        texts = output.contexts
        docs = output.doc_ids if self.matcher.same_doc else []
        first = [0] * len(evidence)
        for rank in range(min(self.inputs.k, len(texts))):
            mask = self.matcher.mask(evidence, texts[rank], docs[rank] if rank < len(docs) else "")
            for j in range(len(evidence)):
                if mask >> j & 1 and not first[j]:
                    first[j] = rank + 1
        return first


Said = tuple[list[str], list[Code]]
"""One metric's rationales for the cases asked, in order: their texts and their codes."""

Column = Callable[[Run, Sequence[int], Sequence[float]], Said]
"""Builds one metric's rationales: for the cases at ``rows`` (each with an output and a score in
``values``, indexed by case), in that order."""


def _items(items: list[Any]) -> list[Any] | dict[str, Any]:
    """A code's list argument: the items, or the first :data:`LISTED` and how many more."""
    if len(items) <= LISTED:
        return items
    return {"items": items[:LISTED], "more": len(items) - LISTED}


def _cut(text: str) -> str:
    return text if len(text) <= QUOTED else text[: QUOTED - 1] + "…"


def recall_reasons(run: Run, rows: Sequence[int], values: Sequence[float]) -> Said:
    """The relevant ids found in the top K and those missed (with the rank of a missed one
    returned below K); for evidence, the spans covered and not, by document."""
    cases, outputs, k, words, sep, join = run.cases, run.outputs, run.inputs.k, run.words, run.sep, run.join
    memo, codes = run.memo, run.codes
    found_before, found_after = run.cut(("reason_found",), "items")
    missed_before, missed_after = run.cut(("reason_missed",), "items")
    not_retrieved = words["reason_not_retrieved"]
    not_retrieved_code = ["reason_not_retrieved"]
    evidence = run.matcher is not None
    said: list[str] = []
    coded: list[Code] = []
    for i in rows:
        case, output = cases[i], outputs[i]
        assert output is not None  # rows hold cases with an output
        if case.unanswerable:
            text, code = run.retrieved(output)
            said.append(text)
            coded.append(code)
            continue
        if evidence and case.relevant:
            text, code = _spans_reason(run, case, output)
            said.append(text)
            coded.append(code)
            continue
        ranked = output.ranked_ids
        found: list[str] = []
        missed: list[str] = []
        missed_code: list[Any] = []
        for item in dict.fromkeys(case.relevant_ids):
            # The first appearance of each relevant id, searched in C: rankings are walked in
            # Python once per run, by the scoring step.
            if item not in ranked:
                missed.append(f"{item} ({not_retrieved})")
                missed_code.append({"t": item, "p": not_retrieved_code})
                continue
            rank = ranked.index(item) + 1
            if rank > k:
                key: tuple[object, ...] = ("reason_below_k", rank)
                missed.append(f"{item} ({memo.get(key) or run.once(key, rank=rank, k=k)})")
                missed_code.append({"t": item, "p": codes[key][0]})
            else:
                found.append(f"{item} (#{rank})")
        n = len(found) + len(missed)
        key = ("reason_recall", len(found), n)
        text = memo.get(key) or run.once(key, found=len(found), n=n, k=k)
        code = codes[key]
        if found:
            listed = sep.join(found) if len(found) <= LISTED else run.listed(found)
            text = f"{text}{join}{found_before}{listed}{found_after}"
            code = (*code, ("reason_found", _items(found)))
        if missed:
            listed = sep.join(missed) if len(missed) <= LISTED else run.listed(missed)
            text = f"{text}{join}{missed_before}{listed}{missed_after}"
            code = (*code, ("reason_missed", _items(missed_code)))
        said.append(text)
        coded.append(code)
    return said, coded


def _spans_reason(run: Run, case: Case, output: SystemOutput) -> tuple[str, Code]:
    """Evidence-anchored recall: per document, how many of its spans a top-K chunk covered."""
    words = run.words
    first = run.span_ranks(case, output)
    docs: dict[str, list[int]] = {}
    for item, rank in zip(case.relevant, first, strict=True):
        docs.setdefault(item.doc, []).append(rank)
    covered_docs = [
        ["reason_doc_spans", doc, sum(1 for r in ranks if r), len(ranks)] for doc, ranks in docs.items() if any(ranks)
    ]
    missed = [(item.doc, _cut(item.span)) for item, rank in zip(case.relevant, first, strict=True) if not rank]
    found, n, k = sum(1 for r in first if r), len(first), run.inputs.k
    parts = [words["reason_spans"].format(found=found, n=n, k=k)]
    code: list[Sequence[Any]] = [["reason_spans", found, n, k]]
    if covered_docs:
        texts = [words["reason_doc_spans"].format(doc=doc, covered=c, n=m) for _, doc, c, m in covered_docs]
        parts.append(words["reason_covered"].format(items=run.listed(texts)))
        code.append(["reason_covered", _items([{"p": part} for part in covered_docs])])
    if missed:
        texts = [f"{doc} {run.quoted(span)}" for doc, span in missed]
        parts.append(words["reason_not_covered"].format(items=run.listed(texts)))
        code.append(["reason_not_covered", _items([{"t": doc, "q": span} for doc, span in missed])])
    return run.join.join(parts), code


def mrr_reasons(run: Run, rows: Sequence[int], values: Sequence[float]) -> Said:
    """The rank of the first relevant id (for evidence: of the first chunk matching a span), or
    that the ranking holds none."""
    cases, outputs, memo, codes = run.cases, run.outputs, run.memo, run.codes
    first_rank = run.inputs.first_rank.tolist()
    cuts = run.cuts
    evidence = run.matcher is not None
    said: list[str] = []
    coded: list[Code] = []
    for i in rows:
        case, output = cases[i], outputs[i]
        assert output is not None  # rows hold cases with an output
        key: tuple[object, ...]
        if case.unanswerable:
            text, code = run.retrieved(output)
        elif evidence and case.relevant:
            score = values[i]
            if score > 0:
                text, code = run.said(("reason_first_chunk", round(1 / score)), rank=round(1 / score))
            else:
                text, code = run.said(("reason_no_relevant", len(output.contexts)), n=len(output.contexts))
        elif rank := first_rank[i]:
            key = ("reason_first", rank)
            before, after = cuts.get(key) or run.cut(key, "item", rank=rank)
            item = output.ranked_ids[rank - 1]
            text, code = f"{before}{item}{after}", (("reason_first", item, rank),)
        else:
            key = ("reason_no_relevant", len(output.ranked_ids))
            text = memo.get(key) or run.once(key, n=len(output.ranked_ids))
            code = codes[key]
        said.append(text)
        coded.append(code)
    return said, coded


def ndcg_reasons(run: Run, rows: Sequence[int], values: Sequence[float]) -> Said:
    """The ranks in the top K that gained, against the ideal ranking's."""
    cases, outputs, k = run.cases, run.outputs, run.inputs.k
    hits = run.inputs.hits
    gains = _packed_rows(hits)
    evidence = run.matcher is not None
    said: list[str] = []
    coded: list[Code] = []
    for i in rows:
        case, output = cases[i], outputs[i]
        assert output is not None  # rows hold cases with an output
        if case.unanswerable:
            text, code = run.retrieved(output)
        elif evidence and case.relevant:
            gained = sorted({rank for rank in run.span_ranks(case, output) if rank})
            text, code = _ndcg_words(run, min(len(case.relevant), k), gained)
        else:
            # The ranks that gained are the hits the scoring step kept: the case's packed row is the key.
            ideal = min(len(set(case.relevant_ids)), k)
            key = ("ndcg-row", ideal, gains[i])
            kept = run.memo.get(key)
            if kept is None:
                gained = [int(rank) + 1 for rank in np.flatnonzero(hits[i])]
                kept, run.codes[key] = _ndcg_words(run, ideal, gained)
                run.memo[key] = kept
            text = kept
            code = run.codes[key]
        said.append(text)
        coded.append(code)
    return said, coded


def _ndcg_words(run: Run, ideal: int, gained: list[int]) -> tuple[str, Code]:
    ranks = ", ".join(str(rank) for rank in gained) if gained else run.words["none"]
    key = ("reason_ndcg", ideal, *gained)
    text = run.memo.get(key) or run.once(key, ranks=ranks, k=run.inputs.k, ideal=ideal)
    code = run.codes[key] = [["reason_ndcg", {"ranks": gained}, run.inputs.k, ideal]]
    return text, code


def citation_reasons(run: Run, rows: Sequence[int], values: Sequence[float]) -> Said:
    """The cited numbers that do not point at a relevant id (or a chunk matching the evidence)."""
    cases, outputs, words, cuts, sep = run.cases, run.outputs, run.words, run.cuts, run.sep
    unsupported = run.inputs.unsupported
    no_such = words["reason_no_such_rank"]
    no_such_code = ["reason_no_such_rank"]
    evidence = run.matcher is not None
    said: list[str] = []
    coded: list[Code] = []
    for i in rows:
        case, output = cases[i], outputs[i]
        assert output is not None  # rows hold cases with an output
        citations = output.citations
        if not citations:
            key: tuple[object, ...] = (
                ("reason_no_citation_unanswerable",) if case.unanswerable else ("reason_no_citation",)
            )
            text, code = run.said(key)
            said.append(text)
            coded.append(code)
            continue
        bad: list[str]
        bad_code: list[Any]
        if values[i] == 1.0:  # every citation supports (the score says so)
            bad, bad_code = [], []
        elif evidence and case.relevant:
            bad, bad_code = _unsupported_spans(run, case, output)
        elif numbers := unsupported.get(i):
            ranked = output.ranked_ids
            size = len(ranked)
            bad = [f"[{c}] {ranked[c - 1]}" if 0 < c <= size else f"[{c}] ({no_such})" for c in numbers]
            bad_code = [
                text if 0 < c <= size else {"t": f"[{c}]", "p": no_such_code}
                for c, text in zip(numbers, bad, strict=True)
            ]
        else:
            bad, bad_code = [], []
        if bad:
            key = ("reason_citations_bad", len(bad), len(citations))
            before, after = cuts.get(key) or run.cut(key, "items", bad=len(bad), n=len(citations))
            said.append(f"{before}{sep.join(bad) if len(bad) <= LISTED else run.listed(bad)}{after}")
            coded.append([["reason_citations_bad", len(bad), len(citations), _items(bad_code)]])
        else:  # every citation supports: the words depend on the count alone
            text, code = run.said(("reason_citations_all", len(citations)), n=len(citations))
            said.append(text)
            coded.append(code)
    return said, coded


def _unsupported_spans(run: Run, case: Case, output: SystemOutput) -> tuple[list[str], list[Any]]:
    """The cited numbers whose chunk matches none of the case's evidence spans."""
    assert run.matcher is not None  # called only where gold is evidence
    size = len(output.contexts)
    docs = output.doc_ids if run.matcher.same_doc else []
    bad: list[str] = []
    code: list[Any] = []
    for cited in output.citations:
        if not 0 < cited <= size:
            bad.append(f"[{cited}] ({run.words['reason_no_such_rank']})")
            code.append({"t": f"[{cited}]", "p": ["reason_no_such_rank"]})
            continue
        doc = docs[cited - 1] if cited - 1 < len(docs) else ""
        if not run.matcher.mask(case.relevant, output.contexts[cited - 1], doc):
            bad.append(f"[{cited}]")
            code.append(f"[{cited}]")
    return bad, code


def accuracy_reasons(run: Run, rows: Sequence[int], values: Sequence[float]) -> Said:
    """The expected facts missing from the answer; for an unanswerable case, the refusal phrase found."""
    cases, memo, codes, cuts, sep = run.cases, run.memo, run.codes, run.cuts, run.sep
    missing_facts, refusal_found = run.inputs.missing_facts, run.inputs.refusal_found
    said: list[str] = []
    coded: list[Code] = []
    for i in rows:
        case = cases[i]
        key: tuple[object, ...]
        if case.unanswerable:
            j = refusal_found.get(i)
            if j is None:
                text, code = run.said(("reason_refusal_missing",))
            else:
                key = ("reason_refusal_found", j)
                kept = memo.get(key)
                if kept is None:
                    phrase = run.refusals[j]
                    kept = run.once(key, phrase=run.quoted(phrase))
                    codes[key] = [["reason_refusal_found", {"q": _cut(phrase)}]]
                text = kept
                code = codes[key]
            said.append(text)
            coded.append(code)
            continue
        expected = case.expected_facts
        lacking = missing_facts.get(i)
        if not expected:
            text, code = run.said(("reason_no_facts",))
        elif lacking:
            cut = [_cut(expected[j]) for j in lacking]
            missing = [run.quoted(fact) for fact in cut]
            key = ("reason_facts_missing", len(missing), len(expected))
            before, after = cuts.get(key) or run.cut(key, "items", missing=len(missing), n=len(expected))
            text = f"{before}{sep.join(missing) if len(missing) <= LISTED else run.listed(missing)}{after}"
            code = [["reason_facts_missing", len(missing), len(expected), _items([{"q": fact} for fact in cut])]]
        else:
            text, code = run.said(("reason_facts_all", len(expected)), n=len(expected))
        said.append(text)
        coded.append(code)
    return said, coded


_BY_KIND: dict[str, Column] = {
    "recall": recall_reasons,
    "rank": mrr_reasons,
    "ndcg": ndcg_reasons,
    "citation": citation_reasons,
    "accuracy": accuracy_reasons,
}
BUILDERS: dict[str, Column] = {name: _BY_KIND[kind] for name, kind in REASON_KINDS.items()}
"""Metric name -> the builder of its per-case rationales (the names are the registry's)."""


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
    ``results[i].rationale``, and its code into ``results[i].rationale_codes``; an unanswerable
    case on a metric whose mean leaves it out also names the rule that scored it. A case without
    a score (an error) gets none: its error says why.
    ``inputs``: what :func:`ragexp.metrics.offline.build_inputs` reduced these cases to (with the
    same ``refusal_phrases`` and ``match``; its K is the run's)."""
    chosen = [(spec, BUILDERS[spec.name]) for spec in specs if spec.name in BUILDERS and spec.name in scores]
    if not chosen:
        return
    language = language if language in ("en", "zh") else "en"
    words = {key: text[language] for key, text in PHRASES.items()}
    join = JOIN[language]
    run = Run(
        cases,
        [result.output for result in results],
        inputs,
        language,
        words,
        refusal_phrases,
        Matcher(match) if any(case.relevant for case in cases) else None,
        SEP[language],
        join,
    )
    rationales = [result.rationale for result in results]
    columns: dict[str, list[Code | None]] = {}
    answered = np.fromiter((output is not None for output in run.outputs), dtype=bool, count=len(results))
    flagged = {i: result.metric_errors for i, result in enumerate(results) if result.metric_errors}
    rule = words["unanswerable_row"]
    for spec, build in chosen:
        name = spec.name
        column = scores[name]
        rows = np.flatnonzero(answered & ~np.isnan(column)).tolist()  # a NaN score is an error: it says why
        if flagged:
            rows = [i for i in rows if name not in flagged.get(i, ())]
        values = column.tolist()
        texts, coded = build(run, rows, values)
        codes: list[Code | None] = [None] * len(results)
        columns[name] = codes
        for i, said, code in zip(rows, texts, coded, strict=True):
            rationales[i][name] = said
            codes[i] = code
        with_rule: dict[str, str] = {}
        for i in np.flatnonzero(~covered(spec, inputs.unanswerable)).tolist():
            own = rationales[i].get(name)
            if own is not None:
                if own not in with_rule:
                    with_rule[own] = f"{own}{join}{rule}"
                rationales[i][name] = with_rule[own]
                kept = codes[i]
                if kept is not None:
                    codes[i] = (*kept, ("unanswerable_row",))
    for i, result in enumerate(results):
        result.rationale_codes = CaseCodes(columns, i)


def _packed_rows(hits: np.ndarray) -> list[bytes]:
    """Each row of the hit matrix as bytes, in one pass over the array."""
    if hits.shape[1] == 0:
        return [b""] * hits.shape[0]
    packed = np.ascontiguousarray(np.packbits(hits != 0, axis=1))
    rows: list[bytes] = packed.view(np.dtype((np.void, packed.shape[1]))).ravel().tolist()  # type: ignore[assignment]
    return rows
