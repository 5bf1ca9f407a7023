"""Human scores in datasets, the label audit against a corpus, and what a run does with both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.datasets.audit import audit, load_corpus
from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from ragexp.metrics.calibration import calibrate, ppi_mean
from tests.conftest import ROOT, write_jsonl

KB_CASES = ROOT / "ragexp/data/kb_zh/cases.jsonl"
KB_DOCS = ROOT / "ragexp/data/kb_zh/docs.jsonl"
GOOD = {"id": "a", "question": "退款多久到账？", "relevant_ids": ["refund-arrival"], "expected_facts": ["1-3 个工作日"]}


def cases_of(store_uri: str, run_id: str) -> dict[str, dict[str, Any]]:
    text = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl")
    return {row["id"]: row for row in map(json.loads, Path(text).read_text(encoding="utf-8").splitlines())}


def kb_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in KB_CASES.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- the human field ----------------------------------------------------------------------------


def test_human_scores_are_read_canonically_and_enter_the_dataset_hash(tmp_path: Path) -> None:
    plain = load_dataset(write_jsonl(tmp_path / "a.jsonl", [GOOD]))
    labelled = load_dataset(
        write_jsonl(tmp_path / "b.jsonl", [{**GOOD, "human": {"answer_similarity": 0.75, "answer_accuracy": 1}}])
    )
    assert labelled.cases[0].human == {"semantic_similarity": 0.75, "answer_accuracy": 1.0}
    assert labelled.dataset_hash != plain.dataset_hash  # labels are inputs
    assert labelled.cases_hash == plain.cases_hash == plain.dataset_hash  # unlabelled sets keep their hash
    relabelled = load_dataset(write_jsonl(tmp_path / "c.jsonl", [{**GOOD, "human": {"answer_accuracy": 0}}]))
    assert relabelled.dataset_hash != labelled.dataset_hash


@pytest.mark.parametrize(
    ("human", "expected"),
    [
        ({"faithfulness": 1.5}, "d.jsonl:2: field 'human.faithfulness': expected a number in [0, 1], got 1.5"),
        ({"faithfulness": True}, "field 'human.faithfulness': expected a number in [0, 1], got True"),
        ({"faithfulnes": 1}, "field 'human.faithfulnes': not a metric that takes human scores (did you mean"),
        ({"recall_at_k": 1}, "field 'human.recall_at_k': not a metric that takes human scores"),
        ([1], "d.jsonl:2: field 'human': expected an object {metric: score}, got a list"),
        ({"answer_similarity": 1, "semantic_similarity": 1}, "field 'human.semantic_similarity': repeats"),
    ],
)
def test_bad_human_scores_name_file_line_and_field(tmp_path: Path, human: object, expected: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, {**GOOD, "id": "b", "human": human}])
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    assert expected in str(info.value.errors[0])


def test_column_format_human_column(tmp_path: Path) -> None:
    table = {
        "user_input": ["q1", "q2"],
        "response": ["a1", "a2"],
        "reference": ["r1", "r2"],
        "human": [{"faithfulness": 0.5}, None],
    }
    path = tmp_path / "cols.json"
    path.write_text(json.dumps(table, indent=1), encoding="utf-8")
    data = load_dataset(path)
    assert [case.human for case in data.cases] == [{"faithfulness": 0.5}, {}]
    table["human"] = [{"faithfulness": 2}, None]
    path.write_text(json.dumps(table, indent=1), encoding="utf-8")
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    line = path.read_text(encoding="utf-8").split('"human"')[0].count("\n") + 1
    expected = f"cols.json:{line}: field 'human': item 0: faithfulness: expected a number in [0, 1], got 2"
    assert expected in str(info.value)


def test_bundled_kb_zh_carries_human_scores_on_a_subset() -> None:
    kb = load_dataset(KB_CASES)
    labelled = [case for case in kb.cases if case.human]
    assert 10 <= len(labelled) < len(kb.cases)
    for name in ("faithfulness", "answer_relevancy", "context_recall", "answer_accuracy"):
        assert sum(name in case.human for case in kb.cases) >= 10, name


# --- the label audit ----------------------------------------------------------------------------


def test_audit_flags_the_refund_arrival_mislabel_and_every_kind(tmp_path: Path) -> None:
    rows = kb_rows()
    arrival = next(i for i, row in enumerate(rows) if row["question"] == "退款多久到账？")
    rows[arrival]["expected_facts"] = ["七天"]  # the RAG evaluation article's mislabel
    rows.append(
        {"id": "ghost", "question": "积分能转让吗？", "relevant_ids": ["points-transfer"], "expected_facts": ["不"]}
    )
    rows.append({**rows[0], "id": "dup-question", "expected_facts": ["十天"]})
    rows.append({"id": "blank", "question": "空白文档？", "relevant_ids": ["blank-doc"], "expected_facts": ["x"]})
    data = load_dataset(write_jsonl(tmp_path / "cases.jsonl", rows))
    corpus_path = tmp_path / "docs.jsonl"
    corpus_path.write_text(
        KB_DOCS.read_text(encoding="utf-8") + json.dumps({"id": "blank-doc", "text": "  "}) + "\n", encoding="utf-8"
    )
    findings = audit(data, load_corpus(corpus_path))
    by_kind = {(f.case_id, f.kind): f for f in findings}
    mislabel = by_kind[("refund-arrival-time", "fact_not_in_relevant")]
    assert str(mislabel).startswith(f"{tmp_path / 'cases.jsonl'}:{arrival + 1}: case 'refund-arrival-time': ")
    assert "expected fact '七天' appears in none of its relevant chunks (refund-arrival)" in mislabel.message
    assert "relevant id 'points-transfer' is not in the corpus" in by_kind[("ghost", "missing_id")].message
    conflict = by_kind[("dup-question", "conflicting_labels")]
    assert conflict.line == len(rows) - 1 and "same question as case 'refund-deadline' (line 1)" in conflict.message
    assert "expected_facts" in conflict.message
    assert ("dup-question", "fact_not_in_relevant") in by_kind  # "十天" is not in refund-policy either
    assert ("blank", "empty_relevant") in by_kind
    assert len(findings) == 5


def test_bundled_sets_audit_clean() -> None:
    assert audit(load_dataset(KB_CASES), load_corpus(KB_DOCS)) == []
    sci = ROOT / "ragexp/data/scifacts_zh"
    assert audit(load_dataset(sci / "cases.jsonl"), load_corpus(sci / "corpus.jsonl")) == []


def test_validate_corpus_warns_and_strict_fails(ragexp: Any, tmp_path: Path) -> None:
    rows = kb_rows()
    rows[1]["expected_facts"] = ["七天"]
    path = write_jsonl(tmp_path / "cases.jsonl", rows)
    warned = ragexp("validate", "--path", str(path), "--corpus", str(KB_DOCS))
    assert warned.code == 0, warned.stderr
    assert "label audit against" in warned.stdout and "1 finding(s)" in warned.stdout
    assert f"warning: {path}:2: case 'refund-arrival-time': expected fact '七天'" in warned.stdout
    strict = ragexp("validate", "--path", str(path), "--corpus", str(KB_DOCS), "--strict", "--json")
    assert strict.code == 1
    payload = strict.json()
    assert [f["kind"] for f in payload["findings"]] == ["fact_not_in_relevant"] and payload["findings"][0]["line"] == 2
    clean = ragexp("validate", "--strict", "--json")  # the bundled kb_zh with its configured corpus
    assert clean.code == 0 and clean.json()["findings"] == []
    assert clean.json()["human_labels"]["answer_accuracy"] >= 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n', encoding="utf-8")
    broken = ragexp("validate", "--path", str(path), "--corpus", str(bad))
    assert broken.code == 1
    assert broken.stderr.strip() == f"ragexp: {bad}:2: field 'id': duplicate id 'x' (first on line 1)"


# --- a run with human scores and a corpus --------------------------------------------------------


def replay_labelled(n: int, correct: list[bool], human: dict[int, float]) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "id": f"c{i:03d}",
            "question": f"question {i}?",
            "relevant_ids": [f"d{i}"],
            "expected_facts": [f"fact {i}"],
            "response": f"fact {i}." if correct[i] else "something else",
            "retrieved_ids": [f"d{i}"],
            "citations": [1],
        }
        if i in human:
            row["human"] = {"answer_accuracy": human[i]}
        rows.append(row)
    return rows


@pytest.mark.system
def test_run_reports_calibration_ppi_and_audit(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    n = 60
    correct = list(rng.random(n) < 0.8)
    # People disagree with the automatic check on some labelled cases (paraphrased answers).
    human = {i: float(correct[i] if i % 5 else not correct[i]) for i in range(0, n, 2)}
    data = write_jsonl(tmp_path / "cases.jsonl", replay_labelled(n, correct, human))
    corpus = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": f"fact {i} is here"} for i in range(n - 1)])
    result = ragexp("run", f"dataset.path={data}", f"dataset.corpus={corpus}", "provider=replay", "k=3", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    auto = np.array(correct, dtype=float)
    labels = np.full(n, np.nan)
    for i, value in human.items():
        labels[i] = value
    expected = calibrate(auto, labels, threshold=0.5)
    assert expected is not None
    got = payload["calibration"]["answer_accuracy"]
    assert set(got) == {"n", "mae", "bias", "spearman", "accuracy", "kappa", "kappa_ci_low", "kappa_ci_high"}
    assert got["n"] == 30 and got["accuracy"] == pytest.approx(float(np.mean((auto == labels)[::2])))
    assert got["kappa"] == pytest.approx(expected.kappa)
    estimate = ppi_mean(auto, labels)
    assert estimate is not None
    assert payload["ppi"]["answer_accuracy"] == pytest.approx(estimate.to_json())
    run = MlflowClient(store_uri).get_run(payload["run_id"])
    assert run.data.metrics["calibration.answer_accuracy.kappa"] == pytest.approx(expected.kappa)
    assert run.data.metrics["ppi.answer_accuracy.ci_low"] == pytest.approx(estimate.ci_low)
    assert run.data.tags["ragexp.audit.findings"] == "1"  # d59 is missing from the corpus
    text = ragexp("run", f"dataset.path={data}", f"dataset.corpus={corpus}", "provider=replay", "k=3")
    assert "automatic score vs human scores" in text.stdout and "prediction-powered means" in text.stdout
    assert "relevant id 'd59' is not in the corpus" in text.stdout
    out = tmp_path / "report"
    report = ragexp("report", payload["run_id"], "--out", str(out), "--language", "en")
    assert report.code == 0, report.stderr
    markdown = (out / "report.md").read_text(encoding="utf-8")
    # answer_accuracy is computed by code: the section says automatic scores, not a judge.
    assert "Automatic scores against human scores" in markdown and "Prediction-powered means" in markdown
    assert "How far the judge can be trusted" not in markdown
    assert "## Label audit" in markdown and "d59" in markdown
    assert (out / "plots/human_answer_accuracy.svg").exists()


def test_a_corpus_of_another_dataset_is_not_audited_against(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", replay_labelled(5, [True] * 5, {}))
    result = ragexp("run", f"dataset.path={data}", "provider=replay", "k=3", "--json")  # kb_zh's corpus
    assert result.code == 0 and result.stderr == ""
    assert result.json()["calibration"] == {} and result.json()["ppi"] == {}
    assert "ragexp.audit.findings" not in MlflowClient(store_uri).get_run(result.json()["run_id"]).data.tags
    checked = ragexp("validate", f"dataset.path={data}", "provider=replay")
    assert checked.code == 0 and "label audit skipped" in checked.stderr


@pytest.mark.system
def test_diff_and_gate_use_paired_ppi_on_shared_labelled_cases(ragexp: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    n = 80
    base_ok = list(rng.random(n) < 0.8)
    cand_ok = [ok if rng.random() < 0.8 else not ok for ok in base_ok]
    labelled = range(0, n, 3)
    # Each run's own outputs labelled by people: here they agree with the check except on a few.
    base_h = {i: float(base_ok[i]) for i in labelled}
    cand_h = {i: float(cand_ok[i] if i % 4 else not cand_ok[i]) for i in labelled}
    a = write_jsonl(tmp_path / "a.jsonl", replay_labelled(n, base_ok, base_h))
    b = write_jsonl(tmp_path / "b.jsonl", replay_labelled(n, cand_ok, cand_h))
    runs = []
    for path in (a, b):
        done = ragexp("run", f"dataset.path={path}", "dataset.corpus=null", "provider=replay", "k=3", "--json")
        assert done.code == 0, done.stderr
        runs.append(done.json())
    assert runs[0]["dataset_hash"] != runs[1]["dataset_hash"]  # different human scores...
    diff = ragexp("diff", runs[0]["run_id"], runs[1]["run_id"], "--json")
    assert diff.code == 0, diff.stderr  # ...on the same cases: comparable
    accuracy = next(m for m in diff.json()["metrics"] if m["name"] == "answer_accuracy")
    judged = np.array(cand_ok, dtype=float) - np.array(base_ok, dtype=float)
    human = np.full(n, np.nan)
    for i in labelled:
        human[i] = cand_h[i] - base_h[i]
    expected = ppi_mean(judged, human)
    assert expected is not None and accuracy["ppi"] == pytest.approx(expected.to_json())
    gate = ragexp(
        "gate",
        "--baseline",
        runs[0]["run_id"],
        "--candidate",
        runs[1]["run_id"],
        "gates=release_stat",
        "gates.rules.answer_accuracy.max_drop=0.5",
        "--json",
    )
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    rule = rules[("answer_accuracy", "max_drop")]
    assert rule["outcome"] == "passed" and rule["method"] == "prediction-powered"
    assert "prediction-powered interval" in rule["message"]
    assert rules[("recall_at_k", "max_drop")]["method"] == "sign-flip"


@pytest.mark.system
def test_kb_zh_with_the_judge_preset_shows_calibration_and_the_audit(
    ragexp: Any, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servers.procs import SAMPLE, serve

    monkeypatch.delenv("RAGEXP_JUDGE_API_KEY", raising=False)
    judge = ROOT / "tests/servers/judge.py"
    with serve(SAMPLE) as system, serve(judge) as judge_url:
        args = [
            "provider=http_judge",
            "metrics=core",
            f"provider.system.url={system}",
            f"provider.judge.base_url={judge_url}",
            f"provider.judge.embeddings.url={judge_url}",
            "provider.judge.api_key_env=null",
        ]
        result = ragexp("run", *args, "--json")
        assert result.code == 0, result.stderr
        payload = result.json()
        again = ragexp("run", *args, "--json")  # a second run (judge answers cached) to gate against
        assert again.code == 0, again.stderr
        gate = ragexp(
            "gate",
            "--baseline",
            payload["run_id"],
            "--candidate",
            again.json()["run_id"],
            "gates=release",
            "+gates.rules.faithfulness.min_kappa=0.4",
            "+gates.rules.context_recall.max_abs_bias=0.2",
            "+gates.rules.context_precision.min_kappa=0.4",
            "--json",
        )
    calibration = payload["calibration"]
    assert {"faithfulness", "answer_relevancy", "context_recall"} <= set(calibration)
    rows = cases_of(store_uri, payload["run_id"])
    human = {case.id: case.human for case in load_dataset(KB_CASES).cases}
    for name, figures in calibration.items():
        scored = [i for i, row in rows.items() if name in human[i] and row["metrics"].get(name) is not None]
        assert figures["n"] == len(scored) >= 10, name
    assert set(payload["ppi"]) == set(calibration) and payload["ppi"]["faithfulness"]["n_total"] >= 25
    run = MlflowClient(store_uri).get_run(payload["run_id"])
    assert run.data.tags["ragexp.audit.findings"] == "0"
    assert run.data.metrics["calibration.context_recall.n"] == calibration["context_recall"]["n"]
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    precision = rules[("context_precision", "min_kappa")]  # kb_zh has no human context_precision
    assert precision["outcome"] == "undecided" and "judge not calibrated" in precision["message"]
    assert rules[("context_recall", "max_abs_bias")]["outcome"] in {"passed", "failed"}
    assert gate.code == 2  # the uncalibrated rule does not pass silently
