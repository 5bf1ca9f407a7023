"""Gold anchored to documents (a case's ``relevant``): matching retrieved chunks to spans, the
metrics on evidence (hand-computed for sentence and window chunks, equal to the id metrics on
whole documents), the loader's and the documents' refusals, anchoring chunk-id gold, the sample
system's windows, comparability across chunkings, and services that name documents."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragexp.config.compose import compose
from ragexp.config.models import MatchConfig, ResponseMapping
from ragexp.datasets.audit import load_chunks
from ragexp.datasets.evidence import anchor_span, resolve_evidence, sentences
from ragexp.datasets.loader import MAX_ERRORS, load_dataset
from ragexp.errors import DatasetErrors, MetricError
from ragexp.metrics.evidence import Matcher
from ragexp.metrics.offline import build_inputs, score_citation_precision, score_mrr, score_ndcg, score_recall
from ragexp.providers.expressions import to_plain
from ragexp.providers.mapping import MappingError, compile_mapping
from ragexp.records import Case, CaseResult, Evidence, SystemOutput
from ragexp.sample import SampleSystem, Settings, load_docs
from ragexp.sample.system import windows
from ragexp.workflows.run_plan import plan_run
from ragexp.workflows.run_score import score_results
from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import serve
from tests.test_http import count_runs

KB = ROOT / "ragexp/data/kb_zh"
SERVERS = ROOT / "tests/servers"
RETRIEVAL = ("recall_at_k", "mrr", "ndcg_at_k", "citation_precision")

# A document of twenty distinct characters, so that overlaps are counted by eye: the span is its
# characters 6 to 16.
DOC = "甲乙丙丁戊己庚辛壬癸子丑寅卯辰巳午未申酉"
SPAN = DOC[6:16]  # 庚辛壬癸子丑寅卯辰巳: 10 characters, so a half is 5


def evidence_case(*items: tuple[str, str], cid: str = "c") -> Case:
    case = Case(cid, "q", [], [], None, False, 1)
    case.relevant = [Evidence(doc, span) for doc, span in items]
    return case


def scores(
    case: Case,
    texts: list[str],
    docs: list[str] | None = None,
    *,
    k: int = 5,
    citations: list[int] | None = None,
    **rule: Any,
) -> dict[str, float]:
    output = SystemOutput([f"chunk-{i}" for i in range(len(texts))], texts, "", citations or [])
    output.doc_ids = docs if docs is not None else []
    inputs = build_inputs([case], [CaseResult(case.id, output)], k, [], MatchConfig(**rule))
    return {
        "recall": float(score_recall(inputs)[0]),
        "mrr": float(score_mrr(inputs)[0]),
        "ndcg": float(score_ndcg(inputs)[0]),
        "citation": float(score_citation_precision(inputs)[0]),
        "hits": inputs.hits[0].tolist(),
    }


# --- the match rule ---------------------------------------------------------------------------


def test_the_match_rule_by_hand() -> None:
    matcher = Matcher(MatchConfig())
    assert matcher.covers(DOC, SPAN)  # the chunk holds the span
    # Written differently: full-width digits, extra and missing spaces, letter case.
    assert matcher.covers("退款：微信和支付宝 １-３ 个 工作日到账。", "微信和支付宝 1-3 个工作日到账")
    assert matcher.covers("Refunds arrive WITHIN seven\nworking days.", "within seven working days")
    # The chunk's end is the span's start: 4 of 10 characters is less than half, 5 is half.
    assert not matcher.covers(DOC[:10], SPAN)
    assert matcher.covers(DOC[:11], SPAN)
    # The chunk's start is the span's end: 6 of 10.
    assert matcher.covers(DOC[10:], SPAN)
    assert not matcher.covers(DOC[12:], SPAN)  # 4 of 10
    assert Matcher(MatchConfig(min_overlap=0.4)).covers(DOC[:10], SPAN)
    # The span holds the chunk: matched by share of the span, or by the chunk's own length.
    long_span = "".join(chr(0x4E00 + i) for i in range(50))
    assert matcher.covers(long_span[10:30], long_span)  # 20 characters: 40% of the span, but long enough
    assert not matcher.covers(long_span[10:22], long_span)  # 12 characters, 24%
    assert Matcher(MatchConfig(min_chunk_chars=12)).covers(long_span[10:22], long_span)
    # Sharing words is not overlapping: both end in 个工作日到账 (6 of 15 characters), at different places.
    assert not matcher.covers("银行卡 3-7 个工作日到账。", "微信和支付宝 1-3 个工作日到账")


def test_sentence_chunks_by_hand() -> None:
    doc = "审核通过后原路退回。微信和支付宝 1-3 个工作日到账。银行卡 3-7 个工作日到账。"
    one, two, three = (doc[start:end] for start, end in sentences(doc))
    case = evidence_case(("refund", "微信和支付宝 1-3 个工作日到账"))
    ranking = ["另一篇文档的句子。", three, two, one]
    docs = ["other", "refund", "refund", "refund"]
    got = scores(case, ranking, docs, k=5, citations=[2, 3])
    # Only the second sentence holds the span: rank 3.
    assert got["recall"] == 1.0 and got["mrr"] == pytest.approx(1 / 3)
    assert got["ndcg"] == pytest.approx(1 / math.log2(4))
    assert got["citation"] == 0.5  # [2] cites the third sentence, [3] the second
    assert got["hits"] == [False, False, True, False]
    cut = scores(case, ranking, docs, k=2)
    assert (cut["recall"], cut["ndcg"], cut["mrr"]) == (0.0, 0.0, pytest.approx(1 / 3))  # MRR is uncut


def test_a_span_split_across_two_windows_by_hand() -> None:
    first, second = windows(DOC, 10)  # 甲…癸 holds 4 of the span's 10 characters, 子…酉 the other 6
    assert (first, second) == (DOC[:10], DOC[10:])
    case = evidence_case(("d", SPAN))
    got = scores(case, [first, second], ["d", "d"], citations=[1])
    assert got["recall"] == 1.0 and got["mrr"] == 0.5
    assert got["ndcg"] == pytest.approx(1 / math.log2(3))
    assert got["citation"] == 0.0  # the cited window holds too little of the span to support it
    # With 40% enough, the first window covers the span and the second adds nothing.
    loose = scores(case, [first, second], ["d", "d"], citations=[1], min_overlap=0.4)
    assert (loose["recall"], loose["mrr"], loose["ndcg"], loose["citation"]) == (1.0, 1.0, 1.0, 1.0)
    assert loose["hits"] == [True, False]


def test_two_windows_covering_one_span_count_once_by_hand() -> None:
    pieces = windows(DOC, 12, 6)  # 0-12, 6-18, 12-20
    assert pieces == [DOC[:12], DOC[6:18], DOC[12:]]
    case = evidence_case(("d", SPAN))
    # The middle window holds the span, the first holds 6 of its 10 characters: both match.
    got = scores(case, [pieces[1], pieces[0], pieces[2]], ["d", "d", "d"], citations=[1, 2, 3])
    assert (got["recall"], got["mrr"], got["ndcg"]) == (1.0, 1.0, 1.0)
    assert got["hits"] == [True, False, False]  # one gain: the span is covered once
    assert got["citation"] == pytest.approx(2 / 3)  # the last window holds 4 of 10: it does not support
    # Two spans in one chunk: that chunk gains twice, and nDCG is at most 1.
    both = evidence_case(("d", DOC[:4]), ("d", DOC[14:18]))
    whole = scores(both, [DOC], ["d"])
    assert (whole["recall"], whole["ndcg"], whole["hits"]) == (1.0, 1.0, [2])
    late = scores(both, ["无关", DOC], ["x", "d"])
    discount = 1 / math.log2(3)
    assert late["ndcg"] == pytest.approx(2 * discount / (1 + discount)) and late["mrr"] == 0.5


def test_documents_decide_when_the_system_names_them() -> None:
    case = evidence_case(("refund", SPAN))
    # The same words in another document: not evidence when the system says where the chunk is from.
    assert scores(case, [DOC], ["copy"])["recall"] == 0.0
    assert scores(case, [DOC], ["refund"])["recall"] == 1.0
    # Without document ids text alone decides, and the copy counts: the cost of not naming documents.
    assert scores(case, [DOC])["recall"] == 1.0
    assert scores(case, [DOC], [""])["recall"] == 1.0  # this chunk's document is not said
    assert scores(case, [DOC], ["copy"], same_doc=False)["recall"] == 1.0
    # Some chunks' documents named, some not: each chunk by what is known of it.
    mixed = scores(case, [DOC, DOC], ["copy", ""])
    assert (mixed["recall"], mixed["mrr"]) == (1.0, 0.5)


def test_matching_by_text_agrees_with_positions_in_the_documents_on_random_windows() -> None:
    """Windows and spans are pieces of documents of distinct-enough characters: whether a window
    matches a span follows from where both lie in the document, which a plain per-case
    implementation computes from offsets alone; the text matcher, the hit matrix and the kernels
    must give the same scores on every case."""
    import random

    rng = random.Random(7)
    alphabet = [chr(0x4E00 + i) for i in range(3000)]
    docs = {f"d{n}": "".join(rng.choice(alphabet) for _ in range(rng.randint(40, 160))) for n in range(40)}
    cases, expected = [], []
    for index in range(1500):
        size, overlap = rng.choice([(12, 0), (16, 4), (30, 10), (60, 0)])
        pieces = [
            (doc, start, min(start + size, len(text)))
            for doc, text in docs.items()
            for start in range(0, max(len(text) - overlap, 1), size - overlap)
        ]
        wanted = []
        for _ in range(rng.randint(1, 3)):
            doc = rng.choice(sorted(docs))
            start = rng.randrange(0, len(docs[doc]) - 8)
            end = min(len(docs[doc]), start + rng.randint(4, 40))
            if (doc, start, end) not in wanted:
                wanted.append((doc, start, end))
        ranking = rng.sample(pieces, 6) + [p for p in pieces if p[0] == wanted[0][0]][: rng.randint(0, 3)]
        rng.shuffle(ranking)
        k = rng.choice([1, 3, 5, 10])
        citations = rng.sample(range(1, len(ranking) + 2), rng.randint(0, 3))
        named = rng.random() < 0.7

        def matches(piece: tuple[str, int, int], span: tuple[str, int, int]) -> bool:
            # Named or not, another document matches nothing: random documents share no run of
            # the characters an overlap needs.
            if piece[0] != span[0]:
                return False
            shared = min(piece[2], span[2]) - max(piece[1], span[1])
            inside = span[1] <= piece[1] and piece[2] <= span[2]
            return shared >= max(1, math.ceil(0.5 * (span[2] - span[1]))) or (inside and piece[2] - piece[1] >= 20)

        found = [{j for j, span in enumerate(wanted) if matches(piece, span)} for piece in ranking]
        covered: set[int] = set()
        dcg = 0.0
        for rank, hits in enumerate(found[:k]):
            fresh = hits - covered
            covered |= fresh
            dcg += len(fresh) / math.log2(rank + 2)
        ideal = sum(1 / math.log2(rank + 2) for rank in range(min(k, len(wanted))))
        first = next((rank + 1 for rank, hits in enumerate(found) if hits), 0)
        cited = [c for c in citations if c <= len(ranking) and found[c - 1]]
        expected.append(
            (
                len(covered) / len(wanted),
                1 / first if first else 0.0,
                min(dcg / ideal, 1.0),
                len(cited) / len(citations) if citations else 0.0,
            )
        )
        case = evidence_case(*((doc, docs[doc][start:end]) for doc, start, end in wanted), cid=f"c{index}")
        output = SystemOutput([f"{d}@{a}" for d, a, _ in ranking], [docs[d][a:b] for d, a, b in ranking], "", citations)
        output.doc_ids = [d for d, _, _ in ranking] if named else []
        cases.append((case, output, k))
    for (case, output, k), want in zip(cases, expected, strict=True):
        inputs = build_inputs([case], [CaseResult(case.id, output)], k, [], MatchConfig())
        got = (
            score_recall(inputs)[0],
            score_mrr(inputs)[0],
            score_ndcg(inputs)[0],
            score_citation_precision(inputs)[0],
        )
        assert got == pytest.approx(want), (case.id, got, want)


# --- equal to the id metrics on whole documents -------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["k=1"],
        ["k=3", "provider.system.sample.citations=all"],
        ["k=10", "provider.system.sample.rerank=false", "provider.system.sample.threshold=0"],
    ],
)
def test_evidence_metrics_equal_the_id_metrics_case_by_case_on_kb_zh(overrides: list[str]) -> None:
    by_ids = _scored(["dataset=kb_zh", *overrides])
    by_evidence = _scored(["dataset=kb_zh_spans", *overrides])
    for name in RETRIEVAL:
        assert np.array_equal(by_ids[name], by_evidence[name], equal_nan=True), name
    assert by_ids["recall_at_k"][np.isfinite(by_ids["recall_at_k"])].min() < 1  # the system misses some


def _scored(overrides: list[str]) -> dict[str, np.ndarray]:
    plan = plan_run(compose(["metrics=offline", *overrides]))
    results: list[CaseResult] = [CaseResult("", None)] * len(plan.dataset.cases)

    def keep(index: int, result: CaseResult) -> None:
        results[index] = result

    plan.provider.run(plan.dataset.cases, keep)
    return score_results(plan, results).scores


def test_kb_zh_evidence_is_verbatim_and_covers_every_answerable_case() -> None:
    ids = {case.id: case for case in load_dataset(KB / "cases.jsonl").cases}
    spans = load_dataset(KB / "evidence.jsonl")
    docs = load_chunks(KB / "docs.jsonl").texts
    assert [case.id for case in spans.cases] == list(ids)
    for case in spans.cases:
        assert (case.question, case.expected_facts) == (ids[case.id].question, ids[case.id].expected_facts)
        assert not case.relevant_ids
        if case.unanswerable:
            assert not case.relevant
            continue
        assert [item.doc for item in case.relevant] == ids[case.id].relevant_ids
        assert all(item.span in docs[item.doc] and item.span != docs[item.doc] for item in case.relevant[:1])
        assert all(any(fact in item.span for item in case.relevant) for fact in case.expected_facts)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        (
            {"relevant": "refund"},
            "relevant",
            "expected a list of {doc, span} or {doc, start, end} objects, got a string",
        ),
        ({"relevant": [{"span": "x"}]}, "relevant[0].doc", "required: the id of the document the evidence is in"),
        ({"relevant": [{"doc": "d"}]}, "relevant[0].start", "required: give span (the text) or start and end"),
        ({"relevant": [{"doc": "d", "span": " "}]}, "relevant[0].span", "must not be empty"),
        ({"relevant": [{"doc": "d", "span": "x", "start": 0}]}, "relevant[0]", "gives both span and offsets"),
        (
            {"relevant": [{"doc": "d", "start": 5, "end": 5}]},
            "relevant[0].end",
            "must be greater than start (5), got 5",
        ),
        ({"relevant": [{"doc": "d", "start": -1, "end": 5}]}, "relevant[0].start", "expected a non-negative integer"),
        ({"relevant": [{"doc": "d", "start": True, "end": 5}]}, "relevant[0].start", "expected a non-negative integer"),
        ({"relevant": [{"doc": "d", "text": "x"}]}, "relevant[0].text", "unknown key (expected doc, span, start, end)"),
        ({"relevant": [{"doc": "d", "span": "x"}, {"doc": "d", "span": "x"}]}, "relevant[1]", "repeats relevant[0]"),
        (
            {"relevant": [{"doc": "d", "span": "x"}], "relevant_ids": ["d"]},
            "relevant",
            "gives relevant_ids and relevant: a case gives its gold in one form, ids or evidence",
        ),
        (
            {"relevant": [{"doc": "d", "span": "x"}], "unanswerable": True},
            "relevant",
            "an unanswerable case must not have evidence",
        ),
        ({}, "relevant_ids", "an answerable case needs at least one relevant id, or evidence in 'relevant'"),
    ],
)
def test_the_loader_names_line_and_field_of_bad_evidence(
    tmp_path: Path, row: dict[str, Any], field: str, reason: str
) -> None:
    path = write_jsonl(
        tmp_path / "set.jsonl",
        [{"id": "ok", "question": "q", "relevant_ids": ["a"]}, {"id": "b", "question": "q", **row}],
    )
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    assert str(info.value.errors[0]).startswith(f"{path}:2: field '{field}': {reason}"), str(info.value.errors[0])


def documents(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"id": "refund", "text": "退款审核通过后原路退回：微信和支付宝 1-3 个工作日到账。"},
            {"id": "big-doc", "doc": "manual", "text": "第一章 安装。"},
            {"id": "big-doc#2", "doc": "manual", "text": "第二章 使用。"},
        ],
    )


def test_documents_refuse_what_cannot_be_right_and_nothing_runs(ragexp: Any, tmp_path: Path, store_uri: str) -> None:
    docs = documents(tmp_path)
    rows = [
        {"id": "fine", "question": "q", "relevant": [{"doc": "refund", "span": "1-3 个工作日到账"}]},
        {"id": "offsets", "question": "q", "relevant": [{"doc": "refund", "start": 12, "end": 29}]},
        {"id": "unknown", "question": "q", "relevant": [{"doc": "refunds", "span": "到账"}]},
        {"id": "paraphrase", "question": "q", "relevant": [{"doc": "refund", "span": "三个工作日到账"}]},
        {"id": "spacing", "question": "q", "relevant": [{"doc": "refund", "span": "1-3个工作日到账"}]},
        {"id": "past", "question": "q", "relevant": [{"doc": "refund", "start": 10, "end": 99}]},
        {"id": "chunks", "question": "q", "relevant": [{"doc": "manual", "span": "第二章 使用"}]},
        {"id": "chunk-offsets", "question": "q", "relevant": [{"doc": "manual", "start": 0, "end": 3}]},
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    checked = ragexp("validate", "--path", str(data), "--corpus", str(docs))
    assert checked.code == 1
    assert checked.stderr.splitlines() == [
        f"ragexp: {data}:3: field 'relevant[0].doc': unknown document 'refunds': not in {docs} "
        "(did you mean 'refund'?)",
        f"ragexp: {data}:4: field 'relevant[0].span': not in the text of document 'refund' (spans are verbatim "
        "text of their document)",
        f"ragexp: {data}:5: field 'relevant[0].span': not written as in document 'refund': it differs in white "
        "space, width or case (spans are verbatim)",
        f"ragexp: {data}:6: field 'relevant[0].end': 99 is past the end of document 'refund' (30 characters)",
        f"ragexp: {data}:8: field 'relevant[0].start': document 'manual' is only given as chunks in {docs}: "
        "offsets need its whole text",
    ]
    ran = ragexp("run", f"dataset.path={data}", f"dataset.corpus={docs}", "provider=fake", "metrics=retrieval")
    assert ran.code == 1 and ran.stderr.startswith(f"ragexp: error: {data}:3: field 'relevant[0].doc': unknown")
    assert "(and 4 more; see 'ragexp validate')" in ran.stderr
    # Offsets with no documents to read them from are refused too.
    offsets = write_jsonl(tmp_path / "offsets.jsonl", [rows[1]])
    alone = ragexp("run", f"dataset.path={offsets}", "dataset.corpus=null", "provider=fake", "metrics=retrieval")
    assert alone.code == 1 and alone.stderr.strip() == (
        f"ragexp: error: {offsets}:1: field 'relevant[0].start': offsets need the documents' text: "
        "set dataset.corpus to the documents file"
    )
    assert count_runs(store_uri) == 0


def test_offsets_are_read_into_text_and_the_hash_covers_evidence_and_rule(tmp_path: Path) -> None:
    docs = documents(tmp_path)
    row = {"id": "c", "question": "q", "relevant": [{"doc": "refund", "start": 12, "end": 29}]}
    data = load_dataset(write_jsonl(tmp_path / "set.jsonl", [row]))
    resolved = resolve_evidence(data, load_chunks(docs), MatchConfig(), corpus_key="dataset.corpus")
    assert resolved.cases[0].relevant == [Evidence("refund", "微信和支付宝 1-3 个工作日到账", 12, 29)]
    assert resolved.cases[0].labels()["relevant"] == [
        {"doc": "refund", "start": 12, "end": 29, "span": "微信和支付宝 1-3 个工作日到账"}
    ]
    # The same offsets into another text are other gold; another match rule is another measurement.
    edited = write_jsonl(
        tmp_path / "docs2.jsonl", [{"id": "refund", "text": "退款审核通过后原路退回：支付宝和微信 3-7 个工作日到账。"}]
    )
    other_text = resolve_evidence(data, load_chunks(edited), MatchConfig(), corpus_key="dataset.corpus")
    other_rule = resolve_evidence(data, load_chunks(docs), MatchConfig(min_overlap=0.8), corpus_key="dataset.corpus")
    hashes = {resolved.dataset_hash, other_text.dataset_hash, other_rule.dataset_hash}
    assert len(hashes) == 3
    # A set of ids keeps the hash it had: no evidence, no rule in it.
    ids = load_dataset(KB / "cases.jsonl")
    assert resolve_evidence(ids, load_chunks(KB / "docs.jsonl"), MatchConfig(min_overlap=0.8), corpus_key="x") is ids
    assert "relevant" not in ids.cases[0].labels()


def test_spans_against_a_large_document_normalise_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 spans written in another width than the document (a 4 MB one, and one given as 3 chunks):
    # each is refused, and each document's text is normalised once, not once per span.
    import ragexp.datasets.evidence as evidence

    filler = "退款审核通过后原路退回，银行卡三到七个工作日到账。" * 160_000
    spans = [f"ＳＫＵ-{n:03d}" for n in range(40)]
    big = filler + "".join(f"SKU-{n:03d}。" for n in range(40))
    parts = [filler[:1000] + "SKU-000。", "SKU-001。" + filler[:1000], "SKU-002。"]
    rows = [{"id": "big", "text": big}] + [{"id": f"p{i}", "doc": "parted", "text": t} for i, t in enumerate(parts)]
    corpus = load_chunks(write_jsonl(tmp_path / "docs.jsonl", rows))
    named = [("big", span) for span in spans] + [("parted", span) for span in spans[:3]]
    cases = [{"id": f"c{n}", "question": "q", "relevant": [{"doc": d, "span": s}]} for n, (d, s) in enumerate(named)]
    data = load_dataset(write_jsonl(tmp_path / "set.jsonl", cases))
    normalised: list[int] = []

    def counted(text: str) -> str:
        normalised.append(len(text))
        return evidence_normalize(text)

    evidence_normalize = evidence.normalize
    monkeypatch.setattr(evidence, "normalize", counted)
    with pytest.raises(DatasetErrors) as refused:
        resolve_evidence(data, corpus, MatchConfig(), corpus_key="dataset.corpus")
    assert normalised.count(len(big)) == 1
    assert sorted(n for n in normalised if n > len("ＳＫＵ-000")) == sorted([len(big), *map(len, parts)])
    assert len(refused.value.errors) == min(43, MAX_ERRORS)
    assert all("differs in white space, width or case" in error.reason for error in refused.value.errors)


def test_a_system_without_texts_is_refused_for_evidence(ragexp: Any, tmp_path: Path) -> None:
    rows = [
        {"id": "c", "question": "q", "relevant": [{"doc": "d", "span": "x"}], "retrieved_ids": ["d"], "response": "x"}
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    refused = ragexp("run", "provider=replay", f"dataset.path={data}", "dataset.corpus=null", "metrics=retrieval")
    assert refused.code == 1
    assert refused.stderr.strip() == (
        "ragexp: error: metric 'recall_at_k' matches the evidence of dataset set (its 'relevant' field) by the "
        "retrieved texts, which provider replay does not give for every case (response.contexts)"
    )
    with pytest.raises(MetricError):
        plan_run(compose(["provider=replay", f"dataset.path={data}", "dataset.corpus=null", "metrics=retrieval"]))


# --- services, pipelines and replays that give texts and documents -------------------------------


def test_a_replay_of_texts_without_ids_scores_evidence_and_doc_ids_round_trip(
    ragexp: Any, tmp_path: Path, store_uri: str
) -> None:
    rows = [
        {
            "id": "c1",
            "question": "q",
            "relevant": [{"doc": "d", "span": SPAN}],
            "response": "a",
            "retrieved_contexts": [DOC[:10], DOC[10:]],
            "retrieved_doc_ids": ["d", "d"],
        },
        {
            "id": "c2",
            "question": "q",
            "unanswerable": True,
            "response": "无法回答",
            "retrieved_contexts": [DOC],
            "retrieved_doc_ids": ["d"],
        },
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    result = ragexp(
        "run", "provider=replay", f"dataset.path={data}", "dataset.corpus=null", "metrics=retrieval", "--json"
    )
    assert result.code == 0, result.stderr
    summary = result.json()["summary"]
    # c1: the span's larger part is in the second text; c2 retrieved a text where it should find none.
    assert summary["recall_at_k"] == 1.0 and summary["mrr"] == 0.5
    from mlflow import MlflowClient

    folder = MlflowClient(store_uri).download_artifacts(result.json()["run_id"], "cases.jsonl", str(tmp_path / "rows"))
    saved = [json.loads(line) for line in Path(folder).read_text().splitlines()]
    assert saved[0]["output"]["doc_ids"] == ["d", "d"] and saved[1]["metrics"]["recall_at_k"] == 0.0
    output = SystemOutput(["a#1"], ["t"], "x", [1], 0.1, None)
    output.doc_ids = ["a"]
    assert SystemOutput.from_json(output.to_json(), 0.1) == output
    assert "doc_ids" not in SystemOutput(["a"]).to_json()


def test_a_reply_naming_chunks_without_their_texts_is_an_error_not_a_zero(ragexp: Any, tmp_path: Path) -> None:
    pipeline = tmp_path / "textless_rag.py"
    pipeline.write_text(
        "def answer(question):\n"
        "    if 'blind' in question:\n"
        "        return {'ranked_ids': ['d#1'], 'contexts': [], 'answer': 'x'}\n"
        f"    return {{'ranked_ids': ['d#1'], 'contexts': [{DOC!r}], 'doc_ids': ['d'], 'answer': 'x'}}\n",
        encoding="utf-8",
    )
    rows = [
        {"id": "seen", "question": "what?", "relevant": [{"doc": "d", "span": SPAN}]},
        {"id": "blind", "question": "blind?", "relevant": [{"doc": "d", "span": SPAN}]},
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    args = ["run", "system=python", "provider.system.target=textless_rag:answer", f"provider.system.path={tmp_path}"]
    result = ragexp(*args, f"dataset.path={data}", "dataset.corpus=null", "metrics=retrieval", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1 and payload["summary"]["recall_at_k"] == 1.0  # the blind case is no 0


def test_document_ids_of_another_kind_are_warned_about(ragexp: Any, tmp_path: Path) -> None:
    rows = [
        {
            "id": "c1",
            "question": "q",
            "relevant": [{"doc": "refund.md", "span": SPAN}],
            "response": "a",
            "retrieved_contexts": [DOC],
            "retrieved_doc_ids": ["6f1c-uuid"],
        },
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    base = ["run", "provider=replay", f"dataset.path={data}", "dataset.corpus=null", "metrics=retrieval", "--json"]
    warned = ragexp(*base)
    assert warned.code == 0 and warned.json()["summary"]["recall_at_k"] == 0.0
    assert "warning: the system named documents for 1 cases, none of them a document of the evidence" in warned.stderr
    by_text = ragexp(*base, "dataset.match.same_doc=false")
    assert by_text.json()["summary"]["recall_at_k"] == 1.0 and "warning" not in by_text.stderr


def test_the_mapping_reads_document_ids() -> None:
    mapping = compile_mapping(
        ResponseMapping(ranked_ids="hits[].id", contexts="hits[].text", doc_ids="hits[].doc"),
        "provider.system.response",
    )
    reply = {"hits": [{"id": "s1", "text": "t1", "doc": "A"}, {"id": 7, "text": "t2", "doc": 42}]}
    output = mapping.extract(reply, 0.1)
    assert output.doc_ids == ["A", "42"] and "retrieved_doc_ids" in mapping.fields()
    with pytest.raises(MappingError, match=r"doc_ids \('hits\[\]\.doc'\) has 1 items but the reply retrieved 2 chunks"):
        mapping.extract({"hits": [{"id": "s1", "text": "t1", "doc": "A"}, {"id": "s2", "text": "t2"}]}, 0.1)
    # A LlamaIndex node's source document is keyed by NodeRelationship.SOURCE, which JSON spells "1".
    from enum import Enum, auto

    class NodeRelationship(str, Enum):  # noqa: UP042 - LlamaIndex's own definition
        SOURCE = auto()

    assert to_plain({NodeRelationship.SOURCE: {"node_id": "doc-1"}}) == {"1": {"node_id": "doc-1"}}
    preset = compose(["system=llamaindex", "provider.system.target=a:b"]).provider.system.response
    assert preset is not None
    node = {"node": {"relationships": {"1": {"node_id": "guide.md"}}, "text": "t", "id_": "n1", "metadata": {}}}
    bare = {"node": {"relationships": {}, "text": "t", "id_": "n2", "metadata": {}}}
    read = compile_mapping(preset, "p").extract({"response": "a", "source_nodes": [node, bare]}, 0.1)
    assert read.doc_ids == ["guide.md", ""]


# --- the sample system's windows ---------------------------------------------------------------


def test_window_chunking_returns_the_windows_with_their_documents() -> None:
    docs = load_docs(KB / "docs.jsonl")
    system = SampleSystem(docs, Settings(chunking="window", chunk_chars=16, overlap=4))
    reply = system.answer("退款退到银行卡要几天？", 5)
    texts = {doc["id"]: doc["text"] for doc in docs}
    assert reply["ranked_ids"][0] == "refund-arrival#3"
    for chunk_id, text, doc in zip(reply["ranked_ids"], reply["contexts"], reply["doc_ids"], strict=True):
        number = int(chunk_id.rsplit("#", 1)[1])
        assert chunk_id.startswith(f"{doc}#") and text == windows(texts[doc], 16, 4)[number - 1]
        assert text in texts[doc] and len(text) <= 16
    assert windows("一二三四五六七八九十", 4, 1) == ["一二三四", "四五六七", "七八九十"]
    assert windows("一二三", 10) == ["一二三"]
    whole = SampleSystem(docs).answer("退款退到银行卡要几天？", 3)
    assert whole["doc_ids"] == whole["ranked_ids"]  # whole documents are their own documents
    with pytest.raises(ValueError, match="overlap"):
        Settings(chunking="window", chunk_chars=10, overlap=10)


@pytest.mark.system
def test_runs_of_different_chunkings_on_the_same_evidence_are_comparable(ragexp: Any) -> None:
    spans = "dataset=kb_zh_spans"
    doc = ragexp("run", spans, "--json")
    window = ragexp(
        "run",
        spans,
        "provider.system.sample.chunking=window",
        "provider.system.sample.chunk_chars=24",
        "provider.system.sample.overlap=8",
        "--json",
    )
    assert doc.code == window.code == 0, window.stderr
    assert doc.json()["dataset_hash"] == window.json()["dataset_hash"]
    assert doc.json()["config_hash"] != window.json()["config_hash"]
    compared = ragexp("diff", doc.json()["run_id"], window.json()["run_id"], "--json")
    assert compared.code == 0, compared.stderr
    assert compared.json()["comparable"] is True
    recall = next(m for m in compared.json()["metrics"] if m["name"] == "recall_at_k")
    assert 0 < window.json()["summary"]["recall_at_k"] < 1
    assert recall is not None
    # The same windows on chunk ids could match nothing (the ids name documents): refused, not scored 0.
    ids = ragexp(
        "run",
        "provider.system.sample.chunking=window",
        "provider.system.sample.chunk_chars=24",
        "provider.system.sample.overlap=8",
        "--json",
    )
    assert ids.code == 1 and "--anchor" in ids.stderr
    # Another match rule measures something else: not comparable.
    strict = ragexp("run", spans, "dataset.match.min_overlap=1.0", "--json")
    assert ragexp("diff", doc.json()["run_id"], strict.json()["run_id"]).code == 3


def test_the_fake_system_proves_the_evidence_chain(ragexp: Any) -> None:
    result = ragexp("run", "dataset=kb_zh_spans", "provider=fake", "--json")
    assert result.code == 0, result.stderr
    assert {name: result.json()["summary"][name] for name in RETRIEVAL} == dict.fromkeys(RETRIEVAL, 1.0)


# --- from chunk ids to evidence ---------------------------------------------------------------


def test_anchoring_round_trip_on_kb_zh(ragexp: Any, tmp_path: Path) -> None:
    out = tmp_path / "anchored.jsonl"
    result = ragexp("validate", "dataset=kb_zh", "--anchor", "--out", str(out), "--json")
    assert result.code == 0, result.stderr
    assert result.json() == {
        "out": str(out),
        "cases": 35,
        "anchored": 30,
        "spans_from_facts": 31,
        "spans_whole_chunk": 1,
    }
    original = {case.id: case for case in load_dataset(KB / "cases.jsonl").cases}
    anchored = load_dataset(out)
    texts = load_chunks(KB / "docs.jsonl").texts
    for case in anchored.cases:
        before = original[case.id]
        assert (case.question, case.expected_facts, case.reference, case.human) == (
            before.question,
            before.expected_facts,
            before.reference,
            before.human,
        )
        assert [item.doc for item in case.relevant] == before.relevant_ids and not case.relevant_ids
        for item in case.relevant:
            assert item.span in texts[item.doc]
    # Scored on whole documents, the anchored set gives the scores its ids gave, case by case.
    by_ids = _scored(["dataset=kb_zh", "k=3"])
    by_anchor = _scored(["dataset=kb_zh_spans", f"dataset.path={out}", "k=3"])
    for name in RETRIEVAL:
        assert np.array_equal(by_ids[name], by_anchor[name], equal_nan=True), name
    checked = ragexp("validate", "--path", str(out), "--corpus", str(KB / "docs.jsonl"), "--json")
    assert checked.code == 0 and checked.json()["evidence"]["spans"] == 32


def test_anchoring_chunk_ids_of_a_chunked_corpus(ragexp: Any, tmp_path: Path) -> None:
    chunks = write_jsonl(
        tmp_path / "chunks.jsonl",
        [
            {"id": "seg-1", "doc": "refund.md", "text": "退款审核通过后原路退回。微信和支付宝 1-3 个工作日到账。"},
            {"id": "seg-2", "doc": "refund.md", "text": "银行卡 3-7 个工作日到账。如有疑问请联系客服。"},
            {"id": "seg-3", "doc": "shipping.md", "text": "现货商品付款后发货。"},
        ],
    )
    rows = [
        {
            "id": "a",
            "question": "银行卡几天到账？",
            "relevant_ids": ["seg-2"],
            "expected_facts": ["3-7 个工作日"],
            "metadata": {"team": "pay"},
        },
        {"id": "b", "question": "发货？", "relevant_ids": ["seg-3", "seg-1"], "expected_facts": ["不在任何片段里"]},
        {"id": "c", "question": "老板是谁？", "unanswerable": True},
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    out = tmp_path / "anchored.jsonl"
    result = ragexp("validate", "--path", str(data), "--corpus", str(chunks), "--anchor", "--out", str(out))
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == (
        f"wrote {out}: 2 of 3 cases anchored to documents; "
        "1 spans are the sentences holding their facts, 2 whole chunks"
    )
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert written[0] == {
        "id": "a",
        "question": "银行卡几天到账？",
        "relevant": [{"doc": "refund.md", "span": "银行卡 3-7 个工作日到账。"}],
        "expected_facts": ["3-7 个工作日"],
        "metadata": {"team": "pay"},
    }
    assert written[1]["relevant"] == [
        {"doc": "shipping.md", "span": "现货商品付款后发货。"},
        {"doc": "refund.md", "span": "退款审核通过后原路退回。微信和支付宝 1-3 个工作日到账。"},
    ]
    assert written[2] == rows[2]
    # Refusals: an id the corpus does not hold; --out without --anchor; --anchor without --out.
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "question": "q", "relevant_ids": ["seg-1", "seg-9"]}])
    missing = ragexp(
        "validate", "--path", str(bad), "--corpus", str(chunks), "--anchor", "--out", str(tmp_path / "o.jsonl")
    )
    assert missing.code == 1
    assert missing.stderr.strip() == f"ragexp: {bad}:1: field 'relevant_ids[1]': chunk 'seg-9' is not in {chunks}"
    assert not (tmp_path / "o.jsonl").exists()
    assert ragexp("validate", "--path", str(data), "--out", str(out)).stderr.strip() == (
        "ragexp: error: --out goes with --anchor (validate writes nothing otherwise)"
    )
    assert "give it --out FILE" in ragexp("validate", "--path", str(data), "--corpus", str(chunks), "--anchor").stderr
    same = ragexp("validate", "--path", str(data), "--corpus", str(chunks), "--anchor", "--out", str(data))
    assert same.code == 1 and "--out is the dataset itself" in same.stderr


def test_anchoring_conversations_writes_each_once_and_only_a_valid_file_never_over_an_existing_one(
    ragexp: Any, tmp_path: Path
) -> None:
    out = tmp_path / "chat.jsonl"
    result = ragexp("validate", "dataset=kb_zh_chat", "--anchor", "--out", str(out), "--json")
    assert result.code == 0, result.stderr
    source = [json.loads(line) for line in (KB / "chat.jsonl").read_text(encoding="utf-8").splitlines()]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["id"] for row in written] == [row["id"] for row in source]  # each conversation once
    assert result.json()["cases"] == result.json()["anchored"] == sum(len(row["turns"]) for row in source)
    texts = load_chunks(KB / "docs.jsonl").texts
    for before, after in zip(source, written, strict=True):
        for old, new in zip(before["turns"], after["turns"], strict=True):
            assert "relevant_ids" not in new and [item["doc"] for item in new["relevant"]] == old["relevant_ids"]
            assert all(item["span"] in texts[item["doc"]] for item in new["relevant"])
            assert {k: v for k, v in new.items() if k != "relevant"} == {
                k: v for k, v in old.items() if k != "relevant_ids"
            }
    ids = [case.id for case in load_dataset(KB / "chat.jsonl").cases]
    assert [case.id for case in load_dataset(out).cases] == ids
    # An existing --out is kept unless --force; then replaced.
    out.write_text("mine\n", encoding="utf-8")
    kept = ragexp("validate", "dataset=kb_zh_chat", "--anchor", "--out", str(out))
    assert kept.code == 1 and out.read_text(encoding="utf-8") == "mine\n"
    assert kept.stderr.strip().splitlines() == [f"ragexp: {out}: --out exists: give --force to replace it"]
    forced = ragexp("validate", "dataset=kb_zh_chat", "--anchor", "--out", str(out), "--force")
    assert forced.code == 0, forced.stderr
    assert [json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines()] == [
        r["id"] for r in source
    ]
    # A turn naming a chunk the corpus lacks: one line naming it, nothing written.
    broken = [dict(row) for row in source]
    broken[2] = {**source[2], "turns": [*source[2]["turns"][:1], {**source[2]["turns"][1], "relevant_ids": ["nope"]}]}
    bad = write_jsonl(tmp_path / "bad.jsonl", broken)
    fresh = tmp_path / "fresh.jsonl"
    refused = ragexp(
        "validate", "--path", str(bad), "--corpus", str(KB / "docs.jsonl"), "--anchor", "--out", str(fresh)
    )
    assert refused.code == 1 and not fresh.exists() and list(tmp_path.glob(".fresh*")) == []
    assert refused.stderr.strip().splitlines() == [
        f"ragexp: {bad}:3: field 'turns[1].relevant_ids[0]': chunk 'nope' is not in {KB / 'docs.jsonl'}"
    ]


def test_anchor_span_is_the_sentences_holding_the_facts() -> None:
    text = "第一句。退款 1-3 个工作日到账；银行卡 3-7 个工作日。最后一句！"
    assert anchor_span(text, ["1-3 个工作日"]) == "退款 1-3 个工作日到账；"
    assert anchor_span(text, ["1-3 个工作日", "3-7"]) == "退款 1-3 个工作日到账；银行卡 3-7 个工作日。"
    assert anchor_span(text, ["不在"]) == text
    # A fact written over two sentences is held whole by the span, beside a fact in one sentence.
    assert anchor_span(text, ["到账；银行卡", "第一句"]) == "第一句。退款 1-3 个工作日到账；银行卡 3-7 个工作日。"
    english = "Refunds take 3.5 days. Cards are slower! Done"
    assert [english[a:b] for a, b in sentences(english)] == ["Refunds take 3.5 days.", "Cards are slower!", "Done"]


# --- services that name documents: Dify and RAGFlow stand-ins, re-indexed ----------------------


def numbered_evidence(*numbers: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"c{n}",
            "question": f"what about {n}?",
            "relevant": [{"doc": f"doc-{n}", "span": f"fact {n} lives here"}],
            "expected_facts": [f"fact {n}"],
        }
        for n in numbers
    ]


@pytest.mark.system
@pytest.mark.parametrize(
    ("preset", "path", "auth"),
    [
        ("dify", "/v1/chat-messages", ("RAGEXP_DIFY_AUTH", "Bearer app-standin")),
        ("ragflow", "/api/v1/chats/standin/completions", ("RAGEXP_RAGFLOW_AUTH", "Bearer ragflow-standin")),
    ],
)
def test_a_reindexed_service_keeps_its_scores_on_evidence(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str, path: str, auth: tuple[str, str]
) -> None:
    import os

    monkeypatch.setenv(*auth)
    spans = write_jsonl(tmp_path / "spans.jsonl", numbered_evidence(1, 2, 3))
    ids = write_jsonl(
        tmp_path / "ids.jsonl",
        [
            {
                "id": f"c{n}",
                "question": f"what about {n}?",
                "relevant_ids": [f"seg-{n}"],
                "expected_facts": [f"fact {n}"],
            }
            for n in (1, 2, 3)
        ],
    )
    metrics = "metrics.names=[recall_at_k,mrr,ndcg_at_k,answer_accuracy]"
    found: dict[str, dict[str, Any]] = {}
    for label, env in (("before", {}), ("after", {"STANDIN_REINDEXED": "1"})):
        with serve(SERVERS / f"{preset}.py", env={**os.environ, **env}) as url:
            for name, data in (("spans", spans), ("ids", ids)):
                result = ragexp(
                    "run",
                    f"system={preset}",
                    f"provider.system.url={url}{path}",
                    f"dataset.path={data}",
                    metrics,
                    "--json",
                )
                assert result.code == 0, result.stderr
                found[f"{name}-{label}"] = result.json()
    # Re-indexing gave every chunk a new id and a wider text: gold naming chunk ids collapses,
    # gold anchored to the documents does not, and the runs stay comparable.
    assert found["ids-before"]["summary"]["recall_at_k"] == 1.0 and found["ids-after"]["summary"]["recall_at_k"] == 0.0
    assert found["spans-before"]["summary"]["recall_at_k"] == found["spans-after"]["summary"]["recall_at_k"] == 1.0
    assert found["spans-after"]["summary"]["mrr"] == 1.0
    diff = ragexp("diff", found["spans-before"]["run_id"], found["spans-after"]["run_id"], "--json")
    assert diff.code == 0 and diff.json()["comparable"] is True


@pytest.mark.parametrize(
    ("preset", "target", "doc_of"),
    [
        ("langchain", "tests.pipelines.chains:chain", lambda doc_id: "faq"),  # Document.metadata["source"]
        ("llamaindex", "tests.pipelines.llama:engine.query", lambda doc_id: f"{doc_id}.md"),  # the node's SOURCE
    ],
)
def test_framework_presets_read_the_documents_evidence_is_matched_in(
    ragexp: Any, tmp_path: Path, preset: str, target: str, doc_of: Any
) -> None:
    from tests.pipelines.corpus import CASES, DOCS

    rows = [
        {
            "id": row["id"],
            "question": row["question"],
            "expected_facts": row["expected_facts"],
            "relevant": [{"doc": doc_of(doc_id), "span": DOCS[doc_id].rstrip(".")} for doc_id in row["relevant_ids"]],
        }
        for row in CASES
    ]
    data = write_jsonl(tmp_path / "spans.jsonl", rows)
    args = [
        "run",
        f"system={preset}",
        f"provider.system.target={target}",
        f"dataset.path={data}",
        "dataset.corpus=null",
    ]
    result = ragexp(*args, "metrics=retrieval", "--json")
    assert result.code == 0, result.stderr
    assert result.json()["summary"]["recall_at_k"] == 1.0 and "warning" not in result.stderr


@pytest.mark.system
def test_the_sample_service_serves_windows_with_their_documents(ragexp: Any, tmp_path: Path) -> None:
    service = ROOT / "experiments/kb_zh/service.py"
    knobs = ["provider.system.sample.chunking=window", "provider.system.sample.chunk_chars=24"]
    knobs.append("provider.system.sample.overlap=8")
    local = ragexp("run", "dataset=kb_zh_spans", *knobs, "--json")
    with serve(service, "--chunking", "window", "--chunk-chars", "24", "--overlap", "8") as url:
        remote = ragexp("run", "dataset=kb_zh_spans", "provider=http", f"provider.system.url={url}/query", "--json")
    assert local.code == remote.code == 0, remote.stderr
    # ragexp's own contract carries doc_ids: over HTTP the windows score as they do in-process.
    quality = ("recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy")
    assert {m: remote.json()["summary"][m] for m in quality} == {m: local.json()["summary"][m] for m in quality}
    assert local.json()["dataset_hash"] == remote.json()["dataset_hash"]


def test_a_checkpoint_keeps_the_document_ids(tmp_path: Path) -> None:
    from ragexp.checkpoint import Checkpoint, read_checkpoint

    output = SystemOutput(["d#1", "d#2"], ["a", "b"], "x", [1], 0.5, {"keyword": 0.1})
    output.doc_ids = ["d", "d"]
    checkpoint = Checkpoint(tmp_path / "results.jsonl")
    checkpoint.add(CaseResult("c1", output))
    checkpoint.close()
    assert read_checkpoint((tmp_path / "results.jsonl").read_bytes())["c1"].output == output


def test_the_label_audit_looks_for_each_fact_in_the_evidence(ragexp: Any, tmp_path: Path) -> None:
    docs = documents(tmp_path)
    rows = [
        {
            "id": "fine",
            "question": "q",
            "expected_facts": ["1-3"],
            "relevant": [{"doc": "refund", "span": "1-3 个工作日到账"}],
        },
        {"id": "off", "question": "q2", "expected_facts": ["七天"], "relevant": [{"doc": "refund", "span": "退回"}]},
    ]
    data = write_jsonl(tmp_path / "set.jsonl", rows)
    checked = ragexp("validate", "--path", str(data), "--corpus", str(docs), "--json")
    assert checked.code == 0, checked.stderr
    assert [(f["id"], f["kind"]) for f in checked.json()["findings"]] == [("off", "fact_not_in_relevant")]
    assert "appears in none of its evidence spans" in checked.json()["findings"][0]["message"]
