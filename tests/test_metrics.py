"""Offline metric kernels: the RAG evaluation article's worked examples and a cross-check against a plain
per-case implementation on thousands of random cases."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ragexp.errors import MetricError
from ragexp.metrics.offline import (
    build_inputs,
    nearest_rank,
    score_answer_accuracy,
    score_citation_precision,
    score_mrr,
    score_ndcg,
    score_recall,
)
from ragexp.metrics.registry import METRICS, parse_metric_names
from ragexp.records import Case, CaseResult, SystemOutput

REFUSALS = ["没有足够证据", "cannot answer"]


def case(cid: str, relevant: list[str], *, unanswerable: bool = False, facts: list[str] | None = None) -> Case:
    return Case(cid, "q", relevant, facts or [], None, unanswerable, 1)


def scores_for(cases: list[Case], outputs: list[SystemOutput | None], k: int) -> dict[str, np.ndarray]:
    results = [CaseResult(c.id, o, None if o else "boom") for c, o in zip(cases, outputs, strict=True)]
    inputs = build_inputs(cases, results, k, REFUSALS)
    return {
        "recall": score_recall(inputs),
        "mrr": score_mrr(inputs),
        "ndcg": score_ndcg(inputs),
        "citation": score_citation_precision(inputs),
        "answer": score_answer_accuracy(inputs),
    }


def test_seed_worked_example() -> None:
    # ranking [a,b,c,d], relevant {b,d}, K=3: only b is hit.
    got = scores_for([case("x", ["b", "d"])], [SystemOutput(ranked_ids=["a", "b", "c", "d"])], k=3)
    assert got["recall"][0] == pytest.approx(0.5)
    assert got["mrr"][0] == pytest.approx(0.5)
    assert got["ndcg"][0] == pytest.approx(0.38685, abs=1e-5)
    assert got["ndcg"][0] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_seed_citation_example() -> None:
    # citations [1,3,9]; the contexts at 1 and 3 are relevant, 9 points past the ranking.
    out = SystemOutput(ranked_ids=["r1", "n2", "r3"], citations=[1, 3, 9])
    got = scores_for([case("x", ["r1", "r3"])], [out], k=3)
    assert got["citation"][0] == pytest.approx(2 / 3)


def test_mrr_is_uncut_and_counts_first_relevant_anywhere() -> None:
    out = SystemOutput(ranked_ids=["a", "b", "c", "d", "e", "f", "g"])
    got = scores_for([case("x", ["g"])], [out], k=3)
    assert got["mrr"][0] == pytest.approx(1 / 7)
    assert got["recall"][0] == 0.0
    assert got["ndcg"][0] == 0.0


def test_duplicate_ids_never_lift_ndcg_above_one() -> None:
    out = SystemOutput(ranked_ids=["a", "a", "a"])
    got = scores_for([case("x", ["a"])], [out], k=3)
    assert got["ndcg"][0] == pytest.approx(1.0)
    assert got["recall"][0] == pytest.approx(1.0)


def test_unanswerable_rules() -> None:
    cases = [case("u1", [], unanswerable=True), case("u2", [], unanswerable=True), case("u3", [], unanswerable=True)]
    outputs = [
        SystemOutput(answer="知识库中没有足够证据回答。"),  # refuses, retrieves nothing
        SystemOutput(ranked_ids=["x"], answer="It is 42.", citations=[1]),  # hallucinates
        SystemOutput(ranked_ids=[], answer="Sorry, I CANNOT answer that."),  # refusal, other case
    ]
    got = scores_for(cases, outputs, k=3)
    assert got["recall"].tolist() == [1.0, 0.0, 1.0]
    assert got["mrr"].tolist() == [1.0, 0.0, 1.0]
    assert got["answer"].tolist() == [1.0, 0.0, 1.0]
    assert got["citation"].tolist() == [1.0, 0.0, 1.0]


def test_answer_accuracy_needs_every_fact_after_normalisation() -> None:
    cases = [case("a", ["d"], facts=["七天", "Refund"]), case("b", ["d"], facts=["七天", "30 天"])]
    outputs = [SystemOutput(answer="ＲＥＦＵＮＤ within 七天"), SystemOutput(answer="七天")]
    assert scores_for(cases, outputs, k=3)["answer"].tolist() == [1.0, 0.0]


def test_failed_call_has_every_metric_missing_not_zero() -> None:
    got = scores_for([case("x", ["a"])], [None], k=3)
    assert all(math.isnan(values[0]) for values in got.values())


def test_nearest_rank() -> None:
    values = np.array([0.1 * i for i in range(1, 21)])  # 0.1 .. 2.0
    assert nearest_rank(values, 95) == pytest.approx(1.9)  # ceil(20 * .95) = 19th value
    assert nearest_rank(np.array([3.0]), 95) == 3.0
    assert nearest_rank(np.array([np.nan, 2.0, 1.0]), 50) == 1.0
    assert nearest_rank(np.array([np.nan]), 95) is None


# --- cross-check against the article's plain per-case functions ------------------------------------


def plain_recall(ranked: list[str], relevant: set[str], k: int) -> float:
    return len(set(ranked[:k]) & relevant) / len(relevant)


def plain_rr(ranked: list[str], relevant: set[str]) -> float:
    for rank, item in enumerate(ranked, start=1):
        if item in relevant:
            return 1.0 / rank
    return 0.0


def plain_ndcg(ranked: list[str], relevant: set[str], k: int) -> float:
    seen: set[str] = set()
    dcg = 0.0
    for rank, item in enumerate(ranked[:k], start=1):
        if item in relevant and item not in seen:
            dcg += 1.0 / math.log2(rank + 1)
        seen.add(item)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(relevant), k) + 1))
    return dcg / ideal


def plain_citation(ranked: list[str], citations: list[int], relevant: set[str]) -> float:
    return sum(1 for c in citations if 0 < c <= len(ranked) and ranked[c - 1] in relevant) / len(citations)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_numpy_kernels_match_plain_loop_on_random_cases(k: int) -> None:
    rng = random.Random(k)
    pool = [f"d{i}" for i in range(40)]
    cases, outputs = [], []
    for i in range(3000):
        relevant = rng.sample(pool, rng.randint(1, 6))
        ranked = [rng.choice(pool) for _ in range(rng.randint(0, 25))]  # duplicates on purpose
        citations = [rng.randint(1, 30) for _ in range(rng.randint(0, 4))]
        cases.append(case(f"c{i}", relevant))
        outputs.append(SystemOutput(ranked_ids=ranked, citations=citations))
    got = scores_for(cases, outputs, k)
    for i, (c, o) in enumerate(zip(cases, outputs, strict=True)):
        relevant = set(c.relevant_ids)
        assert got["recall"][i] == pytest.approx(plain_recall(o.ranked_ids, relevant, k))
        assert got["mrr"][i] == pytest.approx(plain_rr(o.ranked_ids, relevant))
        assert got["ndcg"][i] == pytest.approx(plain_ndcg(o.ranked_ids, relevant, k))
        expected_citation = plain_citation(o.ranked_ids, o.citations, relevant) if o.citations else 0.0
        assert got["citation"][i] == pytest.approx(expected_citation)
    assert np.all(got["ndcg"] <= 1.0 + 1e-12)


def test_metric_name_parsing() -> None:
    specs = parse_metric_names(["faithfulness", "answer_similarity"])
    assert [s.name for s in specs] == ["faithfulness", "semantic_similarity"]
    with pytest.raises(MetricError, match="repeats"):
        parse_metric_names(["answer_similarity", "semantic_similarity"])
    with pytest.raises(MetricError, match="did you mean 'recall_at_k'"):
        parse_metric_names(["recal_at_k"])
    with pytest.raises(MetricError, match="at least one"):
        parse_metric_names([])
    judge = [name for name, spec in METRICS.items() if spec.judge]
    assert len(parse_metric_names([*judge, "recall_at_k", "mrr"])) == 14  # 12 judge metrics fit
    from ragexp.metrics import registry

    registry.MAX_JUDGE_METRICS, saved = 11, registry.MAX_JUDGE_METRICS
    try:
        with pytest.raises(MetricError, match="at most 11 judge metrics"):
            parse_metric_names(judge)
    finally:
        registry.MAX_JUDGE_METRICS = saved
    with pytest.raises(MetricError, match="1 to 50 characters"):
        parse_metric_names(["x" * 51])


def test_registry_knows_directions_and_sources() -> None:
    assert METRICS["noise_sensitivity"].direction == "lower"
    assert METRICS["p95_seconds"].direction == "lower"
    assert METRICS["faithfulness"].official and not METRICS["mrr"].official
    judge = [name for name, spec in METRICS.items() if spec.judge]
    assert len(judge) == 12
    assert METRICS["context_recall"].needs == {"user_input", "reference", "retrieved_contexts"}
