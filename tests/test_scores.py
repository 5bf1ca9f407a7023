"""Issue 32 §2, §3, §8 end to end: human labels only on the answers they graded, one population
per metric everywhere it is shown, time to first token as a registry metric."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.config.compose import compose
from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from ragexp.metrics.calibration import ppi_mean
from ragexp.phrases import t
from ragexp.records import graded_hash
from ragexp.workflows.run_plan import plan_run
from tests.conftest import write_jsonl
from tests.servers.procs import serve
from tests.test_systems import FAST, NDJSON, SERVERS, numbered


def cases_jsonl(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    folder = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path))
    rows = [json.loads(line) for line in Path(folder).read_text(encoding="utf-8").splitlines()]
    return {row["id"]: row for row in rows}


# --- §2 labels on the answers they graded ---------------------------------------------------------


def test_a_fake_system_on_kb_zh_prints_no_calibration_and_counts_the_unmatched_labels(ragexp: Any) -> None:
    result = ragexp("run", "provider=fake")
    assert result.code == 0, result.stderr
    assert "automatic score vs human scores" not in result.stdout
    assert "prediction-powered means (" not in result.stdout
    # Said once, where human scores would be used, with what to do; not a warning on stderr.
    run_id = result.stdout.split("\nrun ", 1)[1].split()[0]
    lines = [line for line in result.stdout.splitlines() if line.startswith("human scores in the dataset")]
    assert lines == [
        "human scores in the dataset: 17 of 17 labelled cases left out of calibration and prediction-powered "
        "means: 17 graded another answer than this run's (human.graded differs). To weigh this run's answers "
        f"against people's, label them: ragexp label {run_id}"
    ]
    assert "human" not in result.stderr
    payload = ragexp("run", "provider=fake", "--json").json()
    assert payload["calibration"] == {} and payload["ppi"] == {}
    assert payload["labels_note"].startswith("human scores in the dataset: 17 of 17 labelled cases left out")


def test_the_sample_system_on_kb_zh_is_calibrated_on_the_answers_its_labels_graded(ragexp: Any) -> None:
    result = ragexp("run", "--json")
    assert result.code == 0, result.stderr
    assert "human" not in result.stderr and result.json()["labels_note"] is None
    payload = result.json()
    assert payload["calibration"]["answer_accuracy"]["n"] == 17
    # Another chunking gives other answers: the labels grade none of them.
    other = ragexp("run", "provider.system.sample.chunking=sentence", "--json")
    assert other.code == 0, other.stderr
    assert other.json()["calibration"] == {}
    assert "human" not in other.stderr and "12 of 17 labelled cases left out" in other.json()["labels_note"]


def test_every_bundled_label_names_the_output_it_graded() -> None:
    for group in ("kb_zh", "kb_zh_spans"):
        plan = plan_run(compose([f"dataset={group}"]))
        labelled = [case for case in plan.dataset.cases if case.human]
        assert labelled and all(case.graded_given and case.graded for case in labelled)
        answered: dict[str, Any] = {}
        plan.provider.run(labelled, lambda _, result, seen=answered: seen.__setitem__(result.case_id, result))
        for case in labelled:
            output = answered[case.id].output
            assert case.graded == graded_hash(output.answer, output.contexts)


def test_graded_is_a_hash_or_the_output_and_a_replay_rows_labels_grade_its_answer(ragexp: Any, tmp_path: Path) -> None:
    rows = []
    for i in range(12):
        answer, contexts = f"fact {i} is here", [f"fact {i} lives here."]
        row: dict[str, Any] = {"id": f"c{i}", "question": f"what about {i}?", "relevant_ids": [f"d{i}"]}
        row["expected_facts"] = [f"fact {i}"]
        row.update(response=answer, retrieved_ids=[f"d{i}"], retrieved_contexts=contexts, citations=[1])
        # Written three ways: implicit (the row's own answer), the output itself, its hash.
        if i % 3 == 1:
            row["human"] = {"answer_accuracy": 1, "graded": {"answer": answer, "contexts": contexts}}
        elif i % 3 == 2:
            row["human"] = {"answer_accuracy": 1, "graded": graded_hash(answer, contexts)}
        else:
            row["human"] = {"answer_accuracy": 1}
        rows.append(row)
    rows[0]["human"]["graded"] = graded_hash("another answer", [])  # grades another system's answer
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    result = ragexp("run", f"dataset.path={data}", "provider=replay", "--json")
    assert result.code == 0, result.stderr
    assert result.json()["calibration"]["answer_accuracy"]["n"] == 11
    assert (
        "1 of 12 labelled cases left out of calibration and prediction-powered means: 1 graded another"
        in (result.json()["labels_note"])
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", [{**rows[1], "human": {"answer_accuracy": 1, "graded": "abc"}}])
    with pytest.raises(DatasetErrors, match=r"bad\.jsonl:1: field 'human\.graded': expected the sha256"):
        load_dataset(bad)


def test_a_prediction_powered_interval_never_leaves_the_metrics_range() -> None:
    # An automatic score of 1 everywhere; people agree on all but one labelled case: the normal
    # interval reaches past 1, the metric cannot.
    judge = np.ones(40)
    human = np.full(40, math.nan)
    human[:12] = 1.0
    human[0] = 0.0
    bounded = ppi_mean(judge, human, bounds=(0.0, 1.0))
    assert bounded is not None
    assert 0.0 <= bounded.ci_low <= bounded.mean <= bounded.ci_high <= 1.0
    human[:12] = 1.0
    judge[:12] = 0.0  # the judge low where people say 1: the corrected mean would pass 1
    over = ppi_mean(judge, human)
    clipped = ppi_mean(judge, human, bounds=(0.0, 1.0))
    assert over is not None and over.ci_high > 1.0
    assert clipped is not None and clipped.ci_high == 1.0 and clipped.mean <= 1.0


# --- §3 one population per metric ---------------------------------------------------------------


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_one_population_for_answerable_metrics_in_table_json_mlflow_traces_diff_and_report(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    table = ragexp("run", "run_name=base")
    assert table.code == 0, table.stderr
    recall = next(line for line in table.stdout.splitlines() if line.startswith("recall_at_k"))
    assert recall.split()[-4:] == ["30", "of", "35", "(answerable)"]
    accuracy = next(line for line in table.stdout.splitlines() if line.startswith("answer_accuracy"))
    assert accuracy.endswith("35 of 35")
    base = ragexp("run", "run_name=base2", "--json").json()
    assert base["populations"]["recall_at_k"] == {"scored": 30, "cases": 30, "total": 35, "population": "answerable"}
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()
    client = MlflowClient(store_uri)
    metrics = client.get_run(cand["run_id"]).data.metrics
    assert metrics["population.recall_at_k.scored"] == 30 and metrics["population.recall_at_k.cases"] == 30
    assert metrics["population.answer_accuracy.cases"] == 35
    # The unanswerable rows keep their own 1.0, in cases.jsonl and on the trace's metadata with the
    # rule said; no recall assessment, so the MLflow UI's mean of them is the run's.
    rows = cases_jsonl(store_uri, cand["run_id"], tmp_path)
    unanswerable = [case_id for case_id, row in rows.items() if row["unanswerable"]]
    assert len(unanswerable) == 5 and all(rows[c]["metrics"]["recall_at_k"] == 1.0 for c in unanswerable)
    experiment = client.get_experiment_by_name("ragexp").experiment_id
    traces = client.search_traces(locations=[experiment], run_id=cand["run_id"], max_results=100)
    found = 0
    for trace in traces:
        if trace.info.trace_metadata.get("ragexp.case_id") not in unanswerable:
            continue
        assert not [a for a in trace.info.assessments if a.name == "recall_at_k"]
        said = trace.info.trace_metadata["ragexp.outside_mean"]
        assert said.startswith("recall_at_k 1, ")  # the row's own score, first
        assert said.endswith((f": {t('unanswerable_row', 'en')}", f": {t('unanswerable_row', 'zh')}"))
        assert "answerable cases only" in said or "可回答" in said
        found += 1
    assert found == 5
    # The mean is over the 30 answerable rows, never the 35.
    answerable = [row["metrics"]["recall_at_k"] for row in rows.values() if not row["unanswerable"]]
    assert cand["summary"]["recall_at_k"] == pytest.approx(float(np.mean(answerable)))
    diff = ragexp("diff", base["run_id"], cand["run_id"], "--json")
    assert diff.code == 0, diff.stderr
    shown = {m["name"]: m for m in diff.json()["metrics"]}
    assert shown["recall_at_k"]["population"] == {"scored": 30, "cases": 30, "total": 35, "population": "answerable"}
    words = ragexp("diff", base["run_id"], cand["run_id"])
    assert (
        next(line for line in words.stdout.splitlines() if line.startswith("recall_at_k")).count(
            "30 of 35 (answerable)"
        )
        == 1
    )
    gate = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], "--json")
    assert gate.code == 2, gate.stdout + gate.stderr  # recall dropped: the release rules fail it
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    assert rules[("recall_at_k", "max_drop")]["population"] == "30 of 35 (answerable)"
    assert rules[("answer_accuracy", "max_drop")]["population"] == "35 of 35"
    assert rules[("p95_seconds", "max_increase_ratio")]["population"] is None
    shown_gate = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"])
    recall_rule = next(line for line in shown_gate.stdout.splitlines() if line.startswith("recall_at_k"))
    assert recall_rule.endswith("30 of 35 (answerable)")
    out = tmp_path / "report"
    report = ragexp("report", cand["run_id"], "--baseline", base["run_id"], "--out", str(out))
    assert report.code == 0, report.stderr
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "recall_at_k (30 of 35 (answerable))" in html and "recall_at_k (n=35)" not in html


# --- §8 time to first token ---------------------------------------------------------------------


def test_ttft_is_a_registry_metric_in_json_diff_gate_and_report(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", "and 2?", "and 3?"))
    some = "metrics.names=[recall_at_k,mrr,answer_accuracy,p95_seconds,error_rate]"
    with serve(SERVERS / "inhouse.py") as url:
        args = [*NDJSON, f"provider.system.url={url}/ask/stream", f"dataset.path={data}", some, *FAST]
        first = ragexp("run", *args, "--json")
        second = ragexp("run", *args, "--json")
    assert first.code == 0, first.stderr
    summary = first.json()["summary"]
    assert summary["ttft_p50_seconds"] > 0 and summary["ttft_p95_seconds"] >= summary["ttft_p50_seconds"]
    assert summary["ttft_p95_seconds"] <= summary["p95_seconds"]
    baseline, candidate = first.json()["run_id"], second.json()["run_id"]
    diff = ragexp("diff", baseline, candidate, "--json")
    assert diff.code == 0, diff.stderr
    shown = {m["name"]: m for m in diff.json()["metrics"]}
    assert shown["ttft_p95_seconds"]["direction"] == "lower"
    assert shown["ttft_p95_seconds"]["candidate"] == pytest.approx(second.json()["summary"]["ttft_p95_seconds"])
    # Two runs of one local service differ by noise only; the system gives no citations.
    loose = ["gates.rules.p95_seconds.max_increase_ratio=1000", "~gates.rules.citation_precision"]
    passing = ragexp(
        "gate", "--baseline", baseline, "--candidate", candidate, *loose, "gates.rules.ttft_p95_seconds.max_increase=10"
    )
    assert passing.code == 0, passing.stdout + passing.stderr
    failing = ragexp(
        "gate",
        "--baseline",
        baseline,
        "--candidate",
        candidate,
        *loose,
        "gates.rules.ttft_p95_seconds.max_increase=0",
        "gates.rules.ttft_p95_seconds.min=1000",
        "--json",
    )
    assert failing.code == 2
    failed = {(f["metric"], f["rule"]) for f in failing.json()["failures"]}
    assert ("ttft_p95_seconds", "min") in failed
    out = tmp_path / "report"
    assert ragexp("report", candidate, "--baseline", baseline, "--out", str(out)).code == 0
    assert "ttft_p95_seconds" in (out / "report.html").read_text(encoding="utf-8")


def test_ttft_metrics_are_refused_for_a_system_that_does_not_stream(ragexp: Any) -> None:
    result = ragexp("run", "metrics.names=[recall_at_k,ttft_p95_seconds]")
    assert result.code == 1
    assert "metric 'ttft_p95_seconds' needs output field 'ttft_seconds'" in result.stderr
    payload = ragexp("run", "--json").json()
    assert "ttft_p95_seconds" not in payload["summary"]
