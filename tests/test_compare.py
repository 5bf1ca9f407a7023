"""`ragexp gate` and `ragexp diff` on real runs in a temporary SQLite store."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.compare.diff import MetricDiff
from ragexp.compare.gate import check_rules
from ragexp.config.compose import compose
from ragexp.stats.paired import paired
from tests.conftest import write_jsonl

# --- the RAG evaluation article's exercise ------------------------------------------------------------------

SEED_BASELINE = {
    "recall_at_k": 0.90,
    "mrr": 0.76,
    "ndcg_at_k": 0.72,
    "citation_precision": 0.98,
    "answer_accuracy": 0.84,
    "p95_seconds": 2.0,
}
SEED_CANDIDATE = {
    "recall_at_k": 0.92,
    "mrr": 0.74,
    "ndcg_at_k": 0.75,
    "citation_precision": 0.96,
    "answer_accuracy": 0.87,
    "p95_seconds": 2.8,
}


def test_seed_exercise_fails_on_exactly_mrr_citation_and_p95() -> None:
    gates = compose([]).gates
    metrics = {
        name: MetricDiff(
            name,
            "lower" if name == "p95_seconds" else "higher",
            SEED_BASELINE[name],
            SEED_CANDIDATE[name],
            SEED_CANDIDATE[name] - SEED_BASELINE[name],
            None,
            None,
            None,
            0,
            0,
            0,
            100,
        )
        for name in SEED_BASELINE
    }
    failures, checked = check_rules(gates, metrics, errored=0, total=100)
    assert checked == 6
    assert [(f.metric, f.rule) for f in failures] == [
        ("mrr", "max_drop"),
        ("citation_precision", "min"),
        ("p95_seconds", "max_increase_ratio"),
    ]
    mrr, citation, p95 = failures
    assert (mrr.baseline, mrr.candidate, mrr.threshold) == (0.76, 0.74, 0.01)
    assert (citation.candidate, citation.threshold) == (0.96, 0.97)
    assert (p95.baseline, p95.candidate, p95.threshold) == (2.0, 2.8, 0.2) and "+40.0%" in p95.message


def replay_rows(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cases with one relevant id each; ``rank`` places it in the ranking (None: not retrieved)."""
    rows = []
    for i, spec in enumerate(specs):
        rank = spec.get("rank")
        ranked = [f"noise-{i}-{j}" for j in range(5)]
        if rank is not None:
            ranked.insert(rank - 1, f"rel-{i}")
        citations = spec.get("citations", [rank] if rank else [])
        rows.append(
            {
                "id": f"case-{i:04d}",
                "question": f"question {i}?",
                "relevant_ids": [f"rel-{i}"],
                "expected_facts": [f"fact {i}"],
                "reference": f"fact {i}.",
                "response": f"fact {i}." if spec.get("correct", True) else "something else",
                "retrieved_ids": ranked,
                "retrieved_contexts": [f"text of {d}" for d in ranked],
                "citations": citations,
                "latency_seconds": spec.get("latency", 1.0),
            }
        )
    return rows


def seed_specs(ranks: list[int], cites_wrong: int, wrong_answers: int, p95: float) -> list[dict[str, Any]]:
    specs = []
    for i, rank in enumerate(ranks):
        spec: dict[str, Any] = {"rank": rank, "correct": i >= wrong_answers, "latency": 1.0}
        if i < cites_wrong:
            spec["citations"] = [rank + 1]  # the position after the relevant id holds noise: unsupported
        specs.append(spec)
    for spec in specs[-3:]:  # nearest-rank P95 of 50 latencies is the 48th smallest
        spec["latency"] = p95
    return specs


