"""`ragexp run` end to end against a real SQLite MLflow store in a temporary folder."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, Result, write_jsonl

TAGS = ["config_hash", "dataset_hash", "dataset", "provider", "metrics", "k", "judge"]


def artifact(client: MlflowClient, run_id: str, path: str, tmp: Path) -> str:
    return Path(client.download_artifacts(run_id, path, str(tmp))).read_text(encoding="utf-8")


def test_default_run_logs_everything(ragexp, store_uri: str, tmp_path: Path) -> None:
    result: Result = ragexp("run", "provider=fake", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert set(payload) == {
        "run_id",
        "experiment",
        "config_hash",
        "dataset_hash",
        "case_count",
        "error_count",
        "summary",
        "calibration",
        "ppi",
        "populations",
        "labels_note",
    }
    assert payload["case_count"] == 35 and payload["error_count"] == 0
    # kb_zh's human scores grade the sample system's answers, not the fake's perfect ones: unused.
    assert payload["calibration"] == {} and payload["ppi"] == {}
    assert "17 of 17 labelled cases left out" in payload["labels_note"] and "human" not in result.stderr
    assert payload["populations"]["mrr"] == {"scored": 30, "cases": 30, "total": 35, "population": "answerable"}
    # provider=fake builds perfect outputs from the labels: every quality metric is 1.0.
    for name in ["recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"]:
        assert payload["summary"][name] == 1.0
    assert payload["summary"]["error_rate"] == 0.0 and payload["summary"]["p95_seconds"] >= 0

    client = MlflowClient(store_uri)
    run = client.get_run(payload["run_id"])
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    for tag in TAGS:
        assert f"ragexp.{tag}" in tags
    assert tags["ragexp.config_hash"] == payload["config_hash"] and tags["ragexp.k"] == "5"
    assert tags["ragexp.metrics"].split(",")[:2] == ["recall_at_k", "mrr"]
    assert run.data.params["k"] == "5" and run.data.params["dataset.name"] == "kb_zh"
    assert run.data.metrics["case_count"] == 35 and run.data.metrics["recall_at_k"] == 1.0

    names = {item.path for item in client.list_artifacts(payload["run_id"])}
    assert {"cases.jsonl", "config.yaml", "summary.json", "cases_table.json", "audit.json"} <= names
    assert tags["ragexp.audit.findings"] == "0"
    rows = [json.loads(line) for line in artifact(client, payload["run_id"], "cases.jsonl", tmp_path).splitlines()]
    assert len(rows) == 35
    assert set(rows[0]) >= {"id", "unanswerable", "metrics", "error", "output", "latency_seconds"}
    assert set(rows[0]["metrics"]) == {"recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"}
    table = json.loads(artifact(client, payload["run_id"], "cases_table.json", tmp_path))
    assert table["columns"][0] == "id" and len(table["data"]) == 35
    assert json.loads(tags["mlflow.loggedArtifacts"]) == [{"path": "cases_table.json", "type": "table"}]
    assert "k: 5" in artifact(client, payload["run_id"], "config.yaml", tmp_path)


def plain_summary(path: Path, k: int) -> dict[str, float]:
    """The replay set's summary computed independently, straight from the file."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    answerable = [r for r in rows if not r.get("unanswerable")]
    recall, rr, ndcg = [], [], []
    for r in answerable:
        rel, ranked = set(r["relevant_ids"]), r["retrieved_ids"]
        recall.append(len(set(ranked[:k]) & rel) / len(rel))
        rr.append(next((1 / i for i, d in enumerate(ranked, 1) if d in rel), 0.0))
        seen, dcg = set(), 0.0
        for i, d in enumerate(ranked[:k], 1):
            if d in rel and d not in seen:
                dcg += 1 / math.log2(i + 1)
            seen.add(d)
        ndcg.append(dcg / sum(1 / math.log2(i + 1) for i in range(1, min(len(rel), k) + 1)))
    cites, accuracy = [], []
    for r in rows:
        rel, ranked, cited = set(r.get("relevant_ids", [])), r["retrieved_ids"], r["citations"]
        if cited:
            cites.append(sum(1 for c in cited if c <= len(ranked) and ranked[c - 1] in rel) / len(cited))
        else:
            cites.append(1.0 if r.get("unanswerable") else 0.0)
        if r.get("unanswerable"):
            accuracy.append(
                any(
                    p in r["response"].casefold()
                    for p in ["没有足够证据", "无法回答", "证据不足", "cannot answer", "not enough evidence"]
                )
            )
        else:
            accuracy.append(all(f.casefold() in r["response"].casefold() for f in r["expected_facts"]))
    latencies = sorted(r["latency_seconds"] for r in rows)
    return {
        "recall_at_k": sum(recall) / len(recall),
        "mrr": sum(rr) / len(rr),
        "ndcg_at_k": sum(ndcg) / len(ndcg),
        "citation_precision": sum(cites) / len(cites),
        "answer_accuracy": sum(accuracy) / len(accuracy),
        "p95_seconds": latencies[math.ceil(len(latencies) * 0.95) - 1],
        "error_rate": 0.0,
    }


