"""A reason on every score (issue 32 §6): each offline metric's per-case rationale, in the run's
language, in cases.jsonl, on the trace assessments (read back from a real SQLite store with
MLflow's client), in ``diff --json``'s per-case rows and in diff's terminal rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ragexp.metrics.wording import rendered
from ragexp.phrases import t
from tests.conftest import write_jsonl
from tests.test_traces import RETRIEVAL, case_id, feedback, rows_of, traces_of

OFFLINE = ("recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy")
CJK = re.compile(r"[\u4e00-\u9fff]")


def replay_cases() -> list[dict[str, Any]]:
    """Recorded outputs whose every rationale is known: a missed id below K and one never
    retrieved, a citation of an irrelevant id and one past the ranking, a missing fact; an
    unanswerable case that refused; and a case anchored to evidence spans in two documents."""
    return [
        {
            "id": "mixed",
            "question": "q1",
            "relevant_ids": ["d1", "d2", "d3"],
            "expected_facts": ["alpha", "Beta", "gamma"],
            "response": "ALPHA and gamma [1][2][9]",
            "retrieved_ids": ["d1", "x1", "x2", "d3"],
            "retrieved_contexts": ["c1", "c2", "c3", "c4"],
            "citations": [1, 2, 9],
        },
        {
            "id": "perfect",
            "question": "q2",
            "relevant_ids": ["d5"],
            "expected_facts": ["five"],
            "response": "five [2]",
            "retrieved_ids": ["x3", "d5"],
            "retrieved_contexts": ["c5", "c6"],
            "citations": [2],
        },
        {
            "id": "refused",
            "question": "q3",
            "relevant_ids": [],
            "expected_facts": [],
            "unanswerable": True,
            "response": "知识库中没有足够证据回答。",
            "retrieved_ids": [],
            "retrieved_contexts": [],
            "citations": [],
        },
    ]


def test_every_offline_metric_says_why_in_cases_jsonl_and_on_the_trace(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", replay_cases())
    result = ragexp(
        "run", "provider=replay", f"dataset.path={data}", "dataset.corpus=null", "k=3", "report.language=en", "--json"
    )
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path)

    mixed = rows["mixed"]["rationale"]
    assert mixed["recall_at_k"] == (
        "1 of 3 relevant ids in the top 3; found: d1 (#1); missed: d2 (not retrieved), d3 (at rank 4, below the top 3)"
    )
    assert mixed["mrr"] == "first relevant id d1 at rank 1"
    assert mixed["ndcg_at_k"] == "gains at ranks 1 of the top 3; the ideal ranking has 3 at ranks 1 to 3"
    assert mixed["citation_precision"] == ("2 of 3 cited numbers do not support: [2] x1, [9] (no retrieved item there)")
    assert mixed["answer_accuracy"] == '1 of 3 expected facts missing: "Beta"'
    assert rows["mixed"]["metrics"]["citation_precision"] == 1 / 3  # the numbers the words explain

    perfect = rows["perfect"]["rationale"]
    assert perfect["recall_at_k"] == "1 of 1 relevant ids in the top 3; found: d5 (#2)"
    assert perfect["mrr"] == "first relevant id d5 at rank 2"
    assert perfect["citation_precision"] == "all 1 cited numbers support"
    assert perfect["answer_accuracy"] == "all 1 expected facts found"

    refused = rows["refused"]["rationale"]
    rule = t("unanswerable_row", "en")
    # Retrieval metrics leave the unanswerable case out of the mean: the rule that scored it is named.
    assert refused["recall_at_k"] == f"retrieved nothing; {rule}"
    assert refused["mrr"] == f"retrieved nothing; {rule}"
    assert refused["citation_precision"] == "no citation, as an unanswerable case should"
    assert refused["answer_accuracy"] == 'refusal phrase found: "没有足够证据"'

    # The trace assessments carry the same words. An unanswerable case has no assessment of a
    # metric averaged over the answerable cases (the UI's mean is the run's): its row's scores
    # and the rule, once, are the trace's ``ragexp.outside_mean`` metadata.
    found = traces_of(store_uri, run_id)
    traces = {case_id(trace): feedback(trace) for trace in found}
    assert set(traces) == set(rows)
    for case, row in rows.items():
        kept = [name for name in OFFLINE if not (row["unanswerable"] and name in RETRIEVAL)]
        assert set(traces[case]) >= set(kept), case
        for name in kept:
            assert traces[case][name].rationale == row["rationale"][name], (case, name)
    assert not set(traces["refused"]) & RETRIEVAL
    outside = {case_id(trace): trace.info.trace_metadata.get("ragexp.outside_mean") for trace in found}
    scores = rows["refused"]["metrics"]
    assert outside["refused"] == (
        ", ".join(f"{name} {scores[name]:g}" for name in sorted(RETRIEVAL, key=list(scores).index)) + f": {rule}"
    )
    assert outside["refused"].count(rule) == 1
    assert outside["mixed"] is None and outside["perfect"] is None


def test_evidence_anchored_recall_names_the_spans_covered_and_not_by_document(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    row = {
        "id": "spans",
        "question": "q",
        "relevant": [
            {"doc": "refund", "span": "退款在七个工作日内到账"},
            {"doc": "refund", "span": "原路退回支付账户"},
            {"doc": "invoice", "span": "电子发票在订单完成后开具"},
        ],
        "expected_facts": ["七个工作日"],
        "response": "退款在七个工作日内到账[1]",
        "retrieved_ids": ["c9", "c1"],
        "retrieved_contexts": ["无关的内容，说的是会员积分。", "规则：退款在七个工作日内到账，原路退回支付账户。"],
        "retrieved_doc_ids": ["member", "refund"],
        "citations": [1],
    }
    data = write_jsonl(tmp_path / "spans.jsonl", [row])
    result = ragexp(
        "run", "provider=replay", f"dataset.path={data}", "dataset.corpus=null", "report.language=en", "--json"
    )
    assert result.code == 0, result.stderr
    said = rows_of(store_uri, result.json()["run_id"], tmp_path)["spans"]["rationale"]
    assert said["recall_at_k"] == (
        "2 of 3 evidence spans covered in the top 5; covered: refund 2 of 2; "
        'not covered: invoice "电子发票在订单完成后开具"'
    )
    assert said["mrr"] == "first chunk matching the evidence at rank 2"
    assert said["citation_precision"] == "1 of 1 cited numbers do not support: [1]"


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_kb_zh_rationales_in_chinese_reach_traces_and_diff(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = ragexp("run", "--json")
    cand = ragexp("run", "provider.system.sample.rerank=false", "provider.system.sample.chunking=sentence", "--json")
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    base_rows = rows_of(store_uri, base_id, tmp_path / "b")
    cand_rows = rows_of(store_uri, cand_id, tmp_path / "c")

    k = 5
    dataset = Path(__file__).resolve().parents[1] / "ragexp/data/kb_zh/cases.jsonl"
    gold = {
        row["id"]: row.get("relevant_ids") or [] for row in map(json.loads, dataset.read_text("utf-8").splitlines())
    }
    missed_named = 0
    for rows in (base_rows, cand_rows):
        for case, row in rows.items():
            scored = {name for name in OFFLINE if row["metrics"].get(name) is not None}
            assert scored == set(OFFLINE), case  # the sample system answers every case
            assert set(row["rationale"]) >= scored, case
            for name in scored:
                assert CJK.search(row["rationale"][name]), (case, name, row["rationale"][name])
            ranked = row["output"]["ranked_ids"]
            for relevant in gold[case]:
                if relevant not in ranked[:k]:  # every id recall missed is named
                    assert relevant in row["rationale"]["recall_at_k"], (case, relevant)
                    missed_named += 1
    assert missed_named > 0  # the candidate misses some: the check above ran

    # On the trace: the same rationale, read back through MLflow's client. An unanswerable case
    # has no retrieval assessment (outside the run's mean): its row's scores and the rule, in
    # Chinese, are the trace's ``ragexp.outside_mean`` metadata.
    found = traces_of(store_uri, cand_id)
    traces = {case_id(trace): feedback(trace) for trace in found}
    outside = {case_id(trace): trace.info.trace_metadata.get("ragexp.outside_mean") for trace in found}
    assert set(traces) == set(cand_rows)
    unanswerable = [case for case, row in cand_rows.items() if row["unanswerable"]]
    assert unanswerable  # the check below runs
    for case, row in cand_rows.items():
        kept = [name for name in OFFLINE if not (row["unanswerable"] and name in RETRIEVAL)]
        for name in kept:
            assert traces[case][name].rationale == row["rationale"][name], (case, name)
        if row["unanswerable"]:
            assert not set(traces[case]) & RETRIEVAL, case
            scores = row["metrics"]
            assert outside[case] == (
                ", ".join(f"{name} {scores[name]:g}" for name in sorted(RETRIEVAL, key=list(scores).index))
                + f": {t('unanswerable_row', 'zh')}"
            ), case
        else:
            assert outside[case] is None, case

    # diff --json: each side of a per-case row has its run's rationale, in diff's language
    # (English), rendered from the code the run kept beside the Chinese text.
    diff = ragexp("diff", base_id, cand_id, "--json")
    assert diff.code == 0, diff.stderr
    cases = diff.json()["cases"]
    assert cases
    for entry in cases:
        for side, rows in (("baseline", base_rows), ("candidate", cand_rows)):
            assert entry[side]["rationale"] == rendered(rows[entry["id"]], "en")[0], (entry["id"], side)
    # The terminal rows are English: the English reasons, not the Chinese ones.
    shown = ragexp("diff", base_id, cand_id)
    first = cases[0]
    moved = next(n for n, v in first["metrics"].items() if v["baseline"] != v["candidate"])
    assert f"{moved}: {first['candidate']['rationale'][moved]}" in shown.stdout
    assert cand_rows[first["id"]]["rationale"][moved] not in shown.stdout

    # The report's "what changed" carries the candidate's words for a case that moved.
    out = tmp_path / "report"
    made = ragexp("report", cand_id, "--baseline", base_id, "--out", str(out))
    assert made.code == 0, made.stderr
    md = (out / "report.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", md, flags=re.M)
    # The verdict comes first; "what changed" is a section of its own after it.
    (changed,) = [section for section in sections[1:] if section.startswith(t("what_changed", "zh"))]
    assert f"{moved}: {cand_rows[first['id']]['rationale'][moved]}" in changed