def run_replay(ragexp: Any, path: Path, *extra: str) -> dict[str, Any]:
    result = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=3", "--json", *extra)
    assert result.code == 0, result.stderr
    payload: dict[str, Any] = result.json()
    return payload


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_seed_exercise_end_to_end(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    # 50 answerable cases at K=3. Baseline: 29 at rank 1, 16 at rank 2, 5 at rank 5 (outside K)
    # -> recall 45/50 = .90, MRR (29 + 8 + 1)/50 = .76. Candidate: 26 at rank 1, 20 at rank 2,
    # 4 at rank 4 -> recall .92, MRR (26 + 10 + 1)/50 = .74.
    base_specs = seed_specs([1] * 29 + [2] * 16 + [5] * 5, cites_wrong=1, wrong_answers=8, p95=2.0)
    cand_specs = seed_specs([1] * 26 + [2] * 20 + [4] * 4, cites_wrong=2, wrong_answers=6, p95=2.8)
    base = run_replay(ragexp, write_jsonl(tmp_path / "base.jsonl", replay_rows(base_specs)))
    cand = run_replay(ragexp, write_jsonl(tmp_path / "cand.jsonl", replay_rows(cand_specs)))
    assert base["dataset_hash"] == cand["dataset_hash"]
    b, c = base["summary"], cand["summary"]
    assert (
        b["recall_at_k"],
        b["mrr"],
        b["citation_precision"],
        b["answer_accuracy"],
        b["p95_seconds"],
    ) == pytest.approx((0.90, 0.76, 0.98, 0.84, 2.0))
    assert (
        c["recall_at_k"],
        c["mrr"],
        c["citation_precision"],
        c["answer_accuracy"],
        c["p95_seconds"],
    ) == pytest.approx((0.92, 0.74, 0.96, 0.88, 2.8))

    result = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], "--json")
    assert result.code == 2, result.stderr
    verdict = result.json()
    assert verdict["passed"] is False and verdict["baseline"] == base["run_id"]
    assert {f["metric"] for f in verdict["failures"]} == {"mrr", "citation_precision", "p95_seconds"}
    assert set(verdict["failures"][0]) == {"metric", "rule", "baseline", "candidate", "threshold", "message"}

    text = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"])
    assert text.code == 2 and "FAILED" in text.stdout and "3 of 6 checks failed" in text.stdout
    # The verdict is recorded on the candidate for the MLflow UI.
    tags = MlflowClient(store_uri).get_run(cand["run_id"]).data.tags
    assert tags["ragexp.gate.verdict"] == "failed" and tags["ragexp.gate.baseline"] == base["run_id"]
    assert tags["ragexp.gate.failures"] == "citation_precision,mrr,p95_seconds"

    # Rules are config: loosen them on the command line and the same pair passes.
    loose = ragexp(
        "gate",
        "--baseline",
        base["run_id"],
        "--candidate",
        cand["run_id"],
        "gates.rules.mrr.max_drop=0.05",
        "gates.rules.citation_precision.min=0.9",
        "gates.rules.p95_seconds.max_increase_ratio=0.5",
    )
    assert loose.code == 0, loose.stdout + loose.stderr
    assert MlflowClient(store_uri).get_run(cand["run_id"]).data.tags["ragexp.gate.verdict"] == "passed"

    # Without --candidate the newest finished run of the experiment is the candidate.
    default = ragexp("gate", "--baseline", base["run_id"], "--json")
    assert default.json()["candidate"] == cand["run_id"]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_refusals_and_unknown_runs(ragexp: Any, tmp_path: Path) -> None:
    rows = replay_rows([{"rank": 1}] * 10)
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    base = run_replay(ragexp, path)
    other_k = ragexp("run", f"dataset.path={path}", "provider=replay", "k=5", "--json").json()
    changed = write_jsonl(tmp_path / "b.jsonl", [{**rows[0], "expected_facts": ["other"]}, *rows[1:]])
    other_data = run_replay(ragexp, changed)
    other_metrics = run_replay(ragexp, path, "metrics=retrieval")

    for other, what in [
        (other_k, "K differs (3 vs 5)"),
        (other_data, "dataset content hash differs"),
        (other_metrics, "metric set differs"),
    ]:
        for command in (
            ["diff", base["run_id"], other["run_id"]],
            ["gate", "--baseline", base["run_id"], "--candidate", other["run_id"]],
        ):
            result = ragexp(*command)
            assert result.code == 3, (command, result.stderr)
            assert what in result.stderr and len(result.stderr.strip().splitlines()) == 1
    allowed = ragexp("diff", base["run_id"], other_k["run_id"], "--allow-incomparable", "--json")
    assert allowed.code == 0 and allowed.json()["differences"] == ["K differs (3 vs 5)"]

    missing = ragexp("diff", base["run_id"], "0123456789abcdef0123456789abcdef")
    assert missing.code == 1
    assert missing.stderr.startswith("ragexp: error: unknown run '0123456789abcdef0123456789abcdef' in tracking store")
    assert len(missing.stderr.strip().splitlines()) == 1