@pytest.mark.parametrize("k", [1, 3])
def test_replay_values_match_an_independent_computation(ragexp, k: int) -> None:
    result = ragexp("run", "dataset=scifacts_zh", "provider=replay", f"k={k}", "--json")
    assert result.code == 0, result.stderr
    summary = result.json()["summary"]
    expected = plain_summary(ROOT / "ragexp/data/scifacts_zh/cases.jsonl", k)
    assert summary == pytest.approx(expected)
    assert summary["recall_at_k"] < 1.0 and summary["mrr"] < 1.0  # the recorded retrieval is imperfect


def count_runs(store_uri: str) -> int:
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp")
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


def test_invalid_dataset_creates_no_run(ragexp, store_uri: str, tmp_path: Path) -> None:
    assert ragexp("run", "--json").code == 0
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"id": "a", "question": "q", "relevant_ids": ["x"]}, {"id": "a", "question": "q2", "relevant_ids": ["y"]}],
    )
    result = ragexp("run", f"dataset.path={bad}")
    assert result.code == 1
    assert result.stderr.strip() == f"ragexp: error: {bad}:2: field 'id': duplicate id 'a' (first on line 1)"
    assert result.stdout == ""
    assert count_runs(store_uri) == 1  # the earlier run is untouched and no new one exists


def test_metric_needing_missing_field_is_refused_before_any_run(ragexp, store_uri: str) -> None:
    result = ragexp("run", "dataset=scifacts_columns", "provider=replay")
    assert result.code == 1
    assert "metric 'recall_at_k' needs field 'relevant_ids'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert count_runs(store_uri) == 0


def test_bad_override_is_one_line_exit_1(ragexp) -> None:
    result = ragexp("run", "k=-3")
    assert result.code == 1
    assert result.stderr.strip().splitlines() == [
        "ragexp: error: config: k: Input should be greater than or equal to 1 (got -3)"
    ]


def test_terminal_summary_and_runs_listing(ragexp) -> None:
    first = ragexp("run", "dataset=scifacts_zh", "provider=replay")
    assert first.code == 0
    assert "recall_at_k" in first.stdout and "run " in first.stdout and "0 of 25 cases errored" in first.stdout
    second = ragexp("run", "provider=fake", "k=3", "--json").json()
    listing = ragexp("runs", "--json").json()
    assert listing["runs"][0]["run_id"] == second["run_id"]
    assert listing["runs"][1]["dataset"] == "scifacts_zh" and listing["runs"][1]["provider"] == "replay"
    assert listing["runs"][0]["metrics"]["recall_at_k"] == 1.0
    text = ragexp("runs", "--limit", "1")
    assert second["run_id"] in text.stdout and "scifacts_zh" not in text.stdout


def test_validate_command(ragexp, tmp_path: Path) -> None:
    ok = ragexp("validate", "dataset=scifacts_zh", "provider=replay", "--json")
    assert ok.code == 0 and ok.json()["case_count"] == 25
    # validate refuses what run refuses before any work: the sample system cannot answer this set.
    refused = ragexp("validate", "dataset=scifacts_zh")
    assert refused.code == 1 and "provider.system.sample.docs: none of the 20 relevant ids" in refused.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "unanswerable": true, "relevant_ids": ["x"]}\n{oops\n')
    result = ragexp("validate", "--path", str(bad))
    assert result.code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].endswith("bad.jsonl:1: field 'relevant_ids': an unanswerable case must not have relevant ids")
    assert lines[1].startswith(f"ragexp: {bad}:2: invalid JSON")


def test_console_script_and_fast_help(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "ragexp"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "run" in done.stdout and "validate" in done.stdout
    probe = (
        "import sys; sys.argv=['ragexp','--help']\nfrom ragexp.cli.app import main\ntry: main()\n"
        "except SystemExit: pass\nheavy=[m for m in ('mlflow','ragas','hydra','pandas') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