def test_errored_candidate_cannot_pass(ragexp: Any) -> None:
    gates = compose([]).gates
    same = {
        name: MetricDiff(name, "higher", 0.9, 0.9, 0.0, None, None, None, 0, 0, 10, 10)
        for name in ["recall_at_k", "mrr", "citation_precision", "answer_accuracy"]
    }
    same["citation_precision"] = MetricDiff(
        "citation_precision", "higher", 0.99, 0.99, 0.0, None, None, None, 0, 0, 10, 10
    )
    same["p95_seconds"] = MetricDiff("p95_seconds", "lower", 1.0, 1.0, 0.0, None, None, None, 0, 0, 10, 10)
    assert check_rules(gates, same, errored=0, total=10)[0] == []
    failures, _ = check_rules(gates, same, errored=1, total=10)
    assert [(f.metric, f.rule) for f in failures] == [("error_rate", "max_error_rate")]
    assert "1 of 10 candidate cases errored" in failures[0].message
    # A metric the candidate has no score for is a failure, not a pass.
    del same["mrr"]
    failures, _ = check_rules(gates, same, errored=0, total=10)
    assert [(f.metric, f.rule) for f in failures] == [("mrr", "max_drop")]


# --- statistics checked against independent computations ----------------------------------------


def test_interval_and_randomization_p_match_direct_computations() -> None:
    rng = np.random.default_rng(11)
    base = rng.random(400)
    cand = np.clip(base + rng.normal(-0.02, 0.1, 400), 0, 1)
    stats = paired(base, cand, resamples=10_000, confidence=0.95, seed=0)
    assert stats is not None and stats.delta == pytest.approx(float((cand - base).mean()))
    diffs = cand - base
    direct = np.random.default_rng(5)
    # At n = 400 the inverted sign-flip interval is close to the normal one (see test_intervals.py
    # for its exact finite-sample checks).
    half = 1.96 * diffs.std(ddof=1) / np.sqrt(diffs.size)
    assert stats.ci_low == pytest.approx(diffs.mean() - half, abs=0.002)
    assert stats.ci_high == pytest.approx(diffs.mean() + half, abs=0.002)
    flips = direct.choice([-1.0, 1.0], size=(10_000, diffs.size))
    p_direct = (1 + np.count_nonzero(np.abs(flips @ diffs) >= abs(diffs.sum()))) / 10_001
    assert stats.p_value == pytest.approx(p_direct, abs=0.01)


def test_randomization_p_matches_exact_enumeration_on_discrete_scores() -> None:
    base = np.array([1.0] * 6 + [0.0] * 6 + [1.0] * 8)
    cand = np.array([0.0] * 6 + [1.0] * 2 + [0.0] * 4 + [1.0] * 8)  # 6 down, 2 up, 12 unchanged
    diffs = (cand - base)[cand != base]
    exact = (
        sum(
            abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= abs(diffs.sum()) - 1e-12
            for signs in itertools.product([-1, 1], repeat=diffs.size)
        )
        / 2**diffs.size
    )
    stats = paired(base, cand, resamples=20_000, confidence=0.95, seed=3)
    assert stats is not None and stats.p_value == pytest.approx(exact, abs=0.01)
    assert stats.delta == pytest.approx(-4 / 20)


def test_diff_reports_cases_counts_and_stage(ragexp: Any, tmp_path: Path) -> None:
    # Candidate: recall unchanged, first relevant pushed from rank 1 to rank 2 in 10 cases
    # (the article's "recall flat, MRR down: fusion or rerank").
    base_rows = replay_rows([{"rank": 1}] * 40)
    cand_rows = replay_rows([{"rank": 2}] * 10 + [{"rank": 1}] * 30)
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", base_rows))
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", cand_rows))
    result = ragexp("diff", base["run_id"], cand["run_id"], "--json", "--top", "3")
    assert result.code == 0, result.stderr
    data = result.json()
    mrr = next(m for m in data["metrics"] if m["name"] == "mrr")
    assert mrr["delta"] == pytest.approx(-10 * 0.5 / 40)
    assert (mrr["improved"], mrr["regressed"], mrr["unchanged"]) == (0, 10, 30)
    assert mrr["ci_high"] < 0 and mrr["p_value"] < 0.01
    recall = next(m for m in data["metrics"] if m["name"] == "recall_at_k")
    assert recall["delta"] == 0 and recall["regressed"] == 0
    assert set(mrr) == {
        "name",
        "direction",
        "baseline",
        "candidate",
        "delta",
        "ci_low",
        "ci_high",
        "p_value",
        "improved",
        "regressed",
    } | {
        "unchanged",
        "detectable_effect",
        "why_missing",
        "population",
        "n",
        "unit",
        "pairing",
        "baseline_own",
        "candidate_own",
        "verdict",
        "noise_floor",
    }
    assert (mrr["n"], mrr["unit"]) == (40, "case")
    assert mrr["verdict"] == "worse" and mrr["noise_floor"] is None  # the word the table prints
    assert mrr["why_missing"] == {}
    assert mrr["population"] == {"scored": 40, "cases": 40, "total": 40, "population": "all"}
    assert data["diagnosis"] == [
        "recall flat but MRR down: fusion or rerank regressed "
        "(recall_at_k unchanged; mrr -0.1250, p 0.0019; ndcg_at_k -0.0923, p 0.0019)"
    ]
    assert len(data["cases"]) == 3
    worst = data["cases"][0]
    assert worst["id"] == "case-0000" and worst["metrics"]["mrr"] == {"baseline": 1.0, "candidate": 0.5}
    assert worst["candidate"]["retrieved_ids"][:2] == ["noise-0-0", "rel-0"]
    assert worst["baseline"]["answer"] == "fact 0."
    again = ragexp("diff", base["run_id"], cand["run_id"], "--json", "--top", "3").json()
    assert again == data  # fixed seed: the same figures every time
    text = ragexp("diff", base["run_id"], cand["run_id"])
    assert "fusion or rerank" in text.stdout and "case-0000" in text.stdout


# --- the noise-aware gate -----------------------------------------------------------------------


def noisy_pair(tmp_path: Path, ragexp: Any, *, drop: int, swaps: int, n: int = 300, seed: int = 1) -> tuple[str, str]:
    """Identical retrieval; answers correct at random, the candidate flips ``swaps`` cases each way
    (per-case noise) and turns ``drop`` more correct answers wrong (a real regression)."""
    rng = random.Random(seed)
    correct = [rng.random() < 0.8 for _ in range(n)]
    right = [i for i in range(n) if correct[i]]
    wrong = [i for i in range(n) if not correct[i]]
    rng.shuffle(right)
    rng.shuffle(wrong)
    cand = list(correct)
    for i in right[: swaps + drop]:
        cand[i] = False
    for i in wrong[:swaps]:
        cand[i] = True
    base_rows = replay_rows([{"rank": 1, "correct": c} for c in correct])
    cand_rows = replay_rows([{"rank": 1, "correct": c} for c in cand])
    a = run_replay(ragexp, write_jsonl(tmp_path / f"a{drop}.jsonl", base_rows))["run_id"]
    b = run_replay(ragexp, write_jsonl(tmp_path / f"b{drop}.jsonl", cand_rows))["run_id"]
    return a, b


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_noise_aware_gate(ragexp: Any, tmp_path: Path) -> None:
    # A/A: the same system, 12 answers flipped each way by noise and a net chance dip of 3 cases.
    a, b = noisy_pair(tmp_path, ragexp, drop=3, swaps=12)
    plain = ragexp("gate", "--baseline", a, "--candidate", b, "--json")
    assert plain.code == 2 and [f["metric"] for f in plain.json()["failures"]] == ["answer_accuracy"]
    stat = ragexp("gate", "--baseline", a, "--candidate", b, "gates=release_stat", "--json")
    assert stat.code == 0, stat.stdout
    # A real drop of 0.05 (15 of 300 cases) under the same noise fails the noise-aware gate.
    a, b = noisy_pair(tmp_path, ragexp, drop=15, swaps=12)
    stat = ragexp("gate", "--baseline", a, "--candidate", b, "gates=release_stat", "--json")
    assert stat.code == 2
    failure = stat.json()["failures"][0]
    assert failure["metric"] == "answer_accuracy" and failure["candidate"] == pytest.approx(failure["baseline"] - 0.05)
    assert "lies wholly beyond the allowed drop" in failure["message"]
